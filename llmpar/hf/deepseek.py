"""DeepSeek-V2 and -V3: multi-head latent attention and DeepSeekMoE.

As Hugging Face transformers builds them (modeling_deepseek_v2.py,
modeling_deepseek_v3.py): the first first_k_dense_replace layers keep a dense
MLP of intermediate_size, the others have n_routed_experts experts of
moe_intermediate_size and n_shared_experts shared ones; V3's router keeps its
e_score_correction_bias as a buffer, not a parameter; the multi-token-prediction
layers (num_nextn_predict_layers), which transformers does not build, are the model's
mtp_layers (hf.common.mtp_table), outside the main model's count.
"""

from __future__ import annotations

from typing import Any

from llmpar.hf.common import attention_biases, decoder_table
from llmpar.hf.config import HfConfig

DEEPSEEK_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                 "intermediate_size", "vocab_size", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                 "moe_intermediate_size")

V3_NOTE = "; with e_score_correction_bias a buffer, not a parameter"


def _mla(config: HfConfig) -> dict[str, Any]:
    return {"q_lora_rank": config.integer("q_lora_rank"),
            "kv_lora_rank": config.integer("kv_lora_rank"),
            "qk_nope_head_dim": config.integer("qk_nope_head_dim"),
            "qk_rope_head_dim": config.integer("qk_rope_head_dim"),
            "v_head_dim": config.integer("v_head_dim")}


def _moe(config: HfConfig) -> dict[str, Any]:
    frequency = config.integer("moe_layer_freq", 1)
    if frequency != 1:
        raise config.error("moe_layer_freq", f"only 1 is supported, got {frequency}")
    return {"num_experts": config.integer("n_routed_experts"),
            "experts_per_token": config.integer("num_experts_per_tok"),
            "expert_ffn_hidden_size": config.integer("moe_intermediate_size"),
            "num_shared_experts": config.integer("n_shared_experts", 0),
            "dense_layers": config.integer("first_k_dense_replace", 0)}


def deepseek(config: HfConfig) -> dict[str, Any]:
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM; attention_bias puts biases on the
    latent down-projections and the output projection."""
    table = decoder_table(config, tie_default=False)
    del table["head_dim"]  # MLA's head widths are in [mla]; config.json's head_dim is rope's
    return {**table, **attention_biases(config), "mla": _mla(config), "moe": _moe(config)}


V32_NOTE = V3_NOTE + ("; the lightning indexer's weights in bf16 as transformers builds them "
                      "(the reference kernels score in fp8)")


def deepseek_v32(config: HfConfig) -> dict[str, Any]:
    """DeepseekV32ForCausalLM: DeepSeek-V3's model with DeepSeek sparse attention on every
    layer (layer_types all indexed_attention): a lightning indexer of index_n_heads heads of
    index_head_dim that keeps index_topk keys per query."""
    kinds = config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or not all(
            kind in ("indexed_attention", "deepseek_sparse_attention") for kind in kinds)):
        raise config.error("layer_types", "expected every layer indexed_attention (DeepSeek "
                                          "sparse attention on every layer)")
    sparse = {"index_heads": config.integer("index_n_heads", 64),
              "index_head_dim": config.integer("index_head_dim", 128),
              "top_k": config.integer("index_topk", 2048)}
    return {**deepseek(config), "sparse_attention": sparse}
