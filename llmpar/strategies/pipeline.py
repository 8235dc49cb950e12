"""Pipeline parallelism: consecutive layers on consecutive stages.

Schedules and their idle time (bubble) as a share of compute, with p stages, m
micro-batches per step and v virtual stages per GPU:
- "gpipe" (Huang et al. 2019, arXiv:1811.06965): bubble (p-1)/m; every stage holds
  all m micro-batches' activations.
- "1f1b" (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2.1):
  bubble (p-1)/m; stage i holds min(m, p-i) micro-batches.
- "interleaved" (same paper, Sec. 2.2.2): bubble (p-1)/(v*m); rank i runs
  2(p-i-1) + (v-1)p chunk forwards before its first backward and holds one more, at
  most all m*v (Megatron-Core megatron/core/pipeline_parallel/schedules.py
  get_pp_rank_microbatches, microbatch_group_size_per_vp_stage = p by default): each
  chunk 1/v of the rank's layers, so min(m, (2(p-i-1) + (v-1)p + 1)/v) micro-batches,
  on the first rank 1 + (p-1)/(p*v) times 1F1B's p (Korthikanti et al. 2022, Sec.
  4.2.3) where m > p.
- "zero-bubble" (ZB-H1, Qi et al. 2023, arXiv:2401.10241, Sec. 3): splitting the
  weight-gradient pass fills a third of 1F1B's bubble: (p-1)/(3m), at 1F1B's memory.
- "dualpipe" (DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv:2412.19437, Sec.
  3.2.1 and Table 2): micro-batches enter from both ends of the pipeline, so each rank
  holds two stages, its own (i) and its mirror's (p-1-i): two copies of the parameters,
  PP+1 micro-batches' activations, an idle time of (PP/2-1)(F&B+B-3W) per step, and each
  forward chunk paired with another micro-batch's backward chunk, the communication of
  each hidden behind the other's compute. Needs an even p and an even m >= 2p. Each rank
  holds its two stages one by one (`with_mirrors`): even under an even split, ranks 0 and
  p-1 hold the embedding and the output layer.
- "dualpipev" (the "cut-in-half" DualPipe, github.com/deepseek-ai/DualPipe README): the p
  ranks hold 2p stages in a V (rank i the chunks i and 2p-1-i, rank 0 the embedding and
  the output layer), one copy of the parameters, Table 2's bubble and activations with
  PP = 2p chunks of half a rank's layers. Needs m >= 2p.
The first stage holds the embedding, the last the output layer (and the embedding
too when they are tied, to keep the tied gradient in sync, as Megatron-LM does).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs
import numpy as np

from llmpar.arrays import (
    anywhere,
    is_array,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    where,
)
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
    COMPONENTS,
    Collective,
    Copy,
    ForwardStep,
    Layout,
    Rule,
    Stage,
    Strategy,
    StrategyContext,
    Transform,
    checked_collective,
)

Schedule = Literal["1f1b", "interleaved", "gpipe", "zero-bubble", "dualpipe", "dualpipev"]
SCHEDULES: tuple[Schedule, ...] = typing.get_args(Schedule)
PIPELINE_SCHEDULE = "pipeline.schedule"
"""The shared setting (`Layout.setting`) of a schedule that pairs chunks ("dualpipe",
"dualpipev"); other schedules share nothing."""
PAIRING_SCHEDULES = ("dualpipe", "dualpipev")
FORWARD_PASS, BACKWARD_PASS, WEIGHT_PASS = 1.0, 2.0, 1.0
"""The times of a chunk's forward pass (F), whole backward pass (B) and backward pass
for the weights alone (W), in units of F, for Table 2's bubbles: the backward runs two
products per forward product, one for the input gradients and one for the weights
(Narayanan et al. 2021, Sec. 3.2; Qi et al. 2023 take T_F = T_B = T_W). With them
ZB-H1's (p-1)(F+B-2W) over m(F+B) is the (p-1)/(3m) above."""
MIRROR_EXCHANGE = "pipeline.mirror-gradient-exchange"
"""DualPipe: the gradients of each rank's two stage copies summed with the mirror rank's."""
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
    """"1f1b", "interleaved" (with virtual_stages), "gpipe", "zero-bubble" (ZB-H1),
    "dualpipe" (DeepSeek-V3's bidirectional schedule: two copies of the parameters) or
    "dualpipev" (DualPipe cut in half: a V over the ranks, one copy)."""
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


