"""What a parallel strategy is, and what it hands back to the evaluator.

A strategy never reads another strategy's settings or results: it sees the spec (its
own table), the baseline footprint of one unsplit replica and the layout (every
strategy's degree, which strategies are on, where ranks sit), and returns a
`Transform`. The evaluator composes the transforms.

One formula serves one layout and many: a strategy that sets `vectorised = True` writes
its `transform` and `rules` so that they also take arrays (`llmpar.arrays`): the
settings a search varies (its own table's fields, `[training] micro_batch_size` and
`recompute`, whether another strategy is on) arrive as numpy arrays over a node of the
search, degrees stay plain integers, and every number of the Transform may be an array
of the same shape. The search then evaluates a node in one call; the contract suite
checks that the call agrees with evaluating each layout alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import attrs
import numpy as np

from llmpar.errors import Problem
from llmpar.placement import RANK_ORDER, Axis, block_stride, stride
from llmpar.spec.validators import share_below_one

if TYPE_CHECKING:
    from llmpar.footprint.baseline import Footprint
    from llmpar.spec import Spec

COMPONENTS = ("weights", "gradients", "optimizer")
"""Per-GPU model-state components a strategy can shard (activations split by tag)."""

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
COLLECTIVE_KERNELS = ("", "deepep-low-latency")
"""Kernels a collective may name (`Collective.kernel`): "" the collective library's
algorithms (`llmpar.communication.collectives`); "deepep-low-latency" DeepEP's decode
dispatch and combine, which send every routed copy straight to its expert's GPU
(`llmpar.communication.deepep`)."""

HIDING_WORK = ("compute", "attention", "last-backward", "first-forward", "layers",
               "weight-gradients", "projections")
"""The work a collective's overlapping share can run behind (`Collective.hides_behind`),
on one GPU of the slowest pipeline stage:
- "compute": any of the step's compute;
- "attention": the attention products only (ring attention's K/V exchange);
- "last-backward": the backward pass of the step's last micro-batch (the data-parallel
  gradient reduction: it starts as that pass produces the gradients);
- "first-forward": the forward pass of the step's first micro-batch (the gather of the
  weights the optimizer step updated, before their layers run again);
- "layers": every pass of every layer, each piece behind the neighbouring layer's pass
  (FSDP / ZeRO-3's per-layer gathers and reduce-scatters, prefetched one layer ahead);
- "weight-gradients": the backward pass's weight-gradient products (a tensor-parallel
  input-gradient all-reduce or reduce-scatter runs behind the weight gradient of the same
  linear layer: Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication);
- "projections": the layers' matrix products other than attention, forward and backward
  (tensor-parallel communication split into chunks, each overlapped with the product that
  produces or consumes it: Transformer Engine's userbuffers, torchtitan's AsyncTP).
Collectives that hide behind the same work share it (`llmpar.evaluation.step_time`)."""

ConfigT = TypeVar("ConfigT")


def _at_least(bound: float) -> Callable[[Any, Any, Any], None]:
    """A validator for a number or an array of numbers, each at least `bound`."""

    def check(_instance: Any, attribute: Any, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, (int, float)):
            if not value >= bound:  # NaN fails too
                raise ValueError(f"{attribute.name} must be >= {bound}, got {value!r}")
        elif not bool(np.all(np.asarray(value) >= bound)):
            raise ValueError(f"{attribute.name} must be >= {bound}, got {value!r}")

    return check


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
    A divisor of 1 changes nothing (the vectorised form states a shard everywhere and
    divides by 1 where it does not apply).
    """

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    divisor: Any = attrs.field(validator=_at_least(1))
    """A number >= 1, or an array of them."""
    reason: str


@attrs.frozen(kw_only=True)
class Copy(GroupSelection):
    """Hold `copies` of one model-state component on every GPU (DualPipe keeps two
    stages' weights on each GPU, Liu et al. 2024, arXiv:2412.19437, Sec. 3.2.1)."""

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    copies: Any = attrs.field(validator=_at_least(1))
    reason: str


