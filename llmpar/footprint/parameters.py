"""Parameter counts by group, from the architecture.

Each count is the number of elements of the weight tensors a standard
implementation allocates (Hugging Face `transformers` layouts); biases and norm
weights are counted in their groups.
"""

from __future__ import annotations

import attrs

from llmpar.spec import Model

GROUPS = ("embedding", "attention", "mlp", "norms", "head")


@attrs.frozen(kw_only=True)
class ParameterCount:
    """Parameters of one replica; `by_group` is empty for a model given by size."""

    total: float
    by_group: dict[str, int] = attrs.field(factory=dict, hash=False)
    per_layer: int | None = None
    """Parameters of one transformer block (attention + MLP + its norms)."""


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


def mlp_parameters(model: Model) -> int:
    """The MLP of one layer: gate/up/down (gated) or up/down, with biases."""
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    h, f = model.hidden_size, model.ffn_hidden_size
    matrices = 3 if model.gated else 2
    biases = 0
    if model.linear_bias:
        biases = (matrices - 1) * f + h
    return matrices * h * f + biases


def layer_norm_parameters(model: Model) -> int:
    """The two norms of a block, plus per-head query/key norms where present."""
    assert model.hidden_size is not None and model.head_dim is not None
    qk = 2 * norm_parameters(model, model.head_dim) if model.qk_norm else 0
    return 2 * norm_parameters(model, model.hidden_size) + qk


def embedding_parameters(model: Model) -> int:
    """Token, learned position and token-type tables, and an embedding norm."""
    assert model.hidden_size is not None and model.vocab_size is not None
    h = model.hidden_size
    rows = model.vocab_size + model.type_vocab_size
    if model.position_embedding == "learned":
        assert model.max_position_embeddings is not None
        rows += model.max_position_embeddings
    return rows * h


def count_parameters(model: Model) -> ParameterCount:
    """Parameters of `model`, exact for an architecture, as given for a size."""
    if not model.has_architecture:
        assert model.parameters is not None
        return ParameterCount(total=float(model.parameters))
    assert model.num_layers is not None and model.hidden_size is not None
    layers = model.num_layers
    final_norms = norm_parameters(model, model.hidden_size) if model.final_norm else 0
    if model.embedding_norm:
        final_norms += norm_parameters(model, model.hidden_size)
    head = 0 if model.tie_embeddings else embedding_parameters_of_head(model)
    groups = {
        "embedding": embedding_parameters(model),
        "attention": layers * attention_parameters(model),
        "mlp": layers * mlp_parameters(model),
        "norms": layers * layer_norm_parameters(model) + final_norms,
        "head": head,
    }
    per_layer = attention_parameters(model) + mlp_parameters(model)
    per_layer += layer_norm_parameters(model)
    return ParameterCount(
        total=float(sum(groups.values())), by_group=groups, per_layer=per_layer
    )


def embedding_parameters_of_head(model: Model) -> int:
    """The untied output projection: vocab_size x hidden_size, no bias."""
    assert model.hidden_size is not None and model.vocab_size is not None
    return model.vocab_size * model.hidden_size