def table2_bubble(schedule: str, p: int, forward: float, backward: float,
                  weight: float) -> float:
    """One rank's idle time per step, in the unit of the pass times, of p ranks whose
    stage (chunk) runs a forward pass in `forward` (F), a whole backward pass in
    `backward` (B) and the weight-gradient part of it in `weight` (W): DeepSeek-V3
    technical report (arXiv:2412.19437) Table 2 and the DualPipe README's table.
    1F1B (p-1)(F+B); ZB1P (p-1)(F+B-2W); DualPipe (PP/2-1)(F&B+B-3W) with PP = p, where
    F&B, a forward and a backward chunk run together, takes F + B (their communication
    hides, their compute adds up); DualPipeV the same with PP = 2p chunks of half a rank's
    layers, each pass half as long."""
    if schedule == "zero-bubble":
        return (p - 1) * (forward + backward - 2 * weight)
    if schedule in PAIRING_SCHEDULES:
        stages, chunk = (p, 1.0) if schedule == "dualpipe" else (2 * p, 0.5)
        paired = forward + backward
        return (stages / 2 - 1) * (paired + backward - 3 * weight) * chunk
    return (p - 1) * (forward + backward)


def bubble_fraction(config: PipelineConfig, m: Any) -> Any:
    """Idle time over compute time, per schedule (see the module docstring); the
    DualPipe schedules' is `table2_bubble` over the m (F + B) of a rank's compute."""
    p = config.degree
    if p == 1:
        return 0.0
    schedule = config.schedule
    found = where(schedule == "interleaved", (p - 1) / (config.virtual_stages * m),
                  where(schedule == "zero-bubble", (p - 1) / (3 * m), (p - 1) / m))
    if not anywhere(_pairs_chunks(schedule)):
        return found
    per_micro_batch = {name: table2_bubble(name, p, FORWARD_PASS, BACKWARD_PASS, WEIGHT_PASS)
                       / (FORWARD_PASS + BACKWARD_PASS) for name in PAIRING_SCHEDULES}
    return where(schedule == "dualpipe", per_micro_batch["dualpipe"] / m,
                 where(schedule == "dualpipev", per_micro_batch["dualpipev"] / m, found))


def _pairs_chunks(schedule: Any) -> Any:
    """Whether the schedule is DualPipe or DualPipeV (a boolean array for an array)."""
    if is_array(schedule):
        return np.isin(schedule, PAIRING_SCHEDULES)
    return schedule in PAIRING_SCHEDULES


DUAL_IN_FLIGHT = {"dualpipe": 1.0, "dualpipev": 0.5}
"""Table 2's PP + 1 micro-batches of activations on every rank, over p (p + 1 stages'
worth: DualPipe, PP = p) or over the 2p half-rank chunks (p + 1/2 ranks' worth:
DualPipeV, PP = 2p), beyond p."""


def interleaved_chunks(p: Any, v: Any, stage: int) -> Any:
    """Model chunks whose activations rank `stage` holds at its peak under the
    interleaved schedule, before the cap of m*v: its warm-up forwards, 2(p-stage-1) +
    (v-1)p, and the first steady forward (Megatron-Core megatron/core/pipeline_parallel/
    schedules.py: get_pp_rank_microbatches and max_outstanding_backprops = warm-up + 1,
    microbatch_group_size_per_vp_stage = p, its default)."""
    return 2 * (p - stage - 1) + (v - 1) * p + 1


