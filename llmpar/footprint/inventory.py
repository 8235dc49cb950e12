"""The activation inventory: every tensor a training forward pass keeps for backward.

Each saved tensor has a symbolic shape, a format and the reason it is kept, so
parallel strategies can split it (by the tags in `splits`), recomputation can
drop it, and a report can show which tensors dominate.
"""

from __future__ import annotations

import math

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

    @property
    def elements(self) -> float:
        return math.prod(size for _, size in self.shape) / self.divisor

    @property
    def bytes(self) -> float:
        return self.elements * self.bytes_per_element

    @property
    def shape_text(self) -> str:
        return " x ".join(symbol for symbol, _ in self.shape)


@attrs.frozen(kw_only=True)
class ActivationInventory:
    """Saved tensors of one micro-batch: those of one layer, and the rest."""

    model: str
    """The activation model that produced it."""
    per_layer: tuple[SavedTensor, ...]
    fixed: tuple[SavedTensor, ...] = ()
    """Embedding, final norm, output layer and loss: counted once."""
    num_layers: int

    @property
    def has_attention_scores(self) -> bool:
        return any(t.attention_score for t in self.per_layer)

    @property
    def layer_bytes(self) -> float:
        return sum(t.bytes for t in self.per_layer)

    @property
    def fixed_bytes(self) -> float:
        return sum(t.bytes for t in self.fixed)

    @property
    def total_bytes(self) -> float:
        return self.num_layers * self.layer_bytes + self.fixed_bytes

    def split(self, tag: str, divisor: int) -> ActivationInventory:
        """Divide every tensor tagged `tag` by `divisor`."""

        def apply(tensors: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
            return tuple(
                attrs.evolve(t, divisor=t.divisor * divisor) if tag in t.splits else t
                for t in tensors
            )

        return attrs.evolve(self, per_layer=apply(self.per_layer), fixed=apply(self.fixed))


def drop_attention_scores(inventory: ActivationInventory) -> ActivationInventory:
    """Selective recomputation: recompute softmax and its dropout instead of keeping them.

    Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 5: drops the 5as/h term.
    """
    kept = tuple(t for t in inventory.per_layer if not t.attention_score)
    return attrs.evolve(inventory, per_layer=kept)


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
    return attrs.evolve(inventory, per_layer=(checkpoint,))
