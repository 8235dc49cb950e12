"""Decoders whose layers are one module each: Nemotron-H, where a layer is a Mamba-2 mixer,
an attention, an MLP or the experts alone behind one norm (NemotronHBlock,
modeling_nemotron_h.py, transformers 5.24), and Mamba-2, a stack of mixers alone
(Mamba2Block, modeling_mamba2.py, transformers 5.24)."""

from __future__ import annotations

from typing import Any

from llmpar.hf.config import HfConfig

NEMOTRON_H_LETTERS = {"M": "m", "*": "a", "-": "-", "E": "E"}
"""hybrid_override_pattern's letters (NemotronHConfig._pattern_to_list: "M" Mamba-2, "*"
attention, "-" MLP, "E" experts) as llmpar's single-module letters (`Model.mixer_pattern`)."""
NEMOTRON_H_KINDS = {"linear_attention": "m", "mamba": "m", "full_attention": "a",
                    "attention": "a", "mlp": "-", "moe": "E"}
"""layers_block_type's kinds, as transformers 5 writes them ("linear_attention",
"full_attention") and as older configs do ("mamba", "attention"), by llmpar letter."""
NEMOTRON_H_LATENT = ("latent experts (moe_latent_size: NemotronHMoE's fc1_latent_proj and "
                     "fc2_latent_proj around experts of the latent width) are not modelled")