def head_in_flight(config: PipelineConfig, m: Any, last: Any) -> Any:
    """Micro-batches whose output-layer and loss tensors the last rank holds at its peak
    under the interleaved schedule: one. Its forward of the last chunk for a micro-batch
    is followed by that chunk's backward of the same micro-batch (Megatron-Core
    megatron/core/pipeline_parallel/schedules.py get_schedule_table: forwards run chunk
    by chunk over groups of microbatch_group_size_per_vp_stage = p micro-batches, the
    backwards over the chunks in reverse, and the last rank's warm-up, (v-1)p forwards,
    ends just before its last chunk). None under the other schedules (the stage's own
    count: 1F1B's last stage holds one micro-batch anyway, GPipe's all). `last`: the last
    rank's micro-batches in flight (`stages_in_flight`)."""
    schedule = config.schedule
    if isinstance(schedule, str):
        return 1.0 if schedule == "interleaved" else None
    if not anywhere(schedule == "interleaved"):
        return None
    return where(schedule == "interleaved", minimum(m, 1) * 1.0, last)


def in_flight(config: PipelineConfig, stage: int, m: Any) -> Any:
    """Micro-batches whose activations stage `stage` holds at its peak."""
    return stages_in_flight(config, m, (stage,))[0]


def stages_in_flight(config: PipelineConfig, m: Any, stages: Iterable[int]) -> list[Any]:
    """`in_flight` of each of `stages`, the schedule read once."""
    p, v, schedule = config.degree, config.virtual_stages, config.schedule
    if isinstance(schedule, str) and not is_array(m):  # one layout: Python's arithmetic
        if schedule == "gpipe":
            return [float(m) for _ in stages]
        if schedule in DUAL_IN_FLIGHT:
            return [p + DUAL_IN_FLIGHT[schedule] for _ in stages]
        if schedule == "interleaved":
            return [min(float(m), interleaved_chunks(p, v, stage) / v) for stage in stages]
        # min(m, p - stage): the first of the two where they tie, as `min` takes
        return [(m if m <= p - stage else p - stage) * 1.0 for stage in stages]
    found = []
    for stage in stages:
        held = where(schedule == "interleaved",
                     minimum(m, interleaved_chunks(p, v, stage) / v), minimum(m, p - stage))
        held = where(schedule == "gpipe", m, held) * 1.0
        for name, extra in DUAL_IN_FLIGHT.items():
            held = where(schedule == name, p + extra, held)
        found.append(held)
    return found


def paired_chunk_share(schedule: Any, p: int, m: Any) -> Any:
    """The share of a rank's forward (and backward) chunks that DualPipe runs as an
    overlapped forward-backward pair (`_forward_backward_chunk`), on rank 0, which has
    the fewest (deepseek-ai/DualPipe dualpipe.py and dualpipev.py, `step`: its steps 4 and
    5 pair 2 (m/2 - p + h + 1) + (p/2 - h - 1) chunks of half-rank h's m forward chunks;
    DualPipeV's 2 (m - 2p + r + 1) + (p - r - 1) of rank r's 2m). The rest run alone, at
    the warm-up and the cool-down. 0 for the other schedules and without a pipeline."""
    if p == 1 or not anywhere(_pairs_chunks(schedule)):
        return 0.0
    dual = maximum(0.0, minimum(1.0, (m - 1.5 * p + 1) / m))
    dual_v = maximum(0.0, minimum(1.0, (2 * m - 3 * p + 1) / (2 * m)))
    return where(schedule == "dualpipe", dual, where(schedule == "dualpipev", dual_v, 0.0))


def distinct_mirrors(config: PipelineConfig) -> bool:
    """Whether DualPipe's ranks hold two different stages, each modelled on its own
    (`with_mirrors`): always with a pipeline, since rank i holds stage i and stage p-1-i
    even where the split is even, and the end ranks' two stages differ (stage 0 holds the
    embedding, stage p-1 the output layer: ranks 0 and p-1 each hold both, and each runs
    the output layer for half the micro-batches, not a copy of its own stage for all of
    them). A search node's stages cannot differ by schedule: the search tries DualPipe
    only on its own (`_schedules`), where a node of several schedules would cost it as
    two copies of each rank's own stage (with a warning)."""
    return config.degree > 1 and everywhere(config.schedule, "dualpipe")


def everywhere(schedule: Any, name: str) -> bool:
    """Whether the schedule is `name` (for every layout of an array of them)."""
    if isinstance(schedule, str):
        return schedule == name
    return bool(np.all(np.asarray(schedule) == name))


