"""Llama-like decoders: llama, mistral, mixtral, qwen2, qwen3, phi3, olmo2, olmo3, gemma2,
gemma3, llama4, smollm3, gpt_oss, glm4_moe, ernie4_5, ernie4_5_moe and minimax_m2.

Each function turns a config into a model table; the module names follow the
classes of Hugging Face transformers (modeling_<model_type>.py).
"""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.hf.common import attention_biases, decoder_table, no_sliding_window, whole_window
from llmpar.hf.config import HfConfig

GPT_OSS_NOTE = ("; the experts as shipped are MXFP4 (quantization_config): llmpar has no FP4 "
                "weight format, so a plan keeps them at the weights' precision its spec gives")
LLAMA4_NOTE = ("; its chunked attention (attention_chunk_size) is held as a sliding window of "
               "that size on the chunked layers: a cache of at most that many tokens per "
               "layer, an upper bound on what a token of a chunk attends to; its "
               "weightless L2 q/k norms and NoPE layers add no parameter")
MINIMAX_NOTE = ("; without the multi-token-prediction modules, which transformers does not "
                "build, and with e_score_correction_bias a buffer")
MTP_NOTE = "; with e_score_correction_bias a buffer"

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


def routed_experts(config: HfConfig, key: str = "num_experts",
                   other: str = "num_local_experts") -> int:
    """The routed experts of a layer under `key`, or under `other`, the spelling transformers
    also writes (Qwen MoE: num_local_experts in transformers 5; gpt-oss, Llama 4 and
    MiniMax-M2: num_experts through their attribute_map)."""
    found = config.integer(key)
    found = config.integer(other) if found is None else found
    if found is None:
        raise config.error(key, f"required (or {other}): the routed experts of a layer")
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


