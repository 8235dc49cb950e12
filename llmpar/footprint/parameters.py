"""Parameter counts by group, from the architecture.

Each count is the number of elements of the weight tensors a standard
implementation allocates (Hugging Face `transformers` layouts); biases and norm
weights are counted in their groups.
"""

from __future__ import annotations

import attrs

from llmpar.spec import Model

GROUPS = ("embedding", "attention", "mlp", "experts", "shared_experts", "router", "norms",
          "head")


@attrs.frozen(kw_only=True)
class ParameterCount:
    """Parameters of one replica; `by_group` is empty for a model given by size."""

    total: float
    active: float
    """Parameters one token passes through (MoE: only its experts); 6ND uses these."""
    by_group: dict[str, int] = attrs.field(factory=dict, hash=False)


def norm_parameters(model: Model, width: int) -> int:
    """A norm over `width` channels: LayerNorm has weight and bias, RMSNorm only weight."""
    return 2 * width if model.norm == "layernorm" else width


def attention_parameters(model: Model) -> int:
    """Q, K, V and output projections of one layer, with their biases."""
    assert model.hidden_size is not None
    h, qw, kvw = model.hidden_size, model.query_width, model.kv_width
    weights = h * qw + 2 * h * kvw + qw * h
    biases = 0
    if model.qkv_bias or model.linear_bias:
        biases += qw + 2 * kvw
    if model.linear_bias:
        biases += h
    return weights + biases


def mlp_parameters(model: Model, width: int) -> int:
    """One MLP of inner width `width`: gate/up/down (gated) or up/down, with biases."""
    assert model.hidden_size is not None
    h = model.hidden_size
    matrices = 3 if model.gated else 2
    biases = (matrices - 1) * width + h if model.linear_bias else 0
    return matrices * h * width + biases


def layer_norm_parameters(model: Model) -> int:
    """The two norms of a block, plus per-head query/key norms where present."""
    assert model.hidden_size is not None and model.head_dim is not None
    qk = 2 * norm_parameters(model, model.head_dim) if model.qk_norm else 0
    return 2 * norm_parameters(model, model.hidden_size) + qk


def embedding_parameters(model: Model) -> int:
    """Token, learned position and token-type tables."""
    assert model.hidden_size is not None and model.vocab_size is not None
    rows = model.vocab_size + model.type_vocab_size
    if model.position_embedding == "learned":
        assert model.max_position_embeddings is not None
        rows += model.max_position_embeddings
    return rows * model.hidden_size


def head_parameters(model: Model) -> int:
    """The untied output projection: vocab_size x hidden_size, no bias."""
    assert model.hidden_size is not None and model.vocab_size is not None
    return 0 if model.tie_embeddings else model.vocab_size * model.hidden_size


def moe_layer_groups(model: Model) -> dict[str, int]:
    """Routed experts, shared experts and router of one MoE layer."""
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    shared_width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
    shared = moe.num_shared_experts * mlp_parameters(model, shared_width)
    if moe.shared_expert_gate:
        shared += model.hidden_size
    router = model.hidden_size * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
    return {"experts": moe.num_experts * mlp_parameters(model, moe.expert_ffn_hidden_size),
            "shared_experts": shared, "router": router}


def count_parameters(model: Model) -> ParameterCount:
    """Parameters of `model`, exact for an architecture, as given for a size."""
    if not model.has_architecture:
        assert model.parameters is not None
        return ParameterCount(total=float(model.parameters), active=float(model.parameters))
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    final_norms = norm_parameters(model, model.hidden_size) if model.final_norm else 0
    if model.embedding_norm:
        final_norms += norm_parameters(model, model.hidden_size)
    layers, moe_layers = model.num_layers or 0, model.num_moe_layers
    groups = dict.fromkeys(GROUPS, 0)
    groups["embedding"] = embedding_parameters(model)
    groups["attention"] = layers * attention_parameters(model)
    groups["mlp"] = model.num_dense_layers * mlp_parameters(model, model.ffn_hidden_size)
    groups["norms"] = layers * layer_norm_parameters(model) + final_norms
    groups["head"] = head_parameters(model)
    inactive = 0
    if model.moe is not None:
        for name, count in moe_layer_groups(model).items():
            groups[name] = moe_layers * count
        idle_experts = model.moe.num_experts - model.moe.experts_per_token
        inactive = moe_layers * idle_experts * mlp_parameters(model,
                                                              model.moe.expert_ffn_hidden_size)
    else:
        groups = {name: count for name, count in groups.items()
                  if name not in ("experts", "shared_experts", "router")}
    total = float(sum(groups.values()))
    return ParameterCount(total=total, active=total - inactive, by_group=groups)