@attrs.frozen(kw_only=True)
class FrozenWeights(GroupSelection):
    """The weights of another model of the trained model's architecture, held on every
    GPU beside it and never trained (a workload's frozen reference or teacher):
    `bytes_per_parameter` for each parameter of the base groups selected (adapters and
    trained copies are not part of it), divided by every shard of the trained model's
    weights, as DeepSpeed shards a second model under the same ZeRO stage-3 config and
    Megatron-Core under the same tensor and pipeline split. No gradient, no optimizer
    state, no optimizer-step traffic."""

    name: str
    """The model held ("reference"), for reports."""
    bytes_per_parameter: float = attrs.field(validator=_at_least(0))
    reason: str


@attrs.frozen(kw_only=True)
class ActivationSplit:
    """Divide the saved activations tagged `tag` by `divisor` (see the inventory)."""

    tag: str
    divisor: Any = attrs.field(validator=_at_least(1))
    """An integer >= 1, or an array of them."""
    reason: str


@attrs.frozen(kw_only=True)
class Collective:
    """One communication a step performs, as the strategy that needs it states it.

    `buffer_bytes` is the logical buffer: the tensor all-reduced, the whole tensor
    an all-gather produces or a reduce-scatter consumes, what one GPU exchanges in
    an all-to-all, or what one send carries. A collective of model states can state
    it per parameter instead (`bytes_per_parameter` with `component` and the groups):
    the evaluator multiplies by the parameters one GPU holds after every other
    strategy's shards, so strategies compose and frozen parameters reduce nothing.
    """

    strategy: str
    name: str
    """Public and documented: another strategy replaces it by this name (sequence
    parallelism replaces tensor parallelism's all-reduces); plans list it."""
    operation: str = attrs.field(validator=attrs.validators.in_(COLLECTIVES))
    buffer_bytes: Any = 0.0
    group_size: int
    group_stride: int = 1
    """Rank distance between members; with group_size it decides whether the group
    stays inside a node."""
    calls_per_step: Any = 1.0
    """0 where it does not run (the vectorised form states every collective it may)."""
    overlap: Any = 0.0
    """Share of its time that can run behind compute (0: on the critical path)."""
    hides_behind: str = attrs.field(default="compute",
                                    validator=attrs.validators.in_(HIDING_WORK))
    """The work its overlapping share runs behind (`HIDING_WORK`): "compute" (any of the
    step's), "attention" (only the attention products, as ring attention's exchange),
    "last-backward", "first-forward", "layers", "weight-gradients" or "projections"."""
    compute_share: Any = attrs.field(default=0.0, validator=share_below_one)
    """Share of the GPU's compute its kernels take while it hides (the streaming
    multiprocessors a communication kernel occupies beside the product it overlaps): each
    second it hides slows that work by this much of a second. 0 (the default): copy
    engines or a negligible share."""
    serial_seconds_per_call: Any = attrs.field(default=0.0, validator=_at_least(0.0))
    """GPU seconds each call adds on the critical path beside its transfers, as the
    kernels that run it work (a reduce-scatter done as an exchange of partial sums and
    then a local reduction kernel; the extra launches of a product decomposed into
    chunks): counted in its seconds, all of it exposed. 0 (the default): none."""
    pieces: Any = attrs.field(default=None, validator=_at_least(1))
    """The calls behind one window run in this many pieces in turn, each as soon as the
    work before it has produced (or needs) it: gradient buckets, or one layer's weights.
    One piece cannot hide (the last bucket, reduced after the backward pass ends; the
    first layer's gather, needed before any work runs), and the work before the first
    piece is ready hides nothing. None: communication and work interleave finely."""
    bucket_bytes: Any = attrs.field(default=None, validator=_at_least(1))
    """Pieces of this many bytes of the buffer (gradient buckets): the evaluator, which
    knows the buffer, takes `pieces` = buffer / bucket_bytes, at least 1."""
    reason: str = ""
    bytes_per_parameter: Any = None
    """With `component`: the buffer is this many bytes per parameter of `component` that
    one GPU holds after every other strategy's shards (and the trainable ones only,
    for gradients and optimizer states), on average over the pipeline stages, each of its
    copies (`Copy`) counted; `parameter_groups` selects the groups."""
    component: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(COMPONENTS)))
    parameter_groups: GroupSelection = GroupSelection()
    busiest_stage: bool = False
    """With `bytes_per_parameter`: the buffer counts the parameters of the pipeline stage
    that holds the most of them, not the average over the stages: a collective of groups
    only some stages hold (the embeddings and the output layer), timed on the GPUs whose
    step the others wait for."""
    kernel: str = attrs.field(default="", validator=attrs.validators.in_(COLLECTIVE_KERNELS))
    """The communication kernel that runs it (`COLLECTIVE_KERNELS`): "" (the default) the
    collective library's algorithms (NCCL, chosen per size and group), or a kernel with its
    own measured cost, such as "deepep-low-latency"."""
    overlaps_micro_batch: bool = False
    """Under two-batch overlap (`[inference] two_batch_overlap`) one micro-batch's calls
    run while the other micro-batch computes (an MoE layer's dispatch and combine,
    DeepSeek-V3 technical report, arXiv:2412.19437, Sec. 3.4)."""