def _shortest_period(written: str) -> str:
    """The shortest pattern that repeats to `written` (`Model.mixer_pattern` repeats)."""
    return next(written[:period] for period in range(1, len(written) + 1)
                if len(written) % period == 0
                and written == written[:period] * (len(written) // period))


def _nemotron_h_pattern(config: HfConfig) -> str:
    """Each layer's letter, from layers_block_type (layer_types, transformers 5) or from
    hybrid_override_pattern, whichever the config gives (NemotronHConfig.__post_init__
    reads the list first)."""
    for key in ("layers_block_type", "layer_types"):
        kinds = config.get(key)
        if kinds is None:
            continue
        if not isinstance(kinds, list) or not kinds:
            raise config.error(key, f"expected a list of layer kinds, got {kinds!r}")
        unknown = sorted({str(kind) for kind in kinds if kind not in NEMOTRON_H_KINDS})
        if unknown:
            raise config.error(key, f"expected layer kinds among "
                                    f"{', '.join(sorted(NEMOTRON_H_KINDS))}, got "
                                    f"{', '.join(repr(k) for k in unknown)}")
        return "".join(NEMOTRON_H_KINDS[kind] for kind in kinds)
    key = "hybrid_override_pattern"
    pattern = config.get(key)
    if not isinstance(pattern, str) or not pattern:
        raise config.error(key, f"required: a letter per layer (M, *, -, E), or "
                                f"layers_block_type; got {pattern!r}")
    unknown = sorted(set(pattern) - set(NEMOTRON_H_LETTERS))
    if unknown:
        raise config.error(key, f"expected the letters M, *, - and E, got "
                                f"{', '.join(repr(k) for k in unknown)}")
    return "".join(NEMOTRON_H_LETTERS[letter] for letter in pattern)


def _key(config: HfConfig, *names: str) -> str:
    """The first of `names` the config gives (NemotronHConfig.__post_init__ reads the
    mamba_* spellings in place of its own names), else the first."""
    return next((name for name in names if config.get(name) is not None), names[0])


def _mlp_activation(config: HfConfig) -> str:
    name = config.get("mlp_hidden_act", "relu2")
    if name in ("relu2", "relu"):
        return str(name)
    raise config.error("mlp_hidden_act", f"expected relu2 or relu, got {name!r}")


def nemotron_h(config: HfConfig) -> dict[str, Any]:
    """NemotronHForCausalLM: a stack of single-module layers (NemotronHBlock: one RMSNorm,
    one module, its residual) as hybrid_override_pattern or layers_block_type lists them,
    its length the layer count (NemotronHConfig.num_hidden_layers). Mamba-2 layers
    (NemotronHMamba2Mixer: in_proj and out_proj biased with use_bias, conv1d with
    use_conv_bias, a gated RMSNorm of the inner width mamba_num_heads x mamba_head_dim);
    attention layers without RoPE and without biases (NemotronHAttention: q/k/v/o bias
    False, head_dim 128 by default); MLP layers of up_proj and down_proj (mlp_bias) with
    mlp_hidden_act (relu2); experts layers (NemotronHMoE, `_nemotron_h_experts`). The
    config's attention_head_dim and mamba_proj_bias are not read by transformers 5.24 and
    count nothing here either."""
    hidden, heads = config.integer("hidden_size"), config.integer("num_attention_heads")
    assert hidden is not None and heads is not None
    written = _nemotron_h_pattern(config)
    pattern = _shortest_period(written)
    table: dict[str, Any] = {
        "num_layers": len(written),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": config.integer("num_key_value_heads", heads),
        "head_dim": config.integer("head_dim", 128),
        "ffn_hidden_size": config.integer("intermediate_size", 21504),
        "ffn_activation": _mlp_activation(config),
        "mlp_bias": config.flag("mlp_bias"),
        "vocab_size": config.integer("vocab_size", 131072),
        "tie_embeddings": config.flag("tie_word_embeddings"),
        "norm": "rmsnorm",
        "position_embedding": "none",
        "max_position_embeddings": config.integer("max_position_embeddings"),
        "mixer_pattern": pattern,
    }
    if "m" in pattern:
        table["mamba"] = {
            "num_heads": config.integer("mamba_num_heads", 128),
            "head_dim": config.integer("mamba_head_dim", 64),
            "state_size": config.integer("ssm_state_size", 128),
            "num_groups": config.integer(_key(config, "mamba_n_groups", "n_groups"), 8),
            "conv_kernel_size": config.integer(_key(config, "mamba_d_conv", "conv_kernel"),
                                               4),
            "conv_bias": config.flag(_key(config, "mamba_conv_bias", "use_conv_bias"), True),
            "projection_bias": config.flag("use_bias"),
            "chunk_size": config.integer(_key(config, "mamba_chunk_size", "chunk_size"),
                                         128),
            "gated_norm": True}
    if "E" in pattern:
        table["moe"] = _nemotron_h_experts(config)
    return table


def _nemotron_h_experts(config: HfConfig) -> dict[str, Any]:
    """NemotronHMoE (transformers 5.24): n_routed_experts experts of up_proj and down_proj
    (NemotronHExperts: 3D tensors, no biases, mlp_hidden_act), a router of one fp32 weight
    row per expert (NemotronHTopkRouter; its e_score_correction_bias is a buffer) and one
    shared MLP of moe_shared_expert_intermediate_size (NemotronHMLP: however many
    n_shared_experts the config says, transformers builds one)."""
    if config.get("moe_latent_size") is not None:
        raise config.error("moe_latent_size", NEMOTRON_H_LATENT)
    if config.flag("mlp_bias"):
        raise config.error("mlp_bias", "experts layers with mlp_bias: NemotronHExperts has no "
                                       "biases beside a biased shared MLP, which llmpar's "
                                       "one mlp_bias cannot tell apart")
    experts = config.integer(_key(config, "n_routed_experts", "num_local_experts"), 8)
    assert experts is not None
    return {"num_experts": experts,
            "experts_per_token": config.integer("num_experts_per_tok", 2),
            "expert_ffn_hidden_size": config.integer("moe_intermediate_size", 7688),
            "num_shared_experts": 1,
            "shared_expert_ffn_hidden_size": config.integer(
                "moe_shared_expert_intermediate_size", 7688)}


def mamba2(config: HfConfig) -> dict[str, Any]:
    """Mamba2ForCausalLM (modeling_mamba2.py, transformers 5.24): num_hidden_layers blocks of
    one RMSNorm and one Mamba2Mixer (no attention, no MLP: mixer_pattern "m"), the final
    norm_f and the output layer, tied with tie_word_embeddings. The mixer's inner width is
    expand x hidden_size, which Mamba2Config requires to be num_heads x head_dim; in_proj
    and out_proj biased with use_bias, conv1d with use_conv_bias; the gated RMSNorm
    (MambaRMSNormGated) of the inner width."""
    hidden = config.integer("hidden_size", 4096)
    heads, head_dim = config.integer("num_heads", 128), config.integer("head_dim", 64)
    expand = config.get("expand", 2)
    assert hidden is not None and heads is not None and head_dim is not None
    if not isinstance(expand, int | float) or hidden * expand != heads * head_dim:
        raise config.error("expand", f"hidden_size x expand ({hidden} x {expand!r}) must be "
                                     f"num_heads x head_dim ({heads} x {head_dim}), as "
                                     f"Mamba2Config.validate_architecture requires")
    return {
        "num_layers": config.integer("num_hidden_layers", 64),
        "hidden_size": hidden,
        "vocab_size": config.integer("vocab_size", 32768),
        "tie_embeddings": config.flag("tie_word_embeddings"),
        "norm": "rmsnorm",
        "position_embedding": "none",
        "mixer_pattern": "m",
        "mamba": {
            "num_heads": heads,
            "head_dim": head_dim,
            "state_size": config.integer("state_size", 128),
            "num_groups": config.integer("n_groups", 8),
            "conv_kernel_size": config.integer("conv_kernel", 4),
            "conv_bias": config.flag("use_conv_bias", True),
            "projection_bias": config.flag("use_bias"),
            "chunk_size": config.integer("chunk_size", 256),
            "gated_norm": True}}
