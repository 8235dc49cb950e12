"""The activation inventory: every tensor a training forward pass keeps for backward.

Each saved tensor has a symbolic shape, a format and the reason it is kept, so
parallel strategies can split it (by the tags in `splits`), recomputation can
drop it, and a report can show which tensors dominate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping

import attrs

SPLIT_TENSOR = "tensor"
"""Split by tensor parallelism: heads, the MLP's inner width or the vocabulary."""
SPLIT_SEQUENCE = "sequence"
"""Replicated across the tensor group unless sequence parallelism splits it."""
SPLIT_CONTEXT = "context"
"""Has a sequence dimension that context parallelism splits."""


@attrs.frozen(kw_only=True)
class SavedTensor:
    """One tensor kept for backward."""

    name: str
    reason: str
    shape: tuple[tuple[str, int], ...]
    """(symbol, size) per dimension, e.g. (("b", 1), ("s", 4096), ("h", 4096))."""
    bytes_per_element: float
    splits: frozenset[str] = frozenset()
    attention_score: bool = False
    """Grows with s^2; selective recomputation drops it (Korthikanti et al. 2022, Sec. 5)."""
    divisor: int = 1
    """How many ways parallel strategies have split it."""
    placement: str = ""
    """Outside the layers: "embedding" or "head", the pipeline stage that keeps it."""
    module: str = ""
    """The Megatron-Core module whose recomputation frees it (`[training]
    recompute_modules`): "layernorm", "mlp", "moe", "moe_act", "shared_experts",
    "mla_up_proj"; "" when none does (a module's input, the residual stream). Attention
    scores belong to "core_attn" by `attention_score`."""
    weights: frozenset[str] = frozenset()
    """The weights whose products take it as input, as "<parameter group>.<PEFT module
    name>" ("attention.q_proj", "mlp.down_proj") or "<parameter group>" ("norms",
    "head", "embedding", "router"): their weight gradients need it (a product
    x W saves x only for W's gradient: PyTorch's generated autograd code saves an
    operand only if the other operand requires a gradient, `should_compute_output`
    guards in tools/autograd/gen_variable_type.py). Fine-tuning reads it
    (llmpar.finetune.activations)."""
    weights_only: bool = False
    """Nothing but those weight gradients keeps it: where all of `weights` are frozen
    (and no adapter reads it), it is not kept."""

    elements: float = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda self: math.prod(size for _, size in self.shape)
                              / self.divisor, takes_self=True))
    """Elements after the `divisor` (computed from the shape, never given)."""
    bytes: float = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda self: self.elements * self.bytes_per_element,
                              takes_self=True))
    """`elements` x `bytes_per_element`: computed once per tensor, since an evaluation
    reads it of every tensor many times."""

    @property
    def shape_text(self) -> str:
        return " x ".join(symbol for symbol, _ in self.shape)


@attrs.frozen(kw_only=True)
class LayerGroup:
    """`count` identical layers (dense blocks, MoE blocks) and what each one saves."""

    kind: str
    count: int
    tensors: tuple[SavedTensor, ...]

    @property
    def layer_bytes(self) -> float:
        return sum(t.bytes for t in self.tensors)

    def replace(self, tensors: tuple[SavedTensor, ...]) -> LayerGroup:
        return attrs.evolve(self, tensors=tensors)


