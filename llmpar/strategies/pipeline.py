"""Pipeline parallelism: consecutive layers on consecutive stages.

Schedules and their idle time (bubble) as a share of compute, with p stages, m
micro-batches per step and v virtual stages per GPU:
- "gpipe" (Huang et al. 2019, arXiv:1811.06965): bubble (p-1)/m; every stage holds
  all m micro-batches' activations.
- "1f1b" (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2.1):
  bubble (p-1)/m; stage i holds min(m, p-i) micro-batches.
- "interleaved" (same paper, Sec. 2.2.2): bubble (p-1)/(v*m); the first stage
  holds 1 + (p-1)/(p*v) times the activations of 1F1B's (Korthikanti et al. 2022,
  Sec. 4.2.3), the others scaled alike.
- "zero-bubble" (ZB-H1, Qi et al. 2023, arXiv:2401.10241, Sec. 3): splitting the
  weight-gradient pass fills a third of 1F1B's bubble: (p-1)/(3m), at 1F1B's memory.
The first stage holds the embedding, the last the output layer (and the embedding
too when they are tied, to keep the tied gradient in sync, as Megatron-LM does).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

import attrs

from llmpar.arrays import is_array, logical_and, logical_not, logical_or, maximum, minimum, where
from llmpar.dtypes import bytes_per_element
from llmpar.hookspecs import hookimpl
from llmpar.loading.limits import MAX_STAGES
from llmpar.placement import Axis
from llmpar.search.dimension import Point, SearchDimension, divisors
from llmpar.spec import Spec
from llmpar.spec.validators import one_of, positive
from llmpar.strategies.common import (
    hidden_state_bytes,
    micro_batches_per_step,
    sequence_parallel,
)
from llmpar.strategy import (
    Collective,
    ForwardStep,
    Layout,
    Rule,
    Stage,
    Strategy,
    StrategyContext,
    Transform,
)

Schedule = Literal["1f1b", "interleaved", "gpipe", "zero-bubble"]
SCHEDULES: tuple[Schedule, ...] = typing.get_args(Schedule)
SEND_RECV = "pipeline.send-recv"
"""Activations to the next stage (forward) and their gradients back (backward)."""
SERVING_SEND = "pipeline.serving-send"
"""Serving: the hidden states to the next stage, once per boundary and forward step."""
BOUNDARY_ALL_GATHER = "pipeline.boundary-all-gather"
"""Rebuilds a received boundary tensor from its 1/t slices (scatter-gather)."""


@attrs.frozen(kw_only=True)
class PipelineConfig:
    """`[parallel.pipeline]`."""

    degree: int = attrs.field(default=1, validator=positive)
    """Stages."""
    schedule: Schedule = attrs.field(default="1f1b", validator=one_of(*SCHEDULES))
    """"1f1b", "interleaved" (with virtual_stages), "gpipe" or "zero-bubble" (ZB-H1)."""
    virtual_stages: int = attrs.field(default=1, validator=positive)
    """Model chunks per GPU for the interleaved schedule (v)."""
    layers_per_stage: tuple[int, ...] | None = None
    """Uneven split, one count per stage; default: equal."""
    scatter_gather: bool = True
    """Without sequence parallelism, send each tensor rank's 1/t slice of the boundary
    activations and all-gather them inside the next stage's tensor group (Narayanan et
    al. 2021, arXiv:2104.04473, Sec. 4.1, Megatron-LM's default); false: every tensor
    rank sends the whole tensor. With sequence parallelism the slice is what is sent
    anyway."""
    overlap_p2p: bool = False
    """Send one micro-batch's activations (and gradients) while the stage computes another
    (Megatron-Core's `overlap_p2p_comm` with batched isend/irecv; torchtitan's
    PipelineSchedule posts its sends asynchronously): the sends hide behind compute, but
    for the two at the ends of the step (the first forward receive, the last backward
    send), which nothing runs beside. False (the default): every send on the critical
    path, as llmpar has modelled it so far."""


def bubble_fraction(config: PipelineConfig, m: Any) -> Any:
    """Idle time over compute time, per schedule (see the module docstring)."""
    p = config.degree
    if p == 1:
        return 0.0
    schedule = config.schedule
    return where(schedule == "interleaved", (p - 1) / (config.virtual_stages * m),
                 where(schedule == "zero-bubble", (p - 1) / (3 * m), (p - 1) / m))


def in_flight(config: PipelineConfig, stage: int, m: Any) -> Any:
    """Micro-batches whose activations stage `stage` holds at its peak."""
    p, v, schedule = config.degree, config.virtual_stages, config.schedule
    if isinstance(schedule, str) and not is_array(m):  # one layout: Python's arithmetic
        if schedule == "gpipe":
            return float(m)
        factor = 1 + (p - 1) / (p * v) if schedule == "interleaved" else 1.0
        return min(m, p - stage) * factor
    held = minimum(m, p - stage) * where(schedule == "interleaved", 1 + (p - 1) / (p * v), 1.0)
    return where(schedule == "gpipe", m, held) * 1.0


def stage_layer_counts(config: PipelineConfig, num_layers: int) -> tuple[int, ...]:
    if config.layers_per_stage is not None:
        return config.layers_per_stage
    return (num_layers // config.degree,) * config.degree


class PipelineParallel(Strategy[PipelineConfig]):
    name = "pipeline"
    config_type = PipelineConfig
    phase = 40
    axis = Axis(token="pp", rank=50)
    vectorised = True

    def rules(self, config: PipelineConfig, spec: Spec, layout: Layout) -> list[Rule]:
        p, v, layers = config.degree, config.virtual_stages, spec.model.num_layers
        path = "$.parallel.pipeline"
        if p > 1 and layers is None:
            return [Rule(f"{path}.degree", True,
                         lambda: "pipeline stages need model.num_layers")]
        found = [Rule(f"{path}.degree", p > MAX_STAGES,
                      lambda: f"at most {MAX_STAGES:,} stages (llmpar's limit on the stages "
                              f"a plan lists), got {p:,}")]
        counts = config.layers_per_stage
        if counts is not None:
            found += [
                Rule(f"{path}.layers_per_stage",
                     len(counts) != p or layers is not None and sum(counts) != layers,
                     lambda: f"needs {p} counts summing to model.num_layers ({layers}); got "
                             f"{list(counts)} (sum {sum(counts)})"),
                Rule(f"{path}.layers_per_stage", any(count < 1 for count in counts),
                     lambda: f"every stage needs a layer; got {list(counts)}")]
        elif layers is not None:
            found.append(Rule(f"{path}.degree", layers % (p * v) != 0,
                              lambda: f"model.num_layers ({layers}) must be divisible by "
                                      f"degree ({p}) x virtual_stages ({v}) = {p * v}, or give "
                                      "layers_per_stage"))
        interleaved = config.schedule == "interleaved"
        found.append(Rule(f"{path}.virtual_stages", logical_and(logical_not(interleaved),
                                                                  v != 1),
                          lambda: f"virtual_stages ({v}) needs schedule = 'interleaved'"))
        m = micro_batches_per_step(spec, layout)
        found.append(Rule(f"{path}.schedule", logical_and(interleaved, (m % p != 0) & (p > 1)),
                          lambda: f"the interleaved schedule needs micro-batches per step "
                                  f"({m}) to be a multiple of the pipeline degree ({p})"))
        return found

    def transform(self, config: PipelineConfig, ctx: StrategyContext) -> Transform:
        p = config.degree
        if p == 1:
            return Transform(strategy=self.name)
        spec, layout = ctx.spec, ctx.layout
        m = micro_batches_per_step(spec, layout)
        stages, first = [], 0
        tied = spec.model.tie_embeddings
        for index, count in enumerate(stage_layer_counts(config, spec.model.num_layers or p)):
            last = index == p - 1
            stages.append(Stage(index=index, first_layer=first, num_layers=count,
                                has_embedding=index == 0 or (last and tied), has_head=last,
                                micro_batches_in_flight=in_flight(config, index, m)))
            first += count
        bubble = bubble_fraction(config, m)
        warnings = [f"pipeline bubble is {bubble:.0%} of compute time (p = {p}, m = {m})"
                    ] if not is_array(bubble) and bubble > 0.2 else []
        calls = 2 * m * config.virtual_stages  # forward activations, backward gradients
        sends = Collective(strategy=self.name, name=SEND_RECV, operation="send-recv",
                           buffer_bytes=self._boundary_bytes(config, ctx), group_size=2,
                           group_stride=layout.stride(self.name), calls_per_step=calls,
                           reason="activations forward and their gradients backward, per "
                                  "micro-batch and stage boundary" + (
                                      ", behind another micro-batch's compute"
                                      if config.overlap_p2p else ""),
                           **_overlapped_sends(config, calls))
        return Transform(strategy=self.name, stages=tuple(stages), bubble_fraction=bubble,
                         collectives=(sends, *self._gathers(config, ctx, calls)),
                         warnings=tuple(warnings))

    def serving_collectives(self, config: PipelineConfig, ctx: StrategyContext,
                            step: ForwardStep) -> tuple[Collective, ...]:
        """p - 1 hand-offs of the hidden states, one per stage boundary, on the critical
        path (stages run the step one after another: no interleaving of micro-batches)."""
        p, model = config.degree, ctx.spec.model
        if p == 1:
            return ()
        assert model.hidden_size is not None
        act = bytes_per_element(ctx.spec.precision.activations)
        return (Collective(strategy=self.name, name=SERVING_SEND, operation="send-recv",
                           buffer_bytes=step.tokens * model.hidden_size * act, group_size=2,
                           group_stride=ctx.layout.stride(self.name), calls_per_step=p - 1,
                           reason=f"{step.phase}: hidden states to the next stage"),)

    def _boundary_bytes(self, config: PipelineConfig, ctx: StrategyContext) -> Any:
        size = hidden_state_bytes(ctx.spec, ctx.layout)
        sliced = logical_or(sequence_parallel(ctx.layout), config.scatter_gather)
        return size / where(sliced, ctx.layout.degree("tensor"), 1)

    def _gathers(self, config: PipelineConfig, ctx: StrategyContext,
                 calls: Any) -> tuple[Collective, ...]:
        """The receiving tensor group rebuilds the whole tensor from the slices (with
        sequence parallelism the next layer's own all-gather does that)."""
        t = ctx.layout.degree("tensor")
        if t == 1 or not config.scatter_gather:
            return ()
        return (Collective(strategy=self.name, name=BOUNDARY_ALL_GATHER,
                           operation="all-gather",
                           buffer_bytes=hidden_state_bytes(ctx.spec, ctx.layout), group_size=t,
                           group_stride=ctx.layout.stride("tensor"),
                           calls_per_step=where(sequence_parallel(ctx.layout), 0.0, calls),
                           reason="rebuild the received boundary tensor from its slices"),)


def _overlapped_sends(config: PipelineConfig, calls: Any) -> dict[str, Any]:
    """With `overlap_p2p`, the step's sends hide behind compute in `calls / 2` pieces:
    one forward and one backward send (a piece) wait with nothing beside them."""
    if not config.overlap_p2p:
        return {}
    return dict(overlap=1.0, hides_behind="compute", pieces=maximum(calls / 2, 1))


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(PipelineParallel())


def balanced_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage when `stages` does not divide `num_layers`: as even as
    possible, with the shorter stages at the ends, where the embedding and the
    output layer sit (Megatron-LM's --decoder-first/last-pipeline-num-layers)."""
    base, extra = divmod(num_layers, stages)
    ends = [i // 2 if i % 2 == 0 else stages - 1 - i // 2 for i in range(stages)]
    short = set(ends[: stages - extra])
    return tuple(base if index in short else base + 1 for index in range(stages))


def _schedules(point: Point) -> tuple[Schedule, ...]:
    return SCHEDULES if point.degree("pipeline") > 1 else (PipelineConfig().schedule,)


def _virtual_stages(point: Point) -> tuple[int, ...]:
    p, layers = point.degree("pipeline"), point.spec.model.num_layers
    if point.fields["schedule"] != "interleaved":
        return (1,)
    if layers is None or layers % p:
        return ()
    return tuple(v for v in divisors(layers // p) if v > 1)


def _layer_splits(point: Point) -> tuple[tuple[int, ...] | None, ...]:
    p, layers = point.degree("pipeline"), point.spec.model.num_layers
    v = point.fields["virtual_stages"]
    if layers is None or layers % (p * v) == 0 or p > layers or v > 1:
        return (None,)
    return (balanced_layers(layers, p),)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="pipeline", field="degree",
                             description="every divisor of the GPU count"))
    register(SearchDimension(strategy="pipeline", field="schedule", values=_schedules,
                             description="every schedule, when the degree is above 1"))
    register(SearchDimension(strategy="pipeline", field="virtual_stages",
                             values=_virtual_stages,
                             description="interleaved: every divisor above 1 of the layers "
                                         "per stage"))
    register(SearchDimension(strategy="pipeline", field="layers_per_stage",
                             values=_layer_splits, vectorised=False,
                             description="an even split, else balanced_layers"))
