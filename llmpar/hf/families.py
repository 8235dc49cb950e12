"""The supported Hugging Face model types, each with its required keys and its reader."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from llmpar.hf import classic, decoders, deepseek, hybrid, single
from llmpar.hf.config import HfConfig


@attrs.frozen(kw_only=True)
class Family:
    """How to read one model_type: the keys it needs and the transformers class it is."""

    hf_class: str
    """The transformers class whose parameters the table counts."""
    required: tuple[str, ...]
    """Keys the config must give; "a|b" takes either (a key transformers renamed)."""
    read: Callable[[HfConfig], dict[str, Any]]
    note: str = ""
    """What the count leaves out or assumes, for the model's source."""
    mtp_table_copies: bool = False
    """The checkpoint stores a copy of the embedding and output head with each MTP module
    (`Model.mtp_table_copies`: DeepSeek-V3's model.layers.61.embed_tokens and
    shared_head.head, README_WEIGHTS.md of deepseek-ai/DeepSeek-V3)."""


def _decoder(hf_class: str, read: Callable[[HfConfig], dict[str, Any]],
             *extra: str, note: str = "") -> Family:
    return Family(hf_class=hf_class, required=decoders.DECODER_KEYS + extra, read=read,
                  note=note)


FAMILIES: Mapping[str, Family] = MappingProxyType({
    "llama": _decoder("LlamaForCausalLM", decoders.llama),
    "mistral": _decoder("MistralForCausalLM", decoders.mistral),
    "mixtral": _decoder("MixtralForCausalLM", decoders.mixtral, "num_local_experts",
                        "num_experts_per_tok"),
    "qwen2": _decoder("Qwen2ForCausalLM", decoders.qwen2),
    "qwen3": _decoder("Qwen3ForCausalLM", decoders.qwen3),
    "qwen2_moe": _decoder("Qwen2MoeForCausalLM", decoders.qwen2_moe,
                          "num_experts|num_local_experts", "num_experts_per_tok",
                          "moe_intermediate_size"),
    "qwen3_moe": _decoder("Qwen3MoeForCausalLM", decoders.qwen3_moe,
                          "num_experts|num_local_experts", "num_experts_per_tok",
                          "moe_intermediate_size"),
    "deepseek_v2": Family(hf_class="DeepseekV2ForCausalLM", required=deepseek.DEEPSEEK_KEYS,
                          read=deepseek.deepseek),
    "deepseek_v3": Family(hf_class="DeepseekV3ForCausalLM", required=deepseek.DEEPSEEK_KEYS,
                          read=deepseek.deepseek, note=deepseek.V3_NOTE,
                          mtp_table_copies=True),
    "deepseek_v32": Family(hf_class="DeepseekV32ForCausalLM", required=deepseek.DEEPSEEK_KEYS,
                           read=deepseek.deepseek_v32, note=deepseek.V32_NOTE,
                           mtp_table_copies=True),
    # Kimi K2 ships DeepSeek-V3's modeling code under its own model_type (the config's
    # architectures: DeepseekV3ForCausalLM; moonshotai/Kimi-K2-Instruct's config.json).
    "kimi_k2": Family(hf_class="DeepseekV3ForCausalLM", required=deepseek.DEEPSEEK_KEYS,
                      read=deepseek.deepseek, note=deepseek.V3_NOTE,
                      mtp_table_copies=True),
    "gemma2": _decoder("Gemma2ForCausalLM", decoders.gemma2),
    "gemma3_text": Family(hf_class="Gemma3ForCausalLM",
                          required=("num_hidden_layers", "hidden_size", "intermediate_size"),
                          read=decoders.gemma3_text),
    "phi3": _decoder("Phi3ForCausalLM", decoders.phi3),
    "olmo2": _decoder("Olmo2ForCausalLM", decoders.olmo2),
    "olmo3": _decoder("Olmo3ForCausalLM", decoders.olmo3),
    "smollm3": _decoder("SmolLM3ForCausalLM", decoders.smollm3),
    "ministral3": _decoder("Ministral3ForCausalLM", decoders.ministral3),
    "llama4_text": Family(hf_class="Llama4ForCausalLM",
                          required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                    "intermediate_size", "vocab_size",
                                    "num_local_experts|num_experts", "num_experts_per_tok"),
                          read=decoders.llama4_text, note=decoders.LLAMA4_NOTE),
    "gpt_oss": Family(hf_class="GptOssForCausalLM",
                      required=("num_hidden_layers", "hidden_size", "num_attention_heads",
                                "intermediate_size", "vocab_size",
                                "num_local_experts|num_experts",
                                "num_experts_per_tok|experts_per_token"),
                      read=decoders.gpt_oss, note=decoders.GPT_OSS_NOTE),
    "glm4_moe": _decoder("Glm4MoeForCausalLM", decoders.glm4_moe, "n_routed_experts",
                         "num_experts_per_tok", "moe_intermediate_size",
                         note=decoders.MTP_NOTE),
    "minimax_m2": _decoder("MiniMaxM2ForCausalLM", decoders.minimax_m2,
                           "num_local_experts|num_experts", "num_experts_per_tok",
                           note=decoders.MINIMAX_NOTE),
    "ernie4_5": _decoder("Ernie4_5ForCausalLM", decoders.ernie4_5),
    "ernie4_5_moe": _decoder("Ernie4_5_MoeForCausalLM", decoders.ernie4_5_moe,
                             "moe_num_experts", "moe_k", "moe_intermediate_size"),
    "qwen3_next": _decoder("Qwen3NextForCausalLM", hybrid.qwen3_next,
                           "num_experts|num_local_experts", "num_experts_per_tok",
                           "moe_intermediate_size", note=hybrid.QWEN3_NEXT_NOTE),
    "qwen3_5_text": _decoder("Qwen3_5ForCausalLM", hybrid.qwen3_5_text,
                             note=hybrid.QWEN3_5_NOTE),
    "qwen3_5_moe_text": Family(hf_class="Qwen3_5MoeForCausalLM",
                               required=("num_hidden_layers", "hidden_size",
                                         "num_attention_heads", "vocab_size",
                                         "num_experts|num_local_experts", "num_experts_per_tok",
                                         "moe_intermediate_size"),
                               read=hybrid.qwen3_5_moe_text, note=hybrid.QWEN3_5_NOTE),
    "falcon_h1": _decoder("FalconH1ForCausalLM", hybrid.falcon_h1),
    "granitemoehybrid": _decoder("GraniteMoeHybridForCausalLM", hybrid.granitemoehybrid),
    "nemotron_h": Family(hf_class="NemotronHForCausalLM",
                         required=("hidden_size", "num_attention_heads"),
                         read=single.nemotron_h),
    "mamba2": Family(hf_class="Mamba2ForCausalLM",
                     required=("num_hidden_layers", "hidden_size", "num_heads", "head_dim",
                               "vocab_size"),
                     read=single.mamba2),
    "gpt2": Family(hf_class="GPT2LMHeadModel", required=classic.GPT2_KEYS, read=classic.gpt2),
    "bert": Family(hf_class="BertForMaskedLM", required=classic.BERT_KEYS, read=classic.bert,
                   note=classic.BERT_NOTE),
})
"""Readers by config.json's model_type ("gemma3", a multimodal config, is read through its
text_config as "gemma3_text")."""

