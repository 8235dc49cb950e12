"""Hybrid decoders whose layers mix attention with recurrent token mixers: Qwen3-Next and
Qwen3.5 (gated DeltaNet), Granite 4 (Mamba-2) and Falcon-H1 (attention and Mamba-2 side by
side in every layer), as transformers builds them (modeling_qwen3_next.py,
modeling_qwen3_5.py, modeling_qwen3_5_moe.py, modeling_granitemoehybrid.py,
modeling_falcon_h1.py, v5.24)."""

from __future__ import annotations

from typing import Any

from llmpar.hf.common import attention_biases, decoder_table
from llmpar.hf.config import HfConfig
from llmpar.hf.decoders import routed_experts

QWEN3_NEXT_NOTE = ("; the checkpoint's multi-token-prediction layer is counted (as mtp_layers) "
                   "where the config gives mtp_num_hidden_layers")
"""Its multi-token-prediction layer (mtp_num_hidden_layers), which transformers does not
build, is mtp_layers (hf.common.mtp_table)."""

QWEN3_5_NOTE = "; transformers' Qwen3.5 classes skip the checkpoint's mtp.* weights"
"""Its multi-token-prediction layer (mtp_num_hidden_layers) is mtp_layers
(hf.common.mtp_table)."""

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
    unknown = sorted({repr(kind) for kind in kinds
                      if not isinstance(kind, str) or kind not in letters})
    if unknown:
        raise config.error(key, f"expected layer kinds among {', '.join(sorted(letters))}, "
                                f"got {', '.join(unknown)}")
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


def _gated_deltanet_layers(config: HfConfig, moe: dict[str, Any] | None) -> dict[str, Any]:
    """The layer pattern, the gated attention and the gated DeltaNet sizes that Qwen3-Next
    and Qwen3.5 share: layer_types (or a full-attention layer every
    full_attention_interval-th layer), the attention's q_proj twice as wide for its output
    gate, per-head q/k RMSNorm, RoPE on partial_rotary_factor of each head (no
    parameters); the zero-centred norms (1 + weight) count as RMSNorms. `moe`: the
    experts' table, if any."""
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
    linear = {"num_key_heads": config.integer("linear_num_key_heads", 16),
              "num_value_heads": config.integer("linear_num_value_heads", 32),
              "key_head_dim": config.integer("linear_key_head_dim", 128),
              "value_head_dim": config.integer("linear_value_head_dim", 128),
              "conv_kernel_size": config.integer("linear_conv_kernel_dim", 4)}
    table = {**decoder_table(config, tie_default=False), **attention_biases(config),
             "qk_norm": True, "attention_output_gate": True, "moe": moe,
             "mixer_pattern": mixer_pattern(config, "layer_types", kinds, QWEN3_NEXT_KINDS)}
    if "linear_attention" in kinds:  # a model of full-attention layers alone has none
        table["linear_attention"] = linear
    return table


def _shared_expert_moe(config: HfConfig, sparse_step: bool) -> dict[str, Any]:
    """num_experts experts of moe_intermediate_size behind a bias-free router and a shared
    expert of shared_expert_intermediate_size behind a sigmoid gate (Qwen2-MoE's block);
    with `sparse_step`, on every decoder_sparse_step-th layer."""
    moe = {"num_experts": routed_experts(config),
           "experts_per_token": config.integer("num_experts_per_tok"),
           "expert_ffn_hidden_size": config.integer("moe_intermediate_size")}
    if sparse_step:
        moe["layer_frequency"] = config.integer("decoder_sparse_step", 1)
    shared = config.integer("shared_expert_intermediate_size", 0)
    if shared:
        moe.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=True)
    return moe


def qwen3_next(config: HfConfig) -> dict[str, Any]:
    """Qwen3NextForCausalLM: gated DeltaNet layers with a gated-attention layer every
    full_attention_interval-th layer (`_gated_deltanet_layers`); every
    decoder_sparse_step-th layer num_experts experts of moe_intermediate_size and a shared
    expert of shared_expert_intermediate_size behind a sigmoid gate."""
    return _gated_deltanet_layers(config, _shared_expert_moe(config, True))