def _fields_setter(cls: type) -> Callable[..., None]:
    """An `__init__` for instances of `cls` that sets the same fields with the same
    defaults as its own, without its validators: attrs' generated code for a frozen,
    slotted class of those fields (each set with `object.__setattr__`), made once."""
    fields = attrs.fields(cls)
    assert not any(a.converter or a.on_setattr or a.alias != a.name for a in fields)
    twin = attrs.make_class(f"_{cls.__name__}Fields",
                            {a.name: attrs.field(default=a.default, kw_only=True)
                             for a in fields}, frozen=True, slots=True)
    init: Callable[..., None] = vars(twin)["__init__"]
    return init


_SET_COLLECTIVE = _fields_setter(Collective)


def checked_shard(*, component: str, divisor: Any, reason: str,
                  groups: frozenset[str] | None = None,
                  excluded: frozenset[str] = frozenset()) -> Shard:
    """`Shard(...)` for fields the caller has checked already (a built-in strategy's,
    in the evaluation's hot path): the same record, without running the validators,
    which stay for the values of third-party strategies. Its parameters are the
    class's fields (tests/test_contract.py holds them equal), set one by one: the
    commonest record of an evaluation, made without a mapping of its fields."""
    shard: Shard = object.__new__(Shard)
    _set = object.__setattr__
    _set(shard, "groups", groups)
    _set(shard, "excluded", excluded)
    _set(shard, "component", component)
    _set(shard, "divisor", divisor)
    _set(shard, "reason", reason)
    return shard


def checked_collective(**fields: Any) -> Collective:
    """`Collective(**fields)` for fields the caller has checked already, as
    `checked_shard`."""
    collective: Collective = object.__new__(Collective)
    _SET_COLLECTIVE(collective, **fields)
    return collective


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
    active: Any = True
    """Where it applies: True, or a boolean array (the vectorised form)."""


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
    seconds_per_parameter: Any = attrs.field(validator=_at_least(0))
    passes_per_step: Any = attrs.field(default=1.0, validator=_at_least(0))
    overlap: Any = attrs.field(default=0.0, validator=_at_least(0))
    """Share of its time (in [0, 1]) that can run behind the GPU's compute (0: on the
    critical path)."""
    reason: str = ""


@attrs.frozen(kw_only=True)
class Stage:
    """One pipeline stage: which layers its GPUs hold, and what else."""

    index: int
    first_layer: int
    num_layers: int
    has_embedding: bool
    has_head: bool
    micro_batches_in_flight: Any
    """Micro-batches whose activations the stage holds at its peak (a number, or an
    array in the vectorised form)."""
    head_micro_batches_in_flight: Any = None
    """Micro-batches whose output-layer and loss tensors the stage holds then, where the
    schedule holds fewer of them than of its layers' (the interleaved schedule's last
    rank: only its last chunk computes the loss); None: `micro_batches_in_flight`."""
    mirror: Stage | None = None
    """A second stage the same GPUs hold, with its own layers and micro-batches in
    flight: DualPipe's rank i holds stage i and its mirror p-1-i (DeepSeek-V3 report,
    arXiv:2412.19437, Sec. 3.2.1). Its parameters and activations add to this stage's,
    its work shares the rank's time. None: the stage is all its GPUs hold."""

    @property
    def mirror_share(self) -> float:
        """The mirror's micro-batches in flight over this stage's: what its activations
        of one micro-batch count for beside this stage's (0 without a mirror)."""
        if self.mirror is None:
            return 0.0
        return float(self.mirror.micro_batches_in_flight) / float(self.micro_batches_in_flight)