def with_mirrors(stages: list[Stage]) -> list[Stage]:
    """DualPipe's ranks: rank i holds stage i and its mirror p-1-i (deepseek-ai/DualPipe
    examples/example_dualpipe.py: `nn.Sequential(full_modules[rank], full_modules[pp_size
    - 1 - rank])`). Its own stage runs phase 0, the mirror phase 1; with h = min(i, p-1-i),
    `step` runs 2(p/2 - h - 1) + (h + 1) forward chunks of phase 0 and h + 1 of phase 1
    before their first backward, and each later backward is followed by a forward of the
    same phase (dualpipe.py `step`, steps 1 to 5): at most p - h micro-batches of the own
    stage and h + 1 of the mirror's, p + 1 in all (the report's Table 2)."""
    p = len(stages)
    found = []
    for index, stage in enumerate(stages):
        h = min(index, p - 1 - index)
        mirror = attrs.evolve(stages[p - 1 - index], micro_batches_in_flight=float(h + 1))
        found.append(attrs.evolve(stage, micro_batches_in_flight=float(p - h), mirror=mirror))
    return found


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
            if p > 1:
                found.append(Rule(f"{path}.degree", logical_and(
                    config.schedule == "dualpipev", layers % (2 * p) != 0),
                    lambda: f"dualpipev splits model.num_layers ({layers}) into 2 x degree "
                            f"({2 * p}) equal chunks, a V over the ranks; give a number of "
                            "layers it divides"))
        interleaved = config.schedule == "interleaved"
        found.append(Rule(f"{path}.virtual_stages", logical_and(logical_not(interleaved),
                                                                  v != 1),
                          lambda: f"virtual_stages ({v}) needs schedule = 'interleaved'"))
        m = micro_batches_per_step(spec, layout)
        found.append(Rule(f"{path}.schedule", logical_and(interleaved, (m % p != 0) & (p > 1)),
                          lambda: f"the interleaved schedule needs micro-batches per step "
                                  f"({m}) to be a multiple of the pipeline degree ({p})"))
        if p > 1 and anywhere(_pairs_chunks(config.schedule)):
            found += _dual_rules(config, m)
        if is_array(config.schedule):
            v_shape = np.asarray(config.schedule) == "dualpipev"
            found.append(Rule(f"{path}.schedule", logical_and(v_shape, not np.all(v_shape)),
                              lambda: "dualpipev moves the output layer to the first stage: "
                                      "it is searched apart from the other schedules"))
        return found

    def shared_settings(self, config: PipelineConfig) -> dict[str, Any]:
        # Only a schedule that pairs chunks is shared: the others change nothing elsewhere.
        if config.degree == 1 or not anywhere(_pairs_chunks(config.schedule)):
            return {}
        return {PIPELINE_SCHEDULE: config.schedule}

    def transform(self, config: PipelineConfig, ctx: StrategyContext) -> Transform:
        p = config.degree
        if p == 1:
            return Transform(strategy=self.name)
        spec, layout = ctx.spec, ctx.layout
        m = micro_batches_per_step(spec, layout)
        stages, first = [], 0
        tied = spec.model.tie_embeddings
        # DualPipeV's V ends on rank 0, which holds the first chunk and the last. The stages
        # cannot differ within a search node, so the search tries DualPipeV only on its own
        # (`_schedules`; the rules refuse it beside other schedules in one node).
        v_shape = everywhere(config.schedule, "dualpipev")
        counts = stage_layer_counts(config, spec.model.num_layers or p)
        held = stages_in_flight(config, m, range(len(counts)))
        head = head_in_flight(config, m, held[-1])
        head_stage = 0 if v_shape else p - 1  # the stage that holds the output layer
        for index, count in enumerate(counts):
            last = index == head_stage
            stages.append(Stage(index=index, first_layer=first, num_layers=count,
                                has_embedding=index == 0 or (last and tied), has_head=last,
                                micro_batches_in_flight=held[index],
                                head_micro_batches_in_flight=head if last else None))
            first += count
        mirrored = distinct_mirrors(config)
        if mirrored:
            stages = with_mirrors(stages)
        bubble = bubble_fraction(config, m)
        warnings = [f"pipeline bubble is {bubble:.0%} of compute time (p = {p}, m = {m})"
                    ] if not is_array(bubble) and bubble > 0.2 else []
        if anywhere(config.schedule == "dualpipe") and not mirrored:
            warnings.append("dualpipe beside other schedules in one search node: rank i "
                            "holds stages i and p-1-i, costed here as two copies of stage i "
                            "(evaluated alone, each rank holds its two stages)")
        # forward activations and backward gradients, per chunk a micro-batch leaves: v
        # chunks per rank, DualPipeV's two (the turn of the V on the last rank aside)
        chunks = where(config.schedule == "dualpipev", 2, config.virtual_stages)
        calls = 2 * m * chunks
        paired = _pairs_chunks(config.schedule)
        overlapped = logical_or(config.overlap_p2p, paired)
        sends = checked_collective(strategy=self.name, name=SEND_RECV, operation="send-recv",
                                   buffer_bytes=self._boundary_bytes(config, ctx), group_size=2,
                                   group_stride=layout.stride(self.name), calls_per_step=calls,
                                   reason="activations forward and their gradients backward, per "
                                          "micro-batch and stage boundary" + (
                                              ", behind another micro-batch's compute"
                                              if overlapped is True else ""),
                                   **_overlapped_sends(overlapped, calls))
        notes: tuple[str, ...] = ()
        if not is_array(config.schedule) and config.schedule in PAIRING_SCHEDULES:
            share = paired_chunk_share(config.schedule, p, m)
            notes = (f"{config.schedule}: "
                     + (f"{share:.0%} of " if not is_array(share) else "")
                     + "rank 0's chunks run as forward-backward pairs, each hiding the "
                       "other's communication",)
        if mirrored:
            notes += (f"dualpipe over stages of {list(counts)} layers: rank i holds stage i "
                      "and its mirror p-1-i (ranks 0 and p-1 the embedding and the output "
                      "layer), their "
                      "parameters, p - h and h + 1 micro-batches of their activations (h = "
                      "min(i, p-1-i)) and the mean of their work",)
        return Transform(strategy=self.name, stages=tuple(stages), bubble_fraction=bubble,
                         copies=() if mirrored else _dual_copies(config.schedule),
                         notes=notes, mechanisms=(
                             ("dualpipe",) if not is_array(config.schedule)
                             and config.schedule in PAIRING_SCHEDULES else ()),
                         collectives=(sends, *self._gathers(config, ctx, calls),
                                      *_mirror_exchange(config, ctx)),
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
        calls = where(sequence_parallel(ctx.layout), 0.0, calls)
        if not anywhere(calls != 0):  # stated only where it runs, as the data strategy's
            return ()
        return (checked_collective(
            strategy=self.name, name=BOUNDARY_ALL_GATHER, operation="all-gather",
            buffer_bytes=hidden_state_bytes(ctx.spec, ctx.layout), group_size=t,
            group_stride=ctx.layout.stride("tensor"), calls_per_step=calls,
            reason="rebuild the received boundary tensor from its slices"),)


def _overlapped_sends(overlapped: Any, calls: Any) -> dict[str, Any]:
    """With `overlap_p2p`, or under DualPipe, whose sends are batched isend/irecv that a
    rank waits for only before the chunk that needs them (deepseek-ai/DualPipe comm.py,
    `_commit_and_wait_comm`), the step's sends hide behind compute in `calls / 2` pieces:
    one forward and one backward send (a piece) wait with nothing beside them."""
    if not anywhere(overlapped):
        return {}
    return dict(overlap=where(overlapped, 1.0, 0.0), hides_behind="compute",
                pieces=maximum(calls / 2, 1))


def _dual_rules(config: PipelineConfig, m: Any) -> list[Rule]:
    """DualPipe's `step` asserts an even number of ranks and an even number of
    micro-batches, at least twice the ranks (deepseek-ai/DualPipe dualpipe.py:
    `num_ranks % 2 == 0`, `num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`); DualPipeV's
    only the latter's bound (dualpipev.py: `num_chunks >= num_ranks * 2`)."""
    p, schedule, path = config.degree, config.schedule, "$.parallel.pipeline"
    dual = schedule == "dualpipe"
    found = [
        Rule(f"{path}.degree", logical_and(dual, p % 2 != 0),
             lambda: f"dualpipe needs an even number of stages, got degree = {p} (DualPipe "
                     "pairs rank i with its mirror p-1-i)"),
        Rule(f"{path}.schedule", logical_and(_pairs_chunks(schedule), m < 2 * p),
             lambda: f"{schedule} needs at least 2 x degree = {2 * p} micro-batches per step, "
                     f"got {m} (global_batch_size / (micro_batch_size x data degree))"),
        Rule(f"{path}.schedule", logical_and(dual, m % 2 != 0),
             lambda: f"dualpipe needs an even number of micro-batches per step (half enter "
                     f"from each end), got {m}"),
    ]
    return found


def _dual_copies(schedule: Any) -> tuple[Copy, ...]:
    """DualPipe: each rank holds its own stage and its mirror's, two copies of a stage's
    weights, gradients and optimizer states, as the reference builds them (examples/
    example_dualpipe.py: `nn.Sequential(full_modules[rank], full_modules[pp_size - 1 -
    rank])`, each module with its own gradients). The copy of the first stage's
    embedding stands for the last stage's output layer the rank also holds (both
    vocabulary x hidden), and the reverse on the last rank. DualPipeV holds one copy."""
    dual = schedule == "dualpipe"
    if not anywhere(dual):
        return ()
    return tuple(Copy(component=component, copies=where(dual, 2, 1),
                      reason="DualPipe: each rank holds its stage and its mirror's")
                 for component in COMPONENTS)


def _mirror_exchange(config: PipelineConfig, ctx: StrategyContext) -> tuple[Collective, ...]:
    """DualPipe: each rank sends the gradients of its two stage copies to its mirror
    and adds the mirror's, once per step after the backward passes (examples/
    example_dualpipe.py sums `p0.grad` and `p1.grad` with the mirror rank's). Rank i's
    mirror is p-1-i; the outermost pair spans the whole pipeline group, so the exchange
    crosses nodes where the group does."""
    dual = config.schedule == "dualpipe"
    if not anywhere(dual):
        return ()
    return (checked_collective(strategy="pipeline", name=MIRROR_EXCHANGE, operation="send-recv",
                               group_size=config.degree, group_stride=ctx.layout.stride("pipeline"),
                               calls_per_step=where(dual, 1.0, 0.0),
                               bytes_per_parameter=bytes_per_element(ctx.spec.gradients_dtype),
                               component="gradients",
                               reason="DualPipe: sum the gradients of the two copies of each stage "
                                      "with the mirror rank, once per step"),)


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
    """Every schedule but DualPipe and DualPipeV: their stages differ from the others'
    (DualPipe's rank i holds stages i and p-1-i, `distinct_mirrors`; DualPipeV's rank 0
    the first chunk and the last) and one search node holds one set of stages, so each is
    searched alone where the searched spec's own table names it (DualPipe only with an
    even degree: its rules reject the rest)."""
    p = point.degree("pipeline")
    if p == 1:
        return (PipelineConfig().schedule,)
    config = point.spec.parallel.get("pipeline")
    named = getattr(config, "schedule", None)
    if named == "dualpipev" or (named == "dualpipe" and p % 2 == 0):
        return (named,)
    return tuple(s for s in SCHEDULES if s not in PAIRING_SCHEDULES)


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
                             description="every schedule but dualpipe and dualpipev, when "
                                         "the degree is above 1; dualpipe (even degree) or "
                                         "dualpipev alone where the spec's table names it"))
    register(SearchDimension(strategy="pipeline", field="virtual_stages",
                             values=_virtual_stages,
                             description="interleaved: every divisor above 1 of the layers "
                                         "per stage"))
    register(SearchDimension(strategy="pipeline", field="layers_per_stage",
                             values=_layer_splits, vectorised=False,
                             description="an even split, else balanced_layers"))