def qwen3_5_text(config: HfConfig) -> dict[str, Any]:
    """Qwen3_5ForCausalLM (Qwen3.5's dense language model, Qwen3_5TextConfig): Qwen3-Next's
    layers (`_gated_deltanet_layers`; its gated DeltaNet projects q, k and v, z, b and a
    separately, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, the same weights as
    Qwen3-Next's fused in_proj_qkvz and in_proj_ba) with a dense SwiGLU MLP of
    intermediate_size in every layer."""
    return _gated_deltanet_layers(config, None)


def qwen3_5_moe_text(config: HfConfig) -> dict[str, Any]:
    """Qwen3_5MoeForCausalLM (Qwen3.5's MoE language model): Qwen3.5's layers with
    Qwen3-Next's experts and gated shared expert in every layer
    (Qwen3_5MoeSparseMoeBlock; no decoder_sparse_step). Its config has no
    intermediate_size (no layer is dense): the model's ffn_hidden_size, which no layer
    uses, is then the experts' moe_intermediate_size."""
    table = _gated_deltanet_layers(config, _shared_expert_moe(config, False))
    if table["ffn_hidden_size"] is None:
        table["ffn_hidden_size"] = config.integer("moe_intermediate_size")
    return table


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


def falcon_h1(config: HfConfig) -> dict[str, Any]:
    """FalconH1ForCausalLM: every layer runs Llama attention (attention_bias) and a Mamba-2
    mixer (FalconH1Mixer) on the same normed input and sums their outputs, then a SwiGLU MLP
    (mlp_bias) after its own norm (FalconH1DecoderLayer: input_layernorm,
    pre_ff_layernorm). The mixer's inner width is mamba_d_ssm (else mamba_expand x
    hidden_size), its head width mamba_d_head ("auto": the inner width over mamba_n_heads);
    its gated RMSNorm exists only with mamba_rms_norm; mamba_proj_bias biases in_proj and
    projectors_bias out_proj. The muP multipliers (embedding, attention, key, SSM, MLP and
    logits) scale activations and add no parameter; layers_block_type is "hybrid" for
    every layer."""
    hidden = config.integer("hidden_size")
    assert hidden is not None
    heads = config.integer("mamba_n_heads", 128)
    expand = config.integer("mamba_expand", 2)
    assert heads is not None and expand is not None
    inner = config.integer("mamba_d_ssm", expand * hidden)
    assert inner is not None
    head = config.get("mamba_d_head", "auto")
    head_dim = inner // heads if head == "auto" else config.integer("mamba_d_head")
    assert head_dim is not None
    if heads * head_dim != inner:
        raise config.error("mamba_d_head", f"mamba_n_heads ({heads}) x mamba_d_head "
                                           f"({head_dim}) must be the inner width {inner} "
                                           "(mamba_d_ssm)")
    kinds = config.get("layers_block_type") or config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or not kinds
                              or not all(kind == "hybrid" for kind in kinds)):
        key = "layers_block_type" if config.get("layers_block_type") else "layer_types"
        raise config.error(key, f"expected \"hybrid\" for every layer (attention and Mamba-2 "
                                f"in parallel, FalconH1DecoderLayer), got {kinds!r}")
    projection_bias = config.flag("mamba_proj_bias")
    if config.flag("projectors_bias") != projection_bias:
        raise config.error("projectors_bias", "only equal to mamba_proj_bias is supported: "
                                              "llmpar biases both Mamba-2 projections or none")
    mamba = {"num_heads": heads, "head_dim": head_dim,
             "state_size": config.integer("mamba_d_state", 256),
             "num_groups": config.integer("mamba_n_groups", 1),
             "conv_kernel_size": config.integer("mamba_d_conv", 4),
             "conv_bias": config.flag("mamba_conv_bias", True),
             "projection_bias": projection_bias,
             "chunk_size": config.integer("mamba_chunk_size", 256),
             "gated_norm": config.flag("mamba_rms_norm")}
    return {**decoder_table(config, tie_default=False),
            **attention_biases(config, mlp_key="mlp_bias"),
            "mixer_pattern": "P", "mamba": mamba}