@attrs.frozen(kw_only=True)
class ProductSplit:
    """How a strategy splits the matrix products one GPU runs (the shapes that
    `llmpar.evaluation.matmuls` costs). Each field is a factor; the evaluator
    multiplies the factors of every transform."""

    width: int = 1
    """Attention heads, the MLP's inner width and the vocabulary, split this many ways
    (column- and row-parallel products: tensor parallelism)."""
    tokens: int = 1
    """Tokens per GPU divided this many ways (context parallelism)."""
    attention_steps: Any = 1
    """Attention kernels per layer and pass, each over 1/steps of the keys (ring
    attention: one per ring step); 1 with `tokens` > 1 means attention runs over the
    whole sequence for 1/tokens of the heads (all-to-all)."""
    experts: int = 1
    """Routed experts per GPU divided this many ways (expert parallelism)."""
    expert_width: int | None = None
    """Ranks each routed expert's matrices split over, when not `width`."""


@attrs.frozen(kw_only=True)
class Transform:
    """One strategy's effect on one GPU's memory, compute and communication.

    Every field defaults to "no effect", so degree 1 of any strategy is the
    identity and a strategy states only what it changes. Sizes, FLOPs and times are
    >= 0, divisors and copies >= 1; the evaluator checks every transform before it
    composes them.
    """

    strategy: str
    shards: tuple[Shard, ...] = ()
    copies: tuple[Copy, ...] = ()
    """Model-state components held more than once on a GPU."""
    activation_splits: tuple[ActivationSplit, ...] = ()
    added_activation_bytes: Any = 0.0
    """Activation bytes the strategy adds per micro-batch in flight on one GPU (its own
    buffers kept for backward), after splits."""
    stages: tuple[Stage, ...] = ()
    """Pipeline stages; empty means one stage holding everything."""
    micro_batches_per_step: Any = None
    """Micro-batches each replica runs per optimizer step (gradient accumulation)."""
    collectives: tuple[Collective, ...] = ()
    replaces: tuple[str, ...] = ()
    """Names of other strategies' collectives this one's replace."""
    replaces_where: Any = True
    """Where the replacement holds: True, or a boolean array (the vectorised form)."""
    extra_flops_per_step: Any = 0.0
    """Hardware FLOPs beyond the model's (recomputation), all GPUs together."""
    frozen_weights: tuple[FrozenWeights, ...] = ()
    """Other models' weights held beside the trained one (a workload's, `llmpar.workload`):
    counted in `weights_bytes`, outside gradients, optimizer states and their traffic."""
    model_flops_per_step: Any = 0.0
    """FLOPs of the step's other models (a workload's frozen reference forward), all GPUs
    together: counted in the model FLOPs (`flops_per_step`, MFU) and executed."""
    skipped_flops_per_step: Any = 0.0
    """Hardware FLOPs of the model's that are not run (frozen weights' gradient
    products), all GPUs together; at most the model's."""
    bubble_fraction: Any = 0.0
    """Idle time as a share of compute time (pipeline bubble)."""
    busiest_rank_extra_work: Any = 0.0
    """Work the busiest rank does beyond the average, as a share of the step's executed
    FLOPs (uneven expert load: every rank waits for the busiest one); >= 0. The matrix
    products take (1 + the sum over strategies) as long; the FLOPs do not change."""
    buffer_bytes: Any = 0.0
    """Extra per-GPU memory the strategy needs (gathered weights, communication)."""
    offloads: tuple[Offload, ...] = ()
    """Model-state components kept in host memory instead of on the GPU."""
    host_work: tuple[HostWork, ...] = ()
    """Per-step work on model states outside the GPU (host-link copies, CPU updates)."""
    product_split: ProductSplit | None = None
    """How it splits each GPU's matrix products (None: not at all)."""
    notes: tuple[str, ...] = ()
    """What the strategy did, for reports."""
    warnings: tuple[str, ...] = ()
    """What the user should know: a large bubble, a group that spans nodes..."""
    mechanisms: tuple[str, ...] = ()
    """The mechanisms of this transform that validation rows check on their own
    ("zero-3", "hybrid-sharding", "zero++", "dualpipe", "tp-comm-overlap": the `mechanism`
    of rows under
    validation/published/): the plan's step-time trust quotes their families' errors
    beside the general one (`llmpar.trust`). "activation-offload", a training setting
    rather than a layout's, is added by the evaluation itself
    (`llmpar.evaluation.evaluate.offload_mechanisms`)."""