@attrs.frozen(kw_only=True)
class ActivationInventory:
    """Saved tensors of one micro-batch: those of each kind of layer, and the rest."""

    model: str
    """The activation model that produced it."""
    groups: tuple[LayerGroup, ...]
    fixed: tuple[SavedTensor, ...] = ()
    """Embedding, final norm, output layer and loss: counted once."""
    source: str = ""
    """Where the model's rules come from, for derivations."""

    @property
    def num_layers(self) -> int:
        return sum(group.count for group in self.groups)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of its layer groups."""
        return tuple(group.kind for group in self.groups)

    @property
    def has_attention_scores(self) -> bool:
        return any(t.attention_score for g in self.groups for t in g.tensors)

    @property
    def layers_bytes(self) -> float:
        """All layers together."""
        return sum(group.count * group.layer_bytes for group in self.groups)

    @property
    def fixed_bytes(self) -> float:
        return sum(t.bytes for t in self.fixed)

    @property
    def total_bytes(self) -> float:
        return self.layers_bytes + self.fixed_bytes

    def map_layers(self, change: Callable[[LayerGroup], LayerGroup]) -> ActivationInventory:
        return attrs.evolve(self, groups=tuple(change(group) for group in self.groups))

    def for_stage(self, dense_layers: int, moe_layers: int, has_embedding: bool,
                  has_head: bool, kinds: Mapping[str, int] | None = None
                  ) -> ActivationInventory:
        """The part one pipeline stage keeps: its layers, and the embedding's or the
        output layer's tensors when it holds them; `kinds` counts the stage's layers of a
        hybrid model's kinds ("dense attention", "moe linear_attention"...)."""
        counts = {"dense": dense_layers, "moe": moe_layers, "layer": dense_layers + moe_layers}
        if kinds is not None:
            hybrid = [kind for kind in self.kinds if " " in kind]  # absent ones: none
            counts = {**counts, **dict.fromkeys(hybrid, 0), **kinds}
        groups = tuple(attrs.evolve(g, count=counts.get(g.kind, g.count)) for g in self.groups)
        places = {"embedding": has_embedding, "head": has_head, "": True}
        fixed = tuple(t for t in self.fixed if places.get(t.placement, True))
        return attrs.evolve(self, groups=groups, fixed=fixed)

    def split(self, tag: str, divisor: int) -> ActivationInventory:
        """Divide every tensor tagged `tag` by `divisor`."""

        def apply(tensors: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
            return tuple(
                attrs.evolve(t, divisor=t.divisor * divisor) if tag in t.splits else t
                for t in tensors
            )

        split = self.map_layers(lambda group: group.replace(apply(group.tensors)))
        return attrs.evolve(split, fixed=apply(self.fixed))


def drop_attention_scores(inventory: ActivationInventory) -> ActivationInventory:
    """Selective recomputation: recompute softmax and its dropout instead of keeping them.

    Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 5: drops the 5as/h term.
    """
    return inventory.map_layers(
        lambda group: group.replace(tuple(t for t in group.tensors if not t.attention_score)))


MODULE_PARENTS = {"moe_act": "moe", "shared_experts": "moe"}
"""Modules inside another: recomputing the MoE block also frees its experts' activation
outputs and its shared experts' tensors (Megatron-Core MoELayer checkpoints the router,
the dispatch, the experts and the shared experts together)."""


def freed_by(tensor: SavedTensor, modules: Collection[str]) -> bool:
    """Whether recomputing `modules` frees `tensor`: core_attn the attention scores, any
    other module the tensors tagged with it or with a module inside it."""
    if tensor.attention_score:
        return "core_attn" in modules
    module = tensor.module
    return bool(module) and (module in modules or MODULE_PARENTS.get(module) in modules)


def drop_recomputed_modules(inventory: ActivationInventory,
                            modules: Collection[str]) -> ActivationInventory:
    """Selective recomputation by module (Megatron-Core's --recompute-modules): each
    module keeps its input (a checkpoint, or a tensor kept anyway) and drops what it
    saves inside, rebuilt in the backward. With core_attn alone this is
    `drop_attention_scores`."""
    return inventory.map_layers(lambda group: group.replace(
        tuple(t for t in group.tensors if not freed_by(t, modules))))


def keep_layer_inputs(
    inventory: ActivationInventory, batch: int, sequence: int, hidden: int, dtype_bytes: float
) -> ActivationInventory:
    """Full recomputation: each layer keeps only its input, 2sbh bytes in 16-bit.

    Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 5; the input is split by
    sequence parallelism like the other tensors outside the tensor-parallel region.
    """
    checkpoint = SavedTensor(
        name="layer input",
        reason="checkpoint from which the layer is recomputed in backward",
        shape=(("b", batch), ("s", sequence), ("h", hidden)),
        bytes_per_element=dtype_bytes,
        splits=frozenset({SPLIT_SEQUENCE, SPLIT_CONTEXT}),
    )
    return inventory.map_layers(lambda group: group.replace((checkpoint,)))
