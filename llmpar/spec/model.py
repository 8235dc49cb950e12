"""The model: an architecture, or only a parameter count for quick estimates."""

from __future__ import annotations

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import Count

FFN_ACTIVATIONS = ("gelu", "relu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")

ARCHITECTURE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "vocab_size",
)
"""The fields without which a model is only a size."""


@attrs.frozen(kw_only=True)
class MoE:
    """`[model.moe]`: a mixture of experts in place of some layers' MLP.

    Layer i (from 0) is an MoE layer when i >= dense_layers and (i + 1) is a
    multiple of layer_frequency (Hugging Face's `decoder_sparse_step` convention;
    DeepSeek's `first_k_dense_replace` is `dense_layers`).
    """

    num_experts: int = attrs.field(validator=v.positive)
    """Routed experts per MoE layer."""
    experts_per_token: int = attrs.field(validator=v.positive)
    """Routed experts each token goes to (top-k)."""
    expert_ffn_hidden_size: int = attrs.field(validator=v.positive)
    """Inner width of one expert's MLP."""
    num_shared_experts: int = attrs.field(default=0, validator=v.non_negative)
    """Experts every token goes to (DeepSeek, Qwen2-MoE)."""
    shared_expert_ffn_hidden_size: int | None = attrs.field(
        default=attrs.Factory(lambda self: self.expert_ffn_hidden_size, takes_self=True),
        validator=v.positive)
    """Inner width of one shared expert. Default: expert_ffn_hidden_size."""
    dense_layers: int = attrs.field(default=0, validator=v.non_negative)
    """The first layers keep a dense MLP of ffn_hidden_size."""
    layer_frequency: int = attrs.field(default=1, validator=v.positive)
    """Every layer_frequency-th layer (after dense_layers) is an MoE layer."""
    capacity_factor: float | None = attrs.field(default=None, validator=v.positive)
    """Token capacity per expert, as a multiple of the balanced share; None: no dropping."""
    router_bias: bool = False
    """A per-expert bias in the router (parameters: num_experts per MoE layer)."""
    shared_expert_gate: bool = False
    """A sigmoid gate on the shared expert's output (Qwen2-MoE: hidden_size weights)."""


def _default_kv_heads(model: Model) -> int | None:
    return model.num_attention_heads


def _default_head_dim(model: Model) -> int | None:
    if model.hidden_size is None or not model.num_attention_heads:
        return None
    return model.hidden_size // model.num_attention_heads


@attrs.frozen(kw_only=True)
class Model:
    """A decoder (or encoder) transformer.

    Give the architecture fields for exact parameter, FLOP and activation counts,
    or only `parameters` (optionally with `num_layers` and `hidden_size`) for the
    founding document's back-of-the-envelope estimates.
    """

    name: str = "custom"
    """Preset name or a label for reports."""
    source: str = ""
    """Where the numbers come from (config.json, paper)."""
    parameters: Count | None = attrs.field(default=None, validator=v.positive)
    """Total parameter count, for a model given only by its size."""
    num_layers: int | None = attrs.field(default=None, validator=v.positive)
    """Transformer blocks (L)."""
    hidden_size: int | None = attrs.field(default=None, validator=v.positive)
    """Width of the residual stream (h)."""
    num_attention_heads: int | None = attrs.field(default=None, validator=v.positive)
    """Query heads (a)."""
    num_kv_heads: int | None = attrs.field(
        default=attrs.Factory(_default_kv_heads, takes_self=True), validator=v.positive
    )
    """Key/value heads; fewer than query heads is GQA, one is MQA. Default: a."""
    head_dim: int | None = attrs.field(
        default=attrs.Factory(_default_head_dim, takes_self=True), validator=v.positive
    )
    """Width of one head. Default: hidden_size / num_attention_heads."""
    ffn_hidden_size: int | None = attrs.field(default=None, validator=v.positive)
    """Inner width of the MLP."""
    ffn_activation: str = attrs.field(default="gelu", validator=v.one_of(*FFN_ACTIVATIONS))
    """gelu/relu: two matrices; swiglu/geglu: three (gate, up, down)."""
    vocab_size: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens in the vocabulary (V)."""
    tie_embeddings: bool = False
    """The output layer reuses the input embedding matrix."""
    norm: str = attrs.field(default="layernorm", validator=v.one_of(*NORMS))
    """layernorm has a weight and a bias per channel, rmsnorm only a weight."""
    position_embedding: str = attrs.field(
        default="rope", validator=v.one_of(*POSITION_EMBEDDINGS)
    )
    """rope, alibi and none add no parameters; learned adds a table of positions."""
    max_position_embeddings: int | None = attrs.field(default=None, validator=v.positive)
    """Longest sequence; the size of a learned position table."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2)."""
    linear_bias: bool = False
    """Biases on every linear layer of the blocks (GPT-2, BERT)."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (Qwen3, OLMo 2 style per-head)."""
    type_vocab_size: int = attrs.field(default=0, validator=v.non_negative)
    """Segment (token type) embeddings, as in BERT."""
    embedding_norm: bool = False
    """A norm right after the embeddings, as in BERT."""
    final_norm: bool = True
    """A norm after the last block (pre-norm models); BERT's post-norm blocks have none."""
    moe: MoE | None = None
    """Mixture of experts; None for a dense model."""

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (from 0) has experts instead of a dense MLP."""
        moe = self.moe
        if moe is None:
            return False
        return index >= moe.dense_layers and (index + 1) % moe.layer_frequency == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers or 0))

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP."""
        return (self.num_layers or 0) - self.num_moe_layers

    @property
    def has_architecture(self) -> bool:
        """True when every architecture field is set (exact counts possible)."""
        return all(getattr(self, name) is not None for name in ARCHITECTURE_FIELDS)

    @property
    def gated(self) -> bool:
        """A gated MLP (three matrices)."""
        return self.ffn_activation in GATED_ACTIVATIONS

    @property
    def query_width(self) -> int:
        """num_attention_heads * head_dim."""
        assert self.num_attention_heads is not None and self.head_dim is not None
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """num_kv_heads * head_dim: the width of K and of V."""
        assert self.num_kv_heads is not None and self.head_dim is not None
        return self.num_kv_heads * self.head_dim
