"""Llama-like decoders: llama, mistral, mixtral, qwen2, qwen3, phi3, olmo2, gemma2, gemma3.

Each function turns a config into a model table; the module names follow the
classes of Hugging Face transformers (modeling_<model_type>.py).
"""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.hf.common import attention_biases, decoder_table, no_sliding_window, whole_window
from llmpar.hf.config import HfConfig

DECODER_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                "intermediate_size", "vocab_size")
"""Keys every decoder's config.json must give."""


def llama(config: HfConfig) -> dict[str, Any]:
    """LlamaForCausalLM (Llama 2, Llama 3): attention_bias and mlp_bias."""
    return {**decoder_table(config, tie_default=False), **attention_biases(config, "mlp_bias")}


def mistral(config: HfConfig) -> dict[str, Any]:
    """MistralForCausalLM: no biases; a sliding window on every layer."""
    return {**decoder_table(config, tie_default=False), **whole_window(config)}


def mixtral(config: HfConfig) -> dict[str, Any]:
    """MixtralForCausalLM: every MLP is num_local_experts experts of intermediate_size,
    a router without bias."""
    moe = {"num_experts": config.integer("num_local_experts"),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("intermediate_size")}
    return {**mistral(config), "moe": moe}


def phi3(config: HfConfig) -> dict[str, Any]:
    """Phi3ForCausalLM: fused qkv_proj and gate_up_proj (as many weights as separate
    projections), no biases, a sliding window on every layer."""
    return {**decoder_table(config, tie_default=False), **whole_window(config)}


def qwen2(config: HfConfig) -> dict[str, Any]:
    """Qwen2ForCausalLM: biases on Q, K and V only."""
    return {**decoder_table(config, tie_default=False), "qkv_bias": True,
            **no_sliding_window(config)}


def qwen3(config: HfConfig) -> dict[str, Any]:
    """Qwen3ForCausalLM: RMSNorm over each query and key head (head_dim weights)."""
    return {**decoder_table(config, tie_default=False), **attention_biases(config),
            "qk_norm": True, **no_sliding_window(config)}


def _qwen_moe(config: HfConfig) -> dict[str, Any]:
    """Qwen MoE blocks: layer i has experts when (i + 1) % decoder_sparse_step == 0."""
    if config.get("mlp_only_layers"):
        raise config.error("mlp_only_layers", "only [] is supported")
    return {"num_experts": routed_experts(config),
            "experts_per_token": config.integer("num_experts_per_tok"),
            "expert_ffn_hidden_size": config.integer("moe_intermediate_size"),
            "layer_frequency": config.integer("decoder_sparse_step", 1)}


def routed_experts(config: HfConfig) -> int:
    """`num_experts`, or `num_local_experts` as transformers 5 writes Qwen MoE configs."""
    found = config.integer("num_experts")
    found = config.integer("num_local_experts") if found is None else found
    if found is None:
        raise config.error("num_experts", "required (or num_local_experts, as transformers 5 "
                                          "writes it): the routed experts of a layer")
    return found


def qwen3_moe(config: HfConfig) -> dict[str, Any]:
    """Qwen3MoeForCausalLM: Qwen3 attention, routed experts with a bias-free router."""
    return {**qwen3(config), "moe": _qwen_moe(config)}


def qwen2_moe(config: HfConfig) -> dict[str, Any]:
    """Qwen2MoeForCausalLM: Qwen2 attention; a shared expert of
    shared_expert_intermediate_size behind a sigmoid gate (hidden_size weights)."""
    moe = _qwen_moe(config)
    shared = config.integer("shared_expert_intermediate_size", 0)
    if shared:
        moe.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=True)
    return {**qwen2(config), "qkv_bias": config.flag("qkv_bias", True), "moe": moe}


def olmo2(config: HfConfig) -> dict[str, Any]:
    """Olmo2ForCausalLM: norms after attention and MLP, RMSNorm over the whole query and
    key projections."""
    return {**decoder_table(config, tie_default=False), **attention_biases(config),
            "norm_placement": "post", "qk_norm": True, "qk_norm_scope": "projection"}


def _gemma(config: HfConfig, pattern: int | None) -> dict[str, Any]:
    """Gemma 2/3 blocks: four norms, embeddings scaled by sqrt(hidden_size), GeGLU."""
    has_own_key = config.get("hidden_activation") is not None
    activation = "hidden_activation" if has_own_key else "hidden_act"
    table = decoder_table(config, tie_default=True, activation_key=activation,
                          activation_default="gelu_pytorch_tanh")
    table.update(attention_biases(config), norm_placement="sandwich", scale_embeddings=True,
                 sliding_window=config.integer("sliding_window"),
                 sliding_window_pattern=pattern,
                 attention_logit_softcapping=config.get("attn_logit_softcapping"),
                 final_logit_softcapping=config.get("final_logit_softcapping"))
    return table


def gemma2(config: HfConfig) -> dict[str, Any]:
    """Gemma2ForCausalLM: windowed and global layers alternate, logits soft-capped."""
    return _gemma(config, pattern=2)


GEMMA3_DEFAULTS = {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "head_dim": 256, "max_position_embeddings": 131_072,
                   "sliding_window": 4096, "sliding_window_pattern": 6}
"""Defaults of transformers' Gemma3TextConfig (v4.50), which published Gemma 3 configs
leave out of their text_config."""


def _gemma3_pattern(config: HfConfig) -> int | None:
    """The period of global layers, from layer_types or sliding_window_pattern."""
    types = config.get("layer_types")
    if types is None:
        return config.integer("sliding_window_pattern")
    pattern = types.index("full_attention") + 1 if "full_attention" in types else None
    expected = ["full_attention" if pattern and (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(len(types))]
    if list(types) != expected:
        raise config.error("layer_types", "expected a global layer every n-th layer")
    return pattern


def gemma3_text(config: HfConfig) -> dict[str, Any]:
    """Gemma3ForCausalLM: Gemma 2's block with per-head q/k RMSNorm, five windowed layers
    to one global one by default; keys left out take Gemma3TextConfig's defaults."""
    config = attrs.evolve(config, values={**GEMMA3_DEFAULTS, **config.values})
    return {**_gemma(config, _gemma3_pattern(config)), "qk_norm": True}