MULTIMODAL = MappingProxyType({"gemma3": "gemma3_text", "llama4": "llama4_text",
                               "mistral3": "mistral", "kimi_k25": "kimi_k2",
                               "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"})
"""model_types whose language model is the `text_config` of the given model_type (unless
the text_config names one of TEXT_MODELS)."""

TEXT_MODELS = MappingProxyType({"mistral3": ("mistral", "ministral3")})
"""The model_types a multimodal config's text_config may name instead of the default:
Mistral3ForConditionalGeneration holds a Mistral (Mistral Small 3.1) or a Ministral 3."""

SUPPORTED_MODEL_TYPES = tuple(sorted((*FAMILIES, *MULTIMODAL)))

MAMBA_1 = ("Mamba (version 1) state-space layers (a selective scan of its own, with a state "
           "per channel; llmpar models Mamba-2's)")
ZAMBA2 = ("Mamba-2 layers beside shared attention blocks reused at several depths "
          "(hybrid_layer_ids, LoRA per use): a shared block is not modelled")
VISION = ("a vision tower beside the language model: multimodal towers are out of scope, "
          "and this model_type's language model is not read on its own")
UNSUPPORTED_MECHANISMS: Mapping[str, str] = MappingProxyType({
    "mamba": MAMBA_1,
    "falcon_mamba": MAMBA_1,
    "jamba": MAMBA_1,
    "zamba2": ZAMBA2,
    "qwen2_5_vl": VISION,
    "qwen3_vl": VISION,
    "qwen3_vl_moe": VISION,
    "llava": VISION,
    "mllama": VISION,
})
"""model_types that are refused with the mechanism llmpar does not model."""
