"""Pieces every model_type shares: activations, the decoder block, biases."""

from __future__ import annotations

from typing import Any

from llmpar.hf.config import HfConfig

SWISH = ("silu", "swish")
GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python", "gelu_accurate")


def gated_activation(config: HfConfig, key: str, default: str = "silu") -> str:
    """A gated MLP's activation (gate_proj, up_proj, down_proj): SiLU is SwiGLU, GELU is
    GeGLU (Shazeer 2020, arXiv:2002.05202)."""
    name = config.get(key, default)
    if name in SWISH:
        return "swiglu"
    if name in GELU:
        return "geglu"
    raise config.error(key, f"expected one of {', '.join(SWISH + GELU)}, got {name!r}")


def plain_activation(config: HfConfig, key: str, default: str) -> str:
    """A two-matrix MLP's activation (GPT-2, BERT)."""
    name = config.get(key, default)
    if name in GELU:
        return "gelu"
    if name == "relu":
        return "relu"
    raise config.error(key, f"expected relu or one of {', '.join(GELU)}, got {name!r}")


def decoder_table(config: HfConfig, tie_default: bool, activation_key: str = "hidden_act",
                  activation_default: str = "silu") -> dict[str, Any]:
    """A Llama-style block: RMSNorm before attention and MLP, RoPE, a gated MLP, GQA.

    num_key_value_heads and head_dim default as in transformers' LlamaConfig
    (num_attention_heads; hidden_size // num_attention_heads).
    """
    hidden, heads = config.integer("hidden_size"), config.integer("num_attention_heads")
    assert hidden is not None and heads is not None
    return {
        "num_layers": config.integer("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": config.integer("num_key_value_heads", heads),
        "head_dim": config.integer("head_dim", hidden // heads),
        "ffn_hidden_size": config.integer("intermediate_size"),
        "ffn_activation": gated_activation(config, activation_key, activation_default),
        "vocab_size": config.integer("vocab_size"),
        "tie_embeddings": config.flag("tie_word_embeddings", tie_default),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "max_position_embeddings": config.integer("max_position_embeddings"),
    }


def attention_biases(config: HfConfig, mlp_key: str | None = None) -> dict[str, bool]:
    """Llama's attention_bias: biases on Q, K, V and the output projection; its mlp_bias
    on the MLP's projections."""
    bias = config.flag("attention_bias")
    table = {"qkv_bias": bias, "attention_output_bias": bias}
    if mlp_key is not None:
        table["mlp_bias"] = config.flag(mlp_key)
    return table


def whole_window(config: HfConfig) -> dict[str, Any]:
    """A sliding window on every layer (Mistral, Mixtral, Phi-3), when one is set."""
    return {"sliding_window": config.integer("sliding_window")}


def no_sliding_window(config: HfConfig) -> dict[str, Any]:
    """Qwen2/Qwen3: use_sliding_window must be off (windows from max_window_layers on
    are not modelled)."""
    if config.flag("use_sliding_window"):
        raise config.error("use_sliding_window", "only false is supported: llmpar does not "
                           "model windows on the layers from max_window_layers on")
    return {}


ROTARY_FRACTION_DEFAULTS = {"glm4_moe": 0.5, "qwen3_next": 0.25, "qwen3_5_text": 0.25,
                            "qwen3_5_moe_text": 0.25}
"""partial_rotary_factor where a config.json leaves it out: the defaults of transformers
5.24.0's Glm4MoeConfig, Qwen3NextConfig, Qwen3_5TextConfig and Qwen3_5MoeTextConfig
(kwargs.setdefault("partial_rotary_factor", ...)); 1 for every other model_type."""


def _fraction_at(config: HfConfig, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise config.error(key, f"expected a number in (0, 1], got {value!r}")
    return float(value)


def _rope_table_fraction(config: HfConfig) -> tuple[str, Any] | None:
    """partial_rotary_factor inside rope_scaling (transformers 4.x), else rope_parameters
    (5.x): one table, or one per layer type (Gemma 3's), which must agree."""
    for table_key in ("rope_scaling", "rope_parameters"):
        table = config.get(table_key)
        if not isinstance(table, dict) or not table:
            continue
        nested = {kind: part for kind, part in table.items() if isinstance(part, dict)}
        if not nested:
            found = table.get("partial_rotary_factor")
            return None if found is None else (f"{table_key}.partial_rotary_factor", found)
        values = {kind: part.get("partial_rotary_factor", 1.0) for kind, part in nested.items()}
        first = next(iter(values.values()))
        if any(value != first for value in values.values()):  # (values need not hash)
            raise config.error(table_key, f"expected one partial_rotary_factor for every "
                                          f"layer type, got {values}")
        kind, value = next(iter(values.items()))
        return f"{table_key}.{kind}.partial_rotary_factor", value
    return None


ROTARY_DIM_TYPES = ("minimax_m2",)
"""The model_types whose configuration reads a legacy rotary_dim (channels rotated) when
partial_rotary_factor is not given (MiniMaxM2Config.convert_rope_params_to_dict,
transformers 5.24.0); other configs' rotary_dim is not read by transformers."""


def rotary_fraction(config: HfConfig, head_dim: int | None) -> float | None:
    """The share of each head that RoPE rotates, as transformers 5.24.0 reads it
    (PreTrainedConfig.convert_rope_params_to_dict, modeling_rope_utils.py):
    partial_rotary_factor inside rope_scaling or rope_parameters first, then at the top
    level; rotary_dim over head_dim where the model_type reads it (`ROTARY_DIM_TYPES`);
    else the model_type's default (`ROTARY_FRACTION_DEFAULTS`). None for the whole
    head."""
    found = _rope_table_fraction(config)
    if found is None and config.get("partial_rotary_factor") is not None:
        found = "partial_rotary_factor", config.get("partial_rotary_factor")
    if (found is None and config.model_type in ROTARY_DIM_TYPES
            and config.get("rotary_dim") is not None):
        width = config.integer("rotary_dim")
        assert width is not None
        if head_dim is None or not 0 < width <= head_dim:
            raise config.error("rotary_dim", f"expected 1 to head_dim ({head_dim}) channels, "
                                             f"got {width}")
        found = "rotary_dim", width / head_dim
    if found is None:
        default = ROTARY_FRACTION_DEFAULTS.get(config.model_type)
        found = None if default is None else ("partial_rotary_factor", default)
    if found is None:
        return None
    fraction = _fraction_at(config, *found)
    return None if fraction == 1 else fraction


MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
"""The config keys of the multi-token-prediction modules a checkpoint holds (`Model.mtp_layers`):
DeepSeek-V3/R1/V3.2, GLM-4.5 and MiMo write num_nextn_predict_layers, Qwen3-Next and Qwen3.5
mtp_num_hidden_layers (their config.json; transformers builds neither)."""


def mtp_table(config: HfConfig, copies: bool) -> dict[str, Any]:
    """`mtp_layers` from whichever MTP key the config gives (nothing without modules) and, when the
    family's checkpoint stores them, `mtp_table_copies`. Two keys that disagree, or
    Qwen's mtp_use_dedicated_embeddings (an embedding of the module's own, not modelled),
    are errors."""
    given = {key: config.integer(key) for key in MTP_KEYS if config.get(key) is not None}
    counts = set(given.values())
    if len(counts) > 1:
        raise config.error(MTP_KEYS[1], f"disagrees with {MTP_KEYS[0]} ({given})")
    layers = counts.pop() if counts else 0
    assert layers is not None
    if layers < 0:
        raise config.error(next(iter(given)), f"expected an integer >= 0, got {layers}")
    if layers and config.flag("mtp_use_dedicated_embeddings"):
        raise config.error("mtp_use_dedicated_embeddings", "only false is supported (the "
                                                           "modules share the embedding)")
    if not layers:
        return {}
    return {"mtp_layers": layers, "mtp_table_copies": copies}


def mtp_note(config: HfConfig, table: dict[str, Any]) -> str:
    """What a source says about the MTP modules it counts as mtp_layers."""
    key = next(key for key in MTP_KEYS if config.get(key) is not None)
    copies = (", stored with a copy of the embedding and of the output head each"
              if table["mtp_table_copies"] else "")
    return (f"; its multi-token-prediction modules ({key}), which transformers does not "
            f"build, as mtp_layers{copies}: in the checkpoint, not in the main model's "
            f"count")