@attrs.frozen(kw_only=True)
class Layout:
    """The degree of every active strategy, the GPUs they multiply to, which
    strategies are on, and where ranks sit."""

    degrees: Mapping[str, int]
    num_gpus: int
    order: tuple[str, ...] = RANK_ORDER
    """Placement of ranks, innermost first (`[parallel] order`)."""
    active: Mapping[str, Any] = attrs.field(factory=dict)
    """Strategies whose table is in the spec and switched on (`Strategy.active`): True,
    or a boolean array over the layouts of a search node."""
    nested: frozenset[str] = frozenset()
    """Axes whose ranks are other axes' ranks (`Axis.nested`; the session fills it from
    the strategies' declarations)."""
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    """Settings strategies share with the others (`Strategy.shared_settings`), by
    "<strategy>.<name>": `"data.zero_stage"`; a value, or an array over a search node."""

    def degree(self, strategy: str) -> int:
        """Degree of `strategy`; 1 when it is not in the layout."""
        return self.degrees.get(strategy, 1)

    def setting(self, key: str, default: Any = None) -> Any:
        """A setting another strategy shares (`Strategy.shared_settings`), or `default`."""
        return self.settings.get(key, default)

    def is_active(self, strategy: str) -> Any:
        """Whether `strategy`'s table is in the spec and on (an array when it varies)."""
        return self.active.get(strategy, False)

    def stride(self, strategy: str) -> int:
        """Rank distance between members of `strategy`'s group under `order`
        (llmpar.placement.stride): the product of the degrees placed inside it,
        nested axes excepted."""
        return stride(self.order, self.degrees, strategy, self.nested)

    def block_stride(self, strategies: Sequence[str]) -> int:
        """Where the block of ranks of adjacent `strategies` starts: the stride of its
        innermost one (data x context: `("data", "context")`)."""
        return block_stride(self.order, self.degrees, strategies, self.nested)


@attrs.frozen(kw_only=True)
class StrategyContext:
    """What a strategy may look at when it makes its transform."""

    spec: Spec
    footprint: Footprint
    layout: Layout

    @property
    def trainable_by_group(self) -> Mapping[str, float]:
        """Parameters that get gradients and optimizer states, by group (every
        parameter in pre-training)."""
        return self.footprint.trainable_by_group

    def trainable_in(self, stage: Stage) -> Mapping[str, float]:
        """The trainable parameters one pipeline stage holds, by group, before any
        strategy's shards (`llmpar.evaluation.stages.stage_parameters`)."""
        from llmpar.evaluation.stages import stage_parameters  # it imports this module

        held = stage_parameters(self.spec, self.footprint, stage)
        tuned = self.footprint.finetune
        if tuned is not None:  # frozen layer ranges make it depend on the stage's layers
            from llmpar.finetune.trainable import trainable_held

            return trainable_held(self.spec.model, tuned, stage, held)
        trainable = self.trainable_by_group
        total = self.footprint.parameters_by_group
        return {group: count * (trainable.get(group, 0.0) / total[group] if total[group] else 0.0)
                for group, count in held.items()}


@attrs.frozen(kw_only=True)
class ForwardStep:
    """One forward step of serving on one GPU, for the strategies' serving collectives."""

    phase: str
    """"prefill" (the prompts) or "decode" (one token per sequence)."""
    tokens: float
    """New tokens this GPU's projections process."""
    rows: float
    """Sequences whose next token the step samples."""


@attrs.frozen
class Rule:
    """One check of a strategy: `fails` (a bool, or a boolean array in the vectorised
    form) and, where it fails, the problem at `path` that `message()` words for one
    layout (quoting every operand)."""

    path: str
    fails: Any
    message: Callable[[], str]