def window_pattern(config: HfConfig) -> int | None:
    """The period of global layers, from layer_types or sliding_window_pattern (None:
    every layer windowed). layer_types must put a full_attention layer at every n-th
    position and sliding_attention elsewhere (Gemma 2/3, gpt-oss, OLMo 3)."""
    types = config.get("layer_types")
    if types is None:
        return config.integer("sliding_window_pattern")
    if not isinstance(types, list) or not types:
        raise config.error("layer_types", f"expected a list of layer kinds, got {types!r}")
    pattern = types.index("full_attention") + 1 if "full_attention" in types else None
    expected = ["full_attention" if pattern and (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(len(types))]
    if list(types) != expected:
        raise config.error("layer_types", "expected sliding_attention layers with a "
                                          "full_attention layer every n-th layer")
    if pattern == 1:  # no windowed layer
        return None
    return pattern


def _windows(config: HfConfig) -> dict[str, Any]:
    """sliding_window and its pattern from layer_types; none when every layer is full."""
    types = config.get("layer_types")
    if isinstance(types, list) and types and all(kind == "full_attention" for kind in types):
        return {}
    return {"sliding_window": config.integer("sliding_window"),
            "sliding_window_pattern": window_pattern(config)}


def gemma3_text(config: HfConfig) -> dict[str, Any]:
    """Gemma3ForCausalLM: Gemma 2's block with per-head q/k RMSNorm, five windowed layers
    to one global one by default; keys left out take Gemma3TextConfig's defaults."""
    config = attrs.evolve(config, values={**GEMMA3_DEFAULTS, **config.values})
    table = {**_gemma(config, window_pattern(config)), "qk_norm": True}
    if not _windows(config):  # layer_types all full_attention: no layer is windowed
        del table["sliding_window"], table["sliding_window_pattern"]
    return table


OLMO3_DEFAULTS = {"sliding_window": 4096, "sliding_window_pattern": 4}
"""Olmo3Config's defaults (transformers 5.24): a window of 4096 tokens, and layer_types
with a full_attention layer every fourth layer when the config gives none."""


def olmo3(config: HfConfig) -> dict[str, Any]:
    """Olmo3ForCausalLM: OLMo 2's block; windowed layers with a full one every
    n-th layer, as layer_types says (three in four by default)."""
    config = attrs.evolve(config, values={**OLMO3_DEFAULTS, **config.values})
    return {**olmo2(config), **_windows(config)}


def ministral3(config: HfConfig) -> dict[str, Any]:
    """Ministral3ForCausalLM (the language model of Ministral 3): Mistral's block, no
    biases, a sliding window on every layer when one is set; its attention scaling
    (rope_parameters' llama_4_scaling_beta) adds no parameter."""
    return mistral(config)


def smollm3(config: HfConfig) -> dict[str, Any]:
    """SmolLM3ForCausalLM: Llama's block; its NoPE layers (no_rope_layers: RoPE skipped on
    every no_rope_layer_interval-th layer) change no parameter, FLOP or cache count."""
    if config.flag("use_sliding_window"):
        raise config.error("use_sliding_window", "only false is supported")
    return {**decoder_table(config, tie_default=True), **attention_biases(config, "mlp_bias")}


def gpt_oss(config: HfConfig) -> dict[str, Any]:
    """GptOssForCausalLM: attention with biases and a learned sink logit per head,
    windowed and full layers alternating (layer_types), and every MLP num_local_experts
    experts of intermediate_size with biases (gate_up_proj_bias, down_proj_bias) behind
    a router with a bias, top num_experts_per_tok; the clamped SwiGLU (swiglu_limit)
    adds no parameter."""
    bias = config.flag("attention_bias", True)
    experts = config.integer("num_experts_per_tok")
    moe = {"num_experts": routed_experts(config, "num_local_experts", "num_experts"),
           "experts_per_token": config.integer("experts_per_token") if experts is None
           else experts,
           "expert_ffn_hidden_size": config.integer("intermediate_size"),
           "router_bias": True}
    return {**decoder_table(config, tie_default=False), "qkv_bias": bias,
            "attention_output_bias": bias, "mlp_bias": True, "attention_sinks": True,
            **_windows(config), "moe": moe}


def glm4_moe(config: HfConfig) -> dict[str, Any]:
    """Glm4MoeForCausalLM: biases on Q, K and V only (attention_bias; o_proj has none),
    per-head q/k RMSNorm when use_qk_norm, RoPE on partial_rotary_factor of each head (no
    parameters); the first first_k_dense_replace layers dense, the others
    n_routed_experts experts and n_shared_experts shared ones of moe_intermediate_size
    (one MLP n_shared_experts times as wide: the same weights), a router whose
    e_score_correction_bias is a buffer; the MTP layers (num_nextn_predict_layers), which
    transformers does not build, are mtp_layers (hf.common.mtp_table)."""
    moe = {"num_experts": config.integer("n_routed_experts"),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("moe_intermediate_size"),
           "num_shared_experts": config.integer("n_shared_experts", 1),
           "dense_layers": config.integer("first_k_dense_replace", 1)}
    return {**decoder_table(config, tie_default=False), "qkv_bias": config.flag("attention_bias"),
            "qk_norm": config.flag("use_qk_norm"), "moe": moe}


def ernie4_5(config: HfConfig) -> dict[str, Any]:
    """Ernie4_5ForCausalLM: Llama's block; use_bias puts biases on every projection of
    attention and MLP."""
    bias = config.flag("use_bias")
    return {**decoder_table(config, tie_default=True), "qkv_bias": bias,
            "attention_output_bias": bias, "mlp_bias": bias}


def ernie4_5_moe(config: HfConfig) -> dict[str, Any]:
    """Ernie4_5_MoeForCausalLM: layer i has experts when i >= moe_layer_start_index,
    i <= moe_layer_end_index and (i + 1) is a multiple of moe_layer_interval;
    moe_num_experts experts of moe_intermediate_size, top moe_k, moe_num_shared_experts
    shared ones (one MLP as wide as all of them: the same weights); the router's
    e_score_correction_bias (Ernie4_5_MoeStatics) is a parameter of moe_num_experts."""
    layers = config.integer("num_hidden_layers")
    assert layers is not None
    end = config.integer("moe_layer_end_index", layers - 1)
    if end not in (-1, layers - 1):
        raise config.error("moe_layer_end_index", f"only the last layer ({layers - 1}) or -1 "
                                                  f"is supported, got {end}")
    moe = {"num_experts": config.integer("moe_num_experts"),
           "experts_per_token": config.integer("moe_k"),
           "expert_ffn_hidden_size": config.integer("moe_intermediate_size"),
           "num_shared_experts": config.integer("moe_num_shared_experts", 0),
           "dense_layers": config.integer("moe_layer_start_index", 0),
           "layer_frequency": config.integer("moe_layer_interval", 1),
           "router_bias": True}
    return {**ernie4_5(config), "moe": moe}


def _periodic(config: HfConfig, key: str, expected: list[int], what: str) -> None:
    """A per-layer list in the config must be the periodic one llmpar models."""
    given = config.get(key)
    if given is not None and list(given) != expected:
        raise config.error(key, f"expected {what}, as llmpar models it")


def llama4_text(config: HfConfig) -> dict[str, Any]:
    """Llama4ForCausalLM (the language model of Llama4ForConditionalGeneration): MoE
    layers every interleave_moe_layer_step-th layer (moe_layers), each num_local_experts
    experts of intermediate_size, top num_experts_per_tok, and one shared expert of
    intermediate_size behind a bias-free router; the other layers a dense MLP of
    intermediate_size_mlp; RoPE and chunked attention on every layer but each
    no_rope_layer_interval-th (no_rope_layers: 1 rope and chunked, 0 NoPE and global)."""
    layers = config.integer("num_hidden_layers")
    assert layers is not None
    step = config.integer("interleave_moe_layer_step", 1)
    interval = config.integer("no_rope_layer_interval", 4)
    assert step is not None and interval is not None
    _periodic(config, "moe_layers", list(range(step - 1, layers, step)),
              f"every {step}-th layer from layer {step - 1} (interleave_moe_layer_step)")
    _periodic(config, "no_rope_layers", [int((i + 1) % interval != 0) for i in range(layers)],
              f"NoPE on every {interval}-th layer (no_rope_layer_interval)")
    moe = {"num_experts": routed_experts(config, "num_local_experts", "num_experts"),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("intermediate_size"),
           "num_shared_experts": 1, "layer_frequency": step}
    table = {**decoder_table(config, tie_default=False), **attention_biases(config),
             "ffn_hidden_size": config.integer("intermediate_size_mlp", 16384), "moe": moe}
    if config.flag("use_qk_norm", True):  # Llama4TextConfig's default
        table["qk_l2_norm"] = True
    chunk = config.integer("attention_chunk_size")
    if chunk is not None:
        table.update(sliding_window=chunk, sliding_window_pattern=interval)
    return table


def minimax_m2(config: HfConfig) -> dict[str, Any]:
    """MiniMaxM2ForCausalLM: no biases, RMSNorm over the whole query and key projections
    (q_norm of heads x head_dim, k_norm of kv heads x head_dim), partial RoPE (rotary_dim;
    no parameters), every MLP num_local_experts experts of intermediate_size behind a
    sigmoid router whose e_score_correction_bias is a buffer; the MTP modules of the
    checkpoint are not built by transformers."""
    if not config.flag("use_qk_norm", True):
        raise config.error("use_qk_norm", "only true is supported (MiniMaxM2Attention "
                                          "always builds q_norm and k_norm)")
    moe = {"num_experts": routed_experts(config, "num_local_experts", "num_experts"),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("intermediate_size")}
    return {**decoder_table(config, tie_default=False), "qk_norm": True,
            "qk_norm_scope": "projection", "moe": moe}
