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
from llmpar.placement import EXPERT_TENSOR, RANK_ORDER, stride

if TYPE_CHECKING:
    from llmpar.footprint.baseline import Footprint
    from llmpar.spec import Spec

COMPONENTS = ("weights", "gradients", "optimizer")
"""Per-GPU model-state components a strategy can shard (activations split by tag)."""

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
HIDING_WORK = ("compute", "attention")

@attrs.frozen(kw_only=True)
class GroupSelection:
    """Which parameter groups ("attention", "experts"...) something applies to: those
    in `groups` (None: every group) except those in `excluded`. A model given only by
    its size has one group, "all"."""

    groups: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()
    """Groups it leaves alone even when `groups` is None."""

    def applies_to(self, group: str) -> bool:
        return (self.groups is None or group in self.groups) and group not in self.excluded


@attrs.frozen(kw_only=True)
class Shard(GroupSelection):
    """Divide one model-state component by `divisor` on every GPU.

    `groups` names the parameter groups it applies to ("attention", "experts"...);
    None applies to every group. A model given only by its size has one group.
    """

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    divisor: float = attrs.field(validator=attrs.validators.gt(0))
    reason: str


@attrs.frozen(kw_only=True)
class ActivationSplit:
    """Divide the saved activations tagged `tag` by `divisor` (see the inventory)."""

    tag: str
    divisor: int = attrs.field(validator=attrs.validators.ge(1))
    reason: str


@attrs.frozen(kw_only=True)
class Collective:
    """One communication a step performs, as the strategy that needs it states it.

    `buffer_bytes` is the logical buffer: the tensor all-reduced, the whole tensor
    an all-gather produces or a reduce-scatter consumes, what one GPU exchanges in
    an all-to-all, or what one send carries.
    """

    strategy: str
    name: str
    """Identifies it, so another strategy can replace it (sequence parallelism
    replaces tensor parallelism's all-reduces)."""
    operation: str = attrs.field(validator=attrs.validators.in_(COLLECTIVES))
    buffer_bytes: float
    group_size: int
    group_stride: int = 1
    """Rank distance between members; with group_size it decides whether the group
    stays inside a node."""
    calls_per_step: float = 1.0
    overlap: float = 0.0
    """Share of its time that can run behind compute (0: on the critical path)."""
    hides_behind: str = attrs.field(default="compute",
                                    validator=attrs.validators.in_(HIDING_WORK))
    """The work its overlapping share runs behind: "compute" (any of the step's) or
    "attention" (only the attention products, as ring attention's exchange)."""
    reason: str = ""


@attrs.frozen(kw_only=True)
class Offload(GroupSelection):
    """Keep one model-state component in host (CPU) memory instead of GPU memory.

    Its bytes on each GPU, after every strategy's shards, leave the GPU's total and
    count in the plan's `host_bytes` (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840;
    ZeRO-Infinity, Rajbhandari et al. 2021, arXiv:2104.07857). The time it costs is
    stated apart, as `HostWork`.
    """

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    reason: str


@attrs.frozen(kw_only=True)
class HostWork:
    """Work of each step on one GPU's share of a model-state component, done outside the
    GPU's compute: copying it over the host link, or updating it on the host's CPU.

    seconds = passes_per_step * P * seconds_per_parameter, where P is the parameters of
    `component` one GPU holds after every strategy's shards (the evaluator knows P; the
    strategy states the cost per parameter, e.g. bytes per parameter / link bandwidth).
    """

    strategy: str
    name: str
    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    seconds_per_parameter: float = attrs.field(validator=attrs.validators.ge(0))
    passes_per_step: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    overlap: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0),
                                                         attrs.validators.le(1)])
    """Share of its time that can run behind the GPU's compute (0: on the critical path)."""
    reason: str = ""


@attrs.frozen(kw_only=True)
class Stage:
    """One pipeline stage: which layers its GPUs hold, and what else."""

    index: int
    first_layer: int
    num_layers: int
    has_embedding: bool
    has_head: bool
    micro_batches_in_flight: float
    """Micro-batches whose activations the stage holds at its peak."""


