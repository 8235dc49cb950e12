"""Hybrid decoders whose layers mix attention with recurrent token mixers: Qwen3-Next
(gated DeltaNet) and Granite 4 (Mamba-2), as transformers builds them
(modeling_qwen3_next.py, modeling_granitemoehybrid.py, v5.24)."""

from __future__ import annotations

from typing import Any

from llmpar.hf.common import attention_biases, decoder_table
from llmpar.hf.config import HfConfig
from llmpar.hf.decoders import routed_experts

QWEN3_NEXT_NOTE = ("; without the multi-token-prediction layer (mtp_num_hidden_layers), which "
                   "transformers does not build")

QWEN3_NEXT_KINDS = {"full_attention": "A", "linear_attention": "L"}
"""Qwen3-Next's layer_types and their mixer letters (`Model.mixer_pattern`)."""
GRANITE_KINDS = {"attention": "A", "full_attention": "A", "mamba": "M", "linear_attention": "M"}
"""Granite 4's layer kinds: config.json writes "mamba" and "attention", which transformers
5 reads as "linear_attention" and "full_attention" (configuration_utils'
_LEGACY_LAYER_TYPE_REMAP); either spelling is a Mamba-2 or an attention layer."""


def mixer_pattern(config: HfConfig, key: str, kinds: list[str],
                  letters: dict[str, str]) -> str:
    """The shortest repeating pattern of a per-layer list (`kinds`, read from `key`), in
    the mixer letters that `letters` gives each kind."""
    unknown = sorted({kind for kind in kinds if kind not in letters})
    if unknown:
        raise config.error(key, f"expected layer kinds among {', '.join(sorted(letters))}, "
                                f"got {', '.join(repr(k) for k in unknown)}")
    written = "".join(letters[kind] for kind in kinds)
    period = next(p for p in range(1, len(written) + 1)
                  if len(written) % p == 0 and written == written[:p] * (len(written) // p))
    return written[:period]


def _layer_list(config: HfConfig, key: str, layers: int) -> list[str] | None:
    kinds = config.get(key)
    if kinds is None:
        return None
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise config.error(key, f"expected a list of {layers} layer kinds "
                                f"(num_hidden_layers), got {kinds!r}")
    return kinds


def qwen3_next(config: HfConfig) -> dict[str, Any]:
    """Qwen3NextForCausalLM: gated DeltaNet layers with a gated-attention layer every
    full_attention_interval-th layer (layer_types); the attention's q_proj twice as wide for
    its output gate, per-head q/k RMSNorm, RoPE on partial_rotary_factor of each head (no
    parameters); every decoder_sparse_step-th layer num_experts experts of
    moe_intermediate_size and a shared expert of shared_expert_intermediate_size behind a
    sigmoid gate; the zero-centred norms (1 + weight) count as RMSNorms."""
    layers = config.integer("num_hidden_layers")
    assert layers is not None
    kinds = _layer_list(config, "layer_types", layers)
    if kinds is None:
        interval = config.integer("full_attention_interval", 4)
        assert interval is not None
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(layers)]
    if config.get("mlp_only_layers"):
        raise config.error("mlp_only_layers", "only [] is supported")
    moe = {"num_experts": routed_experts(config),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("moe_intermediate_size"),
           "layer_frequency": config.integer("decoder_sparse_step", 1)}
    shared = config.integer("shared_expert_intermediate_size", 0)
    if shared:
        moe.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=True)
    linear = {"num_key_heads": config.integer("linear_num_key_heads", 16),
              "num_value_heads": config.integer("linear_num_value_heads", 32),
              "key_head_dim": config.integer("linear_key_head_dim", 128),
              "value_head_dim": config.integer("linear_value_head_dim", 128),
              "conv_kernel_size": config.integer("linear_conv_kernel_dim", 4)}
    return {**decoder_table(config, tie_default=False), **attention_biases(config),
            "qk_norm": True, "attention_output_gate": True, "moe": moe,
            "mixer_pattern": mixer_pattern(config, "layer_types", kinds, QWEN3_NEXT_KINDS),
            "linear_attention": linear}


def granitemoehybrid(config: HfConfig) -> dict[str, Any]:
    """GraniteMoeHybridForCausalLM (Granite 4): Mamba-2 and attention layers as layer_types
    (or layers_block_type) says, every one with a shared MLP of shared_intermediate_size
    (input_linear, output_linear; a shared expert without a gate) and, with
    num_local_experts > 0, num_local_experts experts of intermediate_size behind a bias-free
    router; RoPE only with position_embedding_type "rope"; its embedding, attention,
    residual and logits multipliers add no parameter."""
    layers = config.integer("num_hidden_layers")
    hidden = config.integer("hidden_size")
    assert layers is not None and hidden is not None
    key = "layer_types" if config.get("layer_types") is not None else "layers_block_type"
    kinds = _layer_list(config, key, layers) or ["mamba"] * layers
    experts = config.integer("num_local_experts", 8)
    shared = config.integer("shared_intermediate_size", 1024)
    table = {**decoder_table(config, tie_default=False), **attention_biases(config),
             "ffn_hidden_size": shared,
             "position_embedding": ("rope" if config.get("position_embedding_type") == "rope"
                                    else "none")}
    if experts:
        table["moe"] = {"num_experts": experts,
                        "experts_per_token": config.integer("num_experts_per_tok"),
                        "expert_ffn_hidden_size": config.integer("intermediate_size"),
                        "num_shared_experts": 1, "shared_expert_ffn_hidden_size": shared}
    pattern = mixer_pattern(config, key, kinds, GRANITE_KINDS)
    if "M" in pattern:
        expand = config.integer("mamba_expand", 2)
        heads = config.integer("mamba_n_heads", 128)
        assert expand is not None and heads is not None
        head = config.get("mamba_d_head", "auto")
        table["mamba"] = {
            "num_heads": heads,
            "head_dim": expand * hidden // heads if head == "auto" else config.integer(
                "mamba_d_head"),
            "state_size": config.integer("mamba_d_state", 256),
            "num_groups": config.integer("mamba_n_groups", 1),
            "conv_kernel_size": config.integer("mamba_d_conv", 4),
            "conv_bias": config.flag("mamba_conv_bias", True),
            "projection_bias": config.flag("mamba_proj_bias"),
            "chunk_size": config.integer("mamba_chunk_size", 256)}
    if pattern != "A":
        table["mixer_pattern"] = pattern
    return table
