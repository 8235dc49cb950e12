"""What a parallel strategy is, and what it hands back to the evaluator.

A strategy never reads another strategy's settings or results: it sees the spec,
the baseline footprint of one unsplit replica and the layout (every strategy's
degree), and returns a `Transform`. The evaluator composes the transforms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from llmpar.errors import Problem

if TYPE_CHECKING:
    from llmpar.footprint.baseline import Footprint
    from llmpar.spec import Spec

COMPONENTS = ("weights", "gradients", "optimizer", "activations")
"""Per-GPU memory components a strategy can shard."""

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")


@attrs.frozen(kw_only=True)
class Shard:
    """Divide one memory component by `divisor` on every GPU."""

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    divisor: int = attrs.field(validator=attrs.validators.ge(1))
    reason: str


@attrs.frozen(kw_only=True)
class ActivationSplit:
    """Divide the saved activations tagged `tag` by `divisor` (see the inventory)."""

    tag: str
    divisor: int = attrs.field(validator=attrs.validators.ge(1))
    reason: str


@attrs.frozen(kw_only=True)
class Collective:
    """One communication a step performs, as the strategy that needs it states it."""

    strategy: str
    operation: str = attrs.field(validator=attrs.validators.in_(COLLECTIVES))
    buffer_bytes: int
    """Size of the buffer each GPU contributes to one call."""
    group_size: int
    calls_per_step: float = 1.0
    overlapped: bool = False
    """Whether it can run behind compute."""
    reason: str = ""


@attrs.frozen(kw_only=True)
class Transform:
    """One strategy's effect on one GPU's memory, compute and communication.

    Every field defaults to "no effect", so degree 1 of any strategy is the
    identity and a strategy states only what it changes.
    """

    strategy: str
    shards: tuple[Shard, ...] = ()
    activation_splits: tuple[ActivationSplit, ...] = ()
    micro_batches_in_flight: float = 1.0
    """Micro-batches whose activations one GPU holds at its peak (pipelining)."""
    micro_batches_per_step: int | None = None
    """Micro-batches each replica runs per optimizer step (gradient accumulation)."""
    collectives: tuple[Collective, ...] = ()
    extra_flops_per_step: float = 0.0
    """Hardware FLOPs beyond the model's (recomputation), all GPUs together."""
    idle_fraction: float = 0.0
    """Share of a step a GPU waits (pipeline bubble)."""
    buffer_bytes: int = 0
    """Extra per-GPU memory the strategy needs (communication buffers)."""
    notes: tuple[str, ...] = ()
    """What the strategy did, for reports."""
    warnings: tuple[str, ...] = ()
    """What the user should know: a large bubble, a group that spans nodes..."""


@attrs.frozen(kw_only=True)
class Layout:
    """The degree of every active strategy, and the GPUs they multiply to."""

    degrees: Mapping[str, int]
    num_gpus: int

    def degree(self, strategy: str) -> int:
        """Degree of `strategy`; 1 when it is not in the layout."""
        return self.degrees.get(strategy, 1)


@attrs.frozen(kw_only=True)
class StrategyContext:
    """What a strategy may look at when it makes its transform."""

    spec: Spec
    footprint: Footprint
    layout: Layout


class Strategy:
    """Base class for parallel strategies, built-in or third-party.

    Subclasses set `name` (the `[parallel.<name>]` table), `config_type` (an
    attrs class: the table's schema, every field with a default) and `phase`
    (the evaluator applies strategies by phase, then name, never by plugin
    order), and override what they change.
    """

    name: ClassVar[str]
    config_type: ClassVar[type]
    phase: ClassVar[int] = 100
    always_active: ClassVar[bool] = False
    """Active even when the spec has no table for it (data parallelism)."""

    def degree(self, config: Any) -> int:
        """GPUs this strategy multiplies the layout by; -1 takes what is left."""
        return int(getattr(config, "degree", 1))

    def check(self, config: Any, spec: Spec, layout: Layout) -> list[Problem]:
        """Problems of this strategy with the rest of the spec; quote every operand."""
        return []

    def transform(self, config: Any, ctx: StrategyContext) -> Transform:
        """This strategy's effect; the default is the identity."""
        return Transform(strategy=self.name)