@attrs.frozen(kw_only=True)
class Transform:
    """One strategy's effect on one GPU's memory, compute and communication.

    Every field defaults to "no effect", so degree 1 of any strategy is the
    identity and a strategy states only what it changes.
    """

    strategy: str
    shards: tuple[Shard, ...] = ()
    activation_splits: tuple[ActivationSplit, ...] = ()
    stages: tuple[Stage, ...] = ()
    """Pipeline stages; empty means one stage holding everything."""
    micro_batches_per_step: int | None = None
    """Micro-batches each replica runs per optimizer step (gradient accumulation)."""
    collectives: tuple[Collective, ...] = ()
    replaces: tuple[str, ...] = ()
    """Names of other strategies' collectives this one's replace."""
    extra_flops_per_step: float = 0.0
    """Hardware FLOPs beyond the model's (recomputation), all GPUs together."""
    bubble_fraction: float = 0.0
    """Idle time as a share of compute time (pipeline bubble)."""
    buffer_bytes: float = 0.0
    """Extra per-GPU memory the strategy needs (gathered weights, communication)."""
    offloads: tuple[Offload, ...] = ()
    """Model-state components kept in host memory instead of on the GPU."""
    host_work: tuple[HostWork, ...] = ()
    """Per-step work on model states outside the GPU (host-link copies, CPU updates)."""
    notes: tuple[str, ...] = ()
    """What the strategy did, for reports."""
    warnings: tuple[str, ...] = ()
    """What the user should know: a large bubble, a group that spans nodes..."""


@attrs.frozen(kw_only=True)
class Layout:
    """The degree of every active strategy, and the GPUs they multiply to."""

    degrees: Mapping[str, int]
    num_gpus: int
    order: tuple[str, ...] = RANK_ORDER
    """Placement of ranks, innermost first (`[parallel] order`)."""

    def degree(self, strategy: str) -> int:
        """Degree of `strategy`; 1 when it is not in the layout."""
        return self.degrees.get(strategy, 1)

    @property
    def expert_tensor(self) -> int:
        """Ranks each routed expert is split over: `[parallel.expert] tensor_degree`,
        by default the tensor degree."""
        return self.degrees.get(EXPERT_TENSOR, self.degree("tensor"))

    def stride(self, strategy: str) -> int:
        """Rank distance between members of `strategy`'s group under `order`
        (llmpar.placement.stride): the product of the degrees placed inside it. The
        expert group is carved out of the data x context ranks, so it starts where
        they start."""
        return stride(self.order, self.degrees, strategy)


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
    multiplies_gpus: ClassVar[bool] = True
    """Whether its degree multiplies the GPU count (expert parallelism instead
    splits ranks the other strategies already count)."""

    def degree(self, config: Any) -> int:
        """This strategy's degree; -1 takes every GPU the others leave."""
        return int(getattr(config, "degree", 1))

    def side_degrees(self, config: Any) -> Mapping[str, int]:
        """Further degrees the layout should carry for other strategies to see, named
        (expert parallelism's expert tensor degree); none by default."""
        return {}

    def check(self, config: Any, spec: Spec, layout: Layout) -> list[Problem]:
        """Problems of this strategy with the rest of the spec; quote every operand."""
        return []

    def transform(self, config: Any, ctx: StrategyContext) -> Transform:
        """This strategy's effect; the default is the identity."""
        return Transform(strategy=self.name)

    def neutral_config(self, layout: Layout) -> Any | None:
        """A config under which this strategy changes nothing among the other
        strategies' degrees `layout`: memory, FLOPs and communication equal those of the
        spec without its table; None where no config does. The contract suite
        (`llmpar.testing`) checks it. Default: the default config with `degree = 1`
        when the schema has a degree, else the default config; override when that is
        not neutral (a flag that is on by default)."""
        config = self.config_type()
        if "degree" in attrs.fields_dict(self.config_type):
            return attrs.evolve(config, degree=1)
        return config