def problems_of(rules: Sequence[Rule]) -> list[Problem]:
    """The problems of the rules that fail (one layout: plain booleans)."""
    return [Problem(rule.path, rule.message()) for rule in rules if bool(rule.fails)]


class Strategy(Generic[ConfigT]):
    """Base class for parallel strategies, built-in or third-party.

    Subclasses set `name` (the `[parallel.<name>]` table), `config_type` (an
    attrs class: the table's schema, every field with a default) and `phase`
    (the evaluator applies strategies by phase, then name, never by plugin
    order), and override what they change. A strategy whose degree places ranks
    declares its `axis`; one whose `transform` and `rules` take arrays sets
    `vectorised` (see the module docstring).
    """

    name: ClassVar[str]
    config_type: ClassVar[type[Any]]
    phase: ClassVar[int] = 100
    always_active: ClassVar[bool] = False
    """Active even when the spec has no table for it (data parallelism)."""
    multiplies_gpus: ClassVar[bool] = True
    """Whether its degree multiplies the GPU count (expert parallelism instead
    splits ranks the other strategies already count)."""
    axis: ClassVar[Axis | None] = None
    """Where its ranks sit in `[parallel] order`; None for a strategy whose degree does
    not place ranks of its own (it sits outside every declared axis)."""
    vectorised: ClassVar[bool] = False
    """`transform` and `rules` take arrays (the fast form the search uses)."""

    def degree(self, config: ConfigT) -> int:
        """This strategy's degree; -1 takes every GPU the others leave."""
        return int(getattr(config, "degree", 1))

    def side_degrees(self, config: ConfigT) -> Mapping[str, int]:
        """Further degrees the layout should carry for other strategies to see, named
        (expert parallelism's expert tensor degree); none by default."""
        return {}

    def shared_settings(self, config: ConfigT) -> Mapping[str, Any]:
        """Settings of its table other strategies may read through `Layout.setting`,
        keyed "<name>.<setting>" (data parallelism shares its ZeRO stage); none by
        default. They may be arrays in the fast form."""
        return {}

    def active(self, config: ConfigT) -> Any:
        """Whether the table, when present, switches the strategy on (sequence
        parallelism's `enabled`); True by default."""
        return True

    def rules(self, config: ConfigT, spec: Spec, layout: Layout) -> Sequence[Rule] | None:
        """The checks of this strategy with the rest of the spec, as rules (see `Rule`);
        None: the strategy states them only in `check`."""
        return None

    def check(self, config: ConfigT, spec: Spec, layout: Layout) -> list[Problem]:
        """Problems of this strategy with the rest of the spec; quote every operand.
        The default words the failing `rules`."""
        rules = self.rules(config, spec, layout)
        return [] if rules is None else problems_of(rules)

    def transform(self, config: ConfigT, ctx: StrategyContext) -> Transform:
        """This strategy's effect; the default is the identity."""
        return Transform(strategy=self.name)

    def serving_collectives(self, config: ConfigT, ctx: StrategyContext,
                            step: ForwardStep) -> tuple[Collective, ...]:
        """The communication one forward step of serving needs (calls per step); none
        by default. `Collective.overlap` with `hides_behind = "attention"` runs behind
        the step's attention."""
        return ()

    def neutral_config(self, layout: Layout) -> ConfigT | None:
        """A config under which this strategy changes nothing among the other
        strategies' degrees `layout`: memory, FLOPs and communication equal those of the
        spec without its table; None where no config does. The contract suite
        (`llmpar.testing`) checks it. Default: the default config with `degree = 1`
        when the schema has a degree, else the default config; override when that is
        not neutral (a flag that is on by default)."""
        config = self.config_type()
        if "degree" in attrs.fields_dict(self.config_type):
            return attrs.evolve(config, degree=1)  # type: ignore[no-any-return]
        return config  # type: ignore[no-any-return]


def fast_capable(strategy: Strategy[Any]) -> bool:
    """Whether the search can evaluate the strategy over a node at once: it is
    vectorised, and its checks are rules (or it has none)."""
    if not strategy.vectorised:
        return False
    overrides_check = type(strategy).check is not Strategy.check
    return not overrides_check
