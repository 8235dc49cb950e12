"""Step time: an assumed utilization, or a model of compute, communication, bubble
and optimizer step.

Modelled (when the spec gives no `[training] mfu` and the GPU states its
efficiencies):
    compute   = hardware FLOPs per GPU / (peak * matmul_efficiency)
                * the slowest pipeline stage's work over the average stage's
                  (llmpar.evaluation.balance)
              + what products lose to their shapes: launches, memory-bound
                products (llmpar.evaluation.matmuls)
              + elementwise bytes / (HBM bandwidth * memory_efficiency)
    exposed   = communication not hidden behind compute: each collective states
                the share of it that can overlap and the work it hides behind (its
                window, `overlap_windows`); the collectives behind one window share
                it: exposed = unhidden + max(0, hideable - window) for the group,
                split in proportion to what each could hide, where one piece of a
                collective that runs in pieces (a gradient bucket, a layer's
                weights) is unhidden and the window starts once the first piece is
                ready; all hiding together is capped by compute
    bubble    = bubble_fraction * compute (pipeline schedules)
    optimizer = optimizer-step bytes / (HBM bandwidth * memory_efficiency), for the
                optimizer states on the GPU (offloaded ones are updated by the host)
    offload   = host work on offloaded states not hidden behind compute
                (0 without offloading)
    overhead  = the framework profile's exposed host time: micro_batch_overhead_seconds
                per micro-batch (each GPU runs every micro-batch of the step) plus
                step_overhead_seconds (0 under megatron-core), plus what issuing the
                step's kernels takes beyond compute (llmpar.evaluation.launches: hidden
                while the GPU's work takes longer)
    step      = compute + exposed + bubble + optimizer + offload + overhead
Elementwise bytes: every saved activation is written and read in the forward
pass and read with its gradient written and read in the backward pass, 4 passes
over the inventory (6 with full recomputation, which runs the forward twice); with
fp8 linear layers, the casts of their inputs, output gradients and weights
(llmpar.evaluation.casts).

Every number may be an array over a search node (`llmpar.arrays`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from llmpar.arrays import Value, is_array, maximum, minimum, where
from llmpar.communication.collectives import algorithm_of, seconds_of
from llmpar.evaluation.attention import attention_seconds, kernel_rates
from llmpar.evaluation.cache import CollectiveSeconds, EvaluationCache
from llmpar.evaluation.casts import cast_bytes, casts_fp8, fp8_gathers, gather_casts
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import StageKinds, TrainingFacts
from llmpar.evaluation.launches import (
    exposed_issue_seconds,
    issue_seconds_per_micro_batch,
    issues_host_time,
    step_issue_seconds,
)
from llmpar.evaluation.matmuls import (
    RankShape,
    output_layer_format,
    product_rate,
    shape_loss_seconds,
)
from llmpar.evaluation.memory import MemoryCore
from llmpar.finetune.states import StateCounts, counts_of, dequantized_bytes_per_pass
from llmpar.footprint.flops import BACKWARD_TO_FORWARD
from llmpar.plan import CollectiveCost
from llmpar.roofline import Rates, rates_of
from llmpar.spec import Hardware, Spec
from llmpar.spec.hardware import AttentionKernelRate
from llmpar.strategy import Collective

ASSUMED_SOURCE = ("T = C / (n * F_peak * MFU), the founding document's training-time rule; "
                  "Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1")
MODELLED_SOURCE = ("llmpar.evaluation.step_time: compute + exposed communication + bubble + "
                   "optimizer")
OFFLOAD_SOURCE = ("ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4) and ZeRO-Infinity "
                  "(Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 6); per-parameter costs "
                  "from the strategies: ")
ELEMENTWISE_PASSES = 4
RERUN_PASSES = 2
"""Passes over a recomputed tensor's bytes: its inputs read and it written again."""
ADAM_STEP_PASSES = 2
"""The optimizer reads and writes its states and the weights once each, and reads the
gradients (a fused Adam kernel, e.g. apex FusedAdam / torch `fused=True`)."""


class Cost:
    """One collective's calls of a step on one GPU, on its link (a plain record: many
    are made per evaluation)."""

    __slots__ = ("buffer_bytes", "calls", "collective", "costed", "exposed", "piece",
                 "seconds", "tier", "window")

    def __init__(self, collective: Collective, buffer_bytes: Value, calls: Value, tier: str,
                 seconds: Value, exposed: Value, costed: bool, piece: Value = 0.0,
                 window: Value = 0.0):
        self.collective, self.buffer_bytes, self.calls = collective, buffer_bytes, calls
        self.tier, self.seconds, self.exposed = tier, seconds, exposed
        self.costed = costed
        """False when the hardware states no bandwidth for its link (then 0 s)."""
        self.piece = piece
        """The share of its time one piece takes (1 / pieces; 0: not in pieces)."""
        self.window = window
        """Seconds of work its hideable part can run behind (0 until hidden)."""

    def with_exposed(self, exposed: Value, window: Value | None = None) -> Cost:
        return Cost(self.collective, self.buffer_bytes, self.calls, self.tier, self.seconds,
                    exposed, self.costed, self.piece,
                    self.window if window is None else window)


@attrs.frozen(kw_only=True)
class HostTime:
    """Host work of one step on one GPU of the busiest kind of stage."""

    seconds: Value = 0.0
    overlappable: Value = 0.0
    by_work: tuple[Value, ...] = ()
    kind: Value = 0

    def exposed(self, compute_seconds: Value) -> Value:
        """Seconds the step waits for: what cannot overlap, and what compute cannot hide."""
        return self.seconds - minimum(self.overlappable, compute_seconds)


@attrs.frozen(kw_only=True)
class TimeCore:
    """Step time and its parts (None: the spec determines no step time)."""

    time_model: str
    step: Value | None
    costs: tuple[Cost, ...]
    host: HostTime
    compute: Value | None = None
    matmul: Value = 0.0
    shape_loss: Value = 0.0
    slowest: Value = 1.0
    elementwise_bytes: Value = 0.0
    cast_bytes: Value = 0.0
    """The fp8 casts' share of `elementwise_bytes` (`llmpar.evaluation.casts`)."""
    exposed: Value = 0.0
    bubble_fraction: Value = 0.0
    bubble: Value = 0.0
    optimizer: Value = 0.0
    on_gpu: Value = 1.0
    exposed_host: Value = 0.0
    overhead: Value = 0.0
    """The framework profile's exposed host time of one step (`framework_overhead` and
    `launch_bound`)."""
    issue: Value = 0.0
    """Host seconds to issue the step's kernels on one GPU (`llmpar.evaluation.launches`)."""
    launch_bound: Value = 0.0
    """The part of `issue` the GPU waits for: what it takes beyond compute."""
    mfu: float | None = None
    mfu_source: str = ""
    windows: Mapping[str, Value] = attrs.field(factory=dict)
    """Seconds of each kind of work collectives hide behind (`overlap_windows`)."""
    attention_rates: tuple[AttentionKernelRate, AttentionKernelRate] | None = None
    """The (forward, backward) rates attention ran at (`llmpar.evaluation.attention`);
    None: at matmul_efficiency."""


def parameters_per_gpu(composition: Composition, kinds: StageKinds,
                       parameters: Sequence[Mapping[str, float]], collective: Collective
                       ) -> Value:
    """Parameters of `collective.component` in its groups one GPU holds after every
    other strategy's shards, on average over the pipeline stages (on the stage that holds
    the most, `Collective.busiest_stage`), each copy it holds counted (`Copy`: DualPipe's
    two of each stage)."""
    assert collective.component is not None
    if collective.busiest_stage:
        return _busiest_stage_parameters(composition, parameters, collective)
    total: Value = 0.0
    for members, held in zip(kinds.members, parameters):
        # each of the kind's stages: one "byte" per parameter
        total = total + composition.held(held, len(members), collective.component,
                                         collective.strategy, collective.parameter_groups)
    return total / len(kinds.kind_of)


def _busiest_stage_parameters(composition: Composition,
                              parameters: Sequence[Mapping[str, float]],
                              collective: Collective) -> Value:
    """`parameters_per_gpu` on the stage kind that holds the most of the groups."""
    assert collective.component is not None
    most: Value = 0.0
    for held in parameters:
        most = maximum(most, composition.held(held, 1.0, collective.component,
                                              collective.strategy, collective.parameter_groups))
    return most


def collective_costs(spec: Spec, composition: Composition, kinds: StageKinds,
                     parameters: Sequence[Mapping[str, float]],
                     cost_model: CollectiveSeconds | None = None,
                     counts: Sequence[StateCounts] | None = None) -> tuple[Cost, ...]:
    """Every collective still in force, costed on its link, for one step on one GPU
    (one that runs nowhere is left out); a collective of model states counts the
    parameters its component counts (`counts`: the trainable ones for gradients)."""
    found = []
    per_parameter: dict[tuple[Any, ...], Value] = {}
    for collective, calls in composition.active_collectives():
        if not is_array(calls) and calls == 0:
            continue
        buffer = collective.buffer_bytes
        if collective.bytes_per_parameter is not None and collective.component is not None:
            key = (collective.component, collective.parameter_groups, collective.strategy,
                   collective.busiest_stage)
            if key not in per_parameter:
                per_parameter[key] = parameters_per_gpu(
                    composition, kinds, counts_of(collective.component, parameters, counts),
                    collective)
            buffer = collective.bytes_per_parameter * per_parameter[key]
        per_call, tier = (cost_model or seconds_of)(collective, spec.hardware, buffer)
        seconds = (0.0 if per_call is None else per_call) * calls
        exposed = seconds * (1 - collective.overlap)
        serial = collective.serial_seconds_per_call  # on the critical path, all of it
        if serial.__class__ is not float or serial:  # an array, or not 0.0
            seconds, exposed = seconds + serial * calls, exposed + serial * calls
        found.append(Cost(collective, buffer, calls, tier, seconds, exposed,
                          per_call is not None, piece_share(collective, buffer)))
    return tuple(found)


def piece_share(collective: Collective, buffer_bytes: Value) -> Value:
    """The share of a collective's time one of its pieces takes: 1 / pieces, or
    bucket / buffer (at most 1) for buckets of `bucket_bytes`; 0 when not in pieces."""
    if collective.bucket_bytes is not None:
        bucket = collective.bucket_bytes
        larger = buffer_bytes > bucket
        return where(larger, bucket / where(larger, buffer_bytes, 1.0), 1.0)
    if collective.pieces is not None:
        return 1.0 / collective.pieces
    return 0.0


def overlap_windows(compute: Value, attention: Value, backward_share: Value,
                    micro_batches: Value, weight_gradient_share: Value,
                    products: Value | None = None) -> dict[str, Value]:
    """Seconds of each kind of work a collective can hide behind (`HIDING_WORK`), on one
    GPU of the slowest stage: the step's compute; the attention products; the backward
    and the forward pass of one micro-batch (compute / micro-batches, split by the
    backward's share of the executed FLOPs); every layer's passes (the whole compute,
    a piece behind each layer); the weight-gradient products of every micro-batch; and
    the matrix products other than attention (`products`, all the matrix products'
    time; default the compute)."""
    per_micro_batch = compute / micro_batches
    projections = maximum((compute if products is None else products) - attention, 0.0)
    return {"compute": compute, "attention": attention,
            "last-backward": per_micro_batch * backward_share,
            "first-forward": per_micro_batch * (1 - backward_share),
            "layers": compute, "weight-gradients": compute * weight_gradient_share,
            "projections": projections}


def weight_gradient_share(facts: TrainingFacts, composition: Composition,
                          executed: Value | None = None) -> Value:
    """The weight-gradient products' share of the executed FLOPs: half the backward of the
    executed model FLOPs, as much as the forward (1 part in 1 + 2). `executed`:
    `executed_flops`, where the caller has it."""
    executed = executed_flops(facts, composition) if executed is None else executed
    weight_gradients = facts.executed_model_flops_per_step / (1.0 + BACKWARD_TO_FORWARD)
    positive = executed > 0
    return where(positive, weight_gradients / where(positive, executed, 1.0), 0.0)


def backward_share(facts: TrainingFacts, composition: Composition,
                   executed: Value | None = None) -> Value:
    """The backward pass's share of the executed FLOPs: all but the forward pass of the
    executed model FLOPs (1 part in 1 + 2; executed, so that a counting convention does not
    move the window); recomputation runs within the backward pass. `executed`:
    `executed_flops`, where the caller has it."""
    executed = executed_flops(facts, composition) if executed is None else executed
    forward = facts.executed_model_flops_per_step / (1.0 + BACKWARD_TO_FORWARD)
    positive = executed > 0
    return where(positive, 1 - forward / where(positive, executed, 1.0), 0.0)


def _smallest_piece(chosen: Sequence[Cost]) -> Value:
    """The first piece's share among the collectives that run: the work before it is
    ready hides nothing (0 when one of them is not in pieces). One that takes no time
    (no calls, or an uncosted link) opens no window for the others."""
    found: Value = 1.0
    for cost in chosen:
        found = minimum(found, where(cost.seconds > 0, cost.piece, 1.0))
    return found


def _windowed(costs: list[Cost], chosen: Sequence[int], kind: str, work: Value) -> None:
    """Hide the collectives at `chosen` positions of `costs`, those that hide behind
    `kind`, in its `work`, together (in place): each one's unhidden part (what cannot
    overlap, and one piece) stays exposed; the rest hides while the window lasts (after
    the first piece is ready), and what exceeds it is exposed in proportion to each one's
    hideable part."""
    window = work * (1 - _smallest_piece([costs[i] for i in chosen]))
    hideable = [(costs[i].seconds - costs[i].exposed) * (1 - costs[i].piece) for i in chosen]
    scale: Value = 0.0
    if kind != "compute":  # the step's compute caps all hiding together (`hide_costs`)
        total = sum(hideable, start=0.0)
        excess = maximum(total - window, 0.0)
        over = total > 0
        scale = where(over, excess / where(over, total, 1.0), 0.0)
    # A collective that cannot overlap at all has no window; behind a window of its own
    # kind none hides more than the work after its own first piece, whatever the others
    # sharing the window would allow (the step's compute is shared in proportion instead).
    for i, share in zip(chosen, hideable):
        cost = costs[i]
        hidden = share * (1 - scale)
        if kind != "compute":
            hidden = minimum(hidden, work * (1 - cost.piece))
        costs[i] = cost.with_exposed(cost.seconds - hidden,
                                     where(cost.collective.overlap > 0, window, 0.0))


def _capped(costs: Sequence[Cost], work: Value) -> tuple[Cost, ...]:
    """Cap the hidden share of all collectives together at `work`, scaling each one's
    hidden share alike."""
    hideable = sum((c.seconds - c.exposed for c in costs), start=0.0)
    over = hideable > work
    if not is_array(over) and not over:
        return tuple(costs)
    scale = where(over, work / where(over, hideable, 1.0), 1.0)
    return tuple(c.with_exposed(c.seconds - (c.seconds - c.exposed) * scale) for c in costs)


def hide_costs(costs: Sequence[Cost], windows: Mapping[str, Value]) -> tuple[Cost, ...]:
    """Hide what overlaps behind the work it can overlap (`overlap_windows`): each window
    shared by the collectives that hide behind it, and all of them together at most
    the compute; then charge what hiding takes from the work (`contended`)."""
    behind: dict[str, list[int]] = {}  # the positions of the collectives behind each
    for index, cost in enumerate(costs):
        behind.setdefault(cost.collective.hides_behind, []).append(index)
    hidden = list(costs)
    for kind, work in windows.items():
        chosen = behind.get(kind)
        if chosen:  # a window nothing hides behind changes nothing
            _windowed(hidden, chosen, kind, work)
    return contended(_capped(hidden, windows["compute"]))


def contended(costs: Sequence[Cost]) -> tuple[Cost, ...]:
    """A collective whose kernels occupy part of the GPU while they hide
    (`Collective.compute_share`, e.g. the 16 to 24 of an H100's 132 SMs Transformer
    Engine's pipelined GEMM + reduce-scatter takes) slows the work it hides behind by
    that share of its hidden seconds: exposed += share * (seconds - exposed)."""
    if all(c.collective.compute_share == 0 for c in costs):
        return tuple(costs)
    return tuple(c.with_exposed(c.exposed + c.collective.compute_share * (c.seconds - c.exposed))
                 if c.collective.compute_share else c for c in costs)


def host_time(composition: Composition, parameters: Sequence[Mapping[str, float]],
              counts: Sequence[StateCounts] | None = None) -> HostTime:
    """The strategies' host work, on the kind of stage where it takes longest."""
    work = composition.host_work
    if not work:
        return HostTime()
    best: HostTime | None = None
    for kind, held in enumerate(parameters):
        costed = tuple(w.passes_per_step * composition.held(
            held if counts is None else counts[kind][w.component], 1.0, w.component)
                       * w.seconds_per_parameter for w in work)
        seconds = sum(costed, start=0.0)
        overlappable = sum((s * w.overlap for s, w in zip(costed, work)), start=0.0)
        here = HostTime(seconds=seconds, overlappable=overlappable, by_work=costed, kind=kind)
        if best is None:
            best = here
            continue
        better = seconds > best.seconds
        best = HostTime(seconds=where(better, seconds, best.seconds),
                        overlappable=where(better, overlappable, best.overlappable),
                        by_work=tuple(where(better, a, b) for a, b in zip(costed, best.by_work)),
                        kind=where(better, kind, best.kind))
    assert best is not None
    return best


def activation_offload_seconds(spec: Spec, composition: Composition,
                               facts: TrainingFacts) -> tuple[Value, Value]:
    """(all, one piece) of the host-link time of offloaded activations in one step, on
    the busiest kind of stage: each micro-batch's offloaded layers go out after their
    forward and come back before their backward, a layer at a time; one layer's copy
    in one direction has nothing to hide behind (the first reload of the backward)."""
    bandwidth = spec.hardware.host_bandwidth_bytes_per_s
    if not facts.offloaded_tags or not bandwidth:
        return 0.0, 0.0
    m = composition.micro_batches_per_step()
    moved: Value = 0.0
    piece: Value = 0.0
    for host, transit in zip(facts.offloaded_tags, facts.transit_tags):
        moved = maximum(moved, 2 * m * composition.split_bytes(host))
        piece = maximum(piece, composition.split_bytes(transit))
    return moved / bandwidth, piece / bandwidth


def with_activation_offload(host: HostTime, offload: tuple[Value, Value]) -> HostTime:
    """The strategies' host work plus the activations' copies, all but one piece of
    which can run behind compute (Megatron-Core copies on a separate CUDA stream)."""
    seconds, piece = offload
    if not is_array(seconds) and seconds == 0:
        return host
    return attrs.evolve(host, seconds=host.seconds + seconds,
                        overlappable=host.overlappable + seconds - piece)


def rank_shape(spec: Spec, composition: Composition) -> RankShape:
    """What decides the shapes of one GPU's products, from the strategies' splits."""
    split = composition.product_split()
    return RankShape(tensor=split.width, context=split.tokens, expert=split.experts,
                     expert_tensor=split.expert_width,
                     micro_batch_size=spec.training.micro_batch_size,
                     attention_steps=split.attention_steps)


def time_core(spec: Spec, composition: Composition, facts: TrainingFacts, memory: MemoryCore,
              kinds: StageKinds, parameters: Sequence[Mapping[str, float]],
              materialized_scores: bool, cache: EvaluationCache | None = None,
              counts: Sequence[StateCounts] | None = None) -> TimeCore:
    """How long one optimizer step takes, in parts."""
    gpu, n = spec.hardware.gpu, spec.hardware.num_gpus
    peak = gpu.peak_flops_per_s(spec.precision.compute)
    costs = collective_costs(spec, composition, kinds, parameters,
                             None if cache is None else cache.collective_seconds, counts)
    host = with_activation_offload(host_time(composition, parameters, counts),
                                   activation_offload_seconds(spec, composition, facts))
    bubble = composition.sum_of("bubble_fraction")
    if peak is None:
        return TimeCore(time_model="none", step=None, costs=costs, host=host,
                        bubble_fraction=bubble)
    mfu, source = spec.training.mfu, "[training] mfu"
    modelled = (mfu is None and gpu.matmul_efficiency is not None
                and gpu.memory_efficiency is not None and gpu.hbm_bandwidth_bytes_per_s)
    if not modelled:
        if mfu is None and gpu.achievable_mfu is not None:
            mfu, source = gpu.achievable_mfu, f"GPU preset: {gpu.achievable_mfu_source}"
        if mfu is None:
            return TimeCore(time_model="none", step=None, costs=costs, host=host,
                            bubble_fraction=bubble)
        assumed = model_flops(facts, composition) / (n * peak * mfu)
        exposed_host = host.exposed(assumed)
        return TimeCore(time_model="assumed-mfu", step=assumed + exposed_host, costs=costs,
                        host=host, bubble_fraction=bubble, exposed_host=exposed_host, mfu=mfu,
                        mfu_source=source)
    stages = len(kinds.kind_of)
    shape = rank_shape(spec, composition)
    return _modelled(spec, composition, facts, memory, stages, costs, host, bubble,
                     _shape_loss(spec, shape, facts, materialized_scores, cache),
                     dequantized_bytes_per_pass(composition, counts),
                     _casts(spec, shape, facts, costs),
                     _issue(spec, shape, facts, materialized_scores, cache, stages),
                     None if materialized_scores else kernel_rates(spec),
                     rates=None if cache is None else cache.rates(gpu), shape=shape)


def _issue(spec: Spec, shape: RankShape, facts: TrainingFacts,
           materialized_scores: bool, cache: EvaluationCache | None, stages: int) -> Value:
    """Host seconds to issue one micro-batch's kernels on one GPU of `shape` (0 for a
    profile that states no host time of its launches)."""
    if not issues_host_time(spec.training.profile):
        return 0.0
    fraction = facts.recomputed_fraction

    def compute() -> Value:
        return issue_seconds_per_micro_batch(spec, shape, spec.training.recompute, fraction,
                                             materialized_scores, stages)

    if cache is None or is_array(fraction) or is_array(shape.micro_batch_size):
        return compute()
    key = ("issue", cache.footprint_key(spec), shape, fraction, materialized_scores, stages)
    return cache.shape_loss(key, compute)


def _shape_loss(spec: Spec, shape: RankShape, facts: TrainingFacts,
                materialized_scores: bool, cache: EvaluationCache | None) -> Value:
    """What one micro-batch's products of `shape` lose to their shapes, along the
    pipeline."""
    gpu, recompute, fraction = spec.hardware.gpu, spec.training.recompute, \
        facts.recomputed_fraction

    def compute() -> Value:
        return shape_loss_seconds(spec, shape, rates_of(gpu), recompute, fraction,
                                  materialized_scores)

    if cache is None or is_array(fraction) or is_array(shape.micro_batch_size):
        return compute()
    key = (cache.footprint_key(spec), gpu, shape, fraction, materialized_scores)
    return cache.shape_loss(key, compute)


def _casts(spec: Spec, shape: RankShape, facts: TrainingFacts,
           costs: Sequence[Cost]) -> tuple[Value, Value, Value]:
    """The fp8 casts' bytes per micro-batch and the weights' per step, along the pipeline,
    and the shard casts before fp8 weight all-gathers on one GPU per step
    (`llmpar.evaluation.casts`; none unless a product or a gather runs in fp8)."""
    if not (casts_fp8(spec) or fp8_gathers(spec)):
        return 0.0, 0.0, 0.0
    gathered, weight_casts = gather_casts(spec, [(c.collective, c.buffer_bytes, c.calls)
                                                 for c in costs])
    return (*cast_bytes(spec, shape, spec.training.recompute,
                        facts.recomputed_fraction, weight_casts), gathered)


def _modelled(spec: Spec, composition: Composition, facts: TrainingFacts, memory: MemoryCore,
              stages: int, costs: tuple[Cost, ...], host: HostTime, bubble: Value,
              shape_loss_per_micro_batch: Value, dequantized_per_pass: Value = 0.0,
              casts: tuple[Value, Value, Value] = (0.0, 0.0, 0.0),
              issue_per_micro_batch: Value = 0.0,
              kernel: tuple[AttentionKernelRate, AttentionKernelRate] | None = None,
              rates: Rates | None = None, *, shape: RankShape) -> TimeCore:
    """`kernel`: attention's (forward, backward) rates where it runs at its kernel's;
    `rates`: the GPU's (`rates_of`), where a session keeps them; `shape`: the rank's
    (`rank_shape`)."""
    gpu, n = spec.hardware.gpu, spec.hardware.num_gpus
    assert gpu.matmul_efficiency and gpu.memory_efficiency and gpu.hbm_bandwidth_bytes_per_s
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
    m = composition.micro_batches_per_step()
    shape_loss = shape_loss_per_micro_batch / stages * m
    hardware = executed_flops(facts, composition)
    attention = facts.attention_hardware_flops_per_step
    rates = rates_of(gpu) if rates is None else rates
    linear_rate, attention_rate = product_rates(spec, rates)
    # The slowest stage paces the pipeline, the busiest rank the collectives it waits in.
    busiest = 1.0 + composition.sum_of("busiest_rank_extra_work")
    if kernel is None:
        attention_window = attention / n / attention_rate
        products = (hardware / linear_rate if linear_rate == attention_rate
                    else (hardware - attention) / linear_rate + attention / attention_rate)
    else:  # fused attention at its kernel's measured rates (llmpar.evaluation.attention)
        attention_time = attention_seconds(
            spec, shape, facts.attention_forward_flops_per_step,
            attention, rates.peak(spec.precision.attention_format), kernel)
        attention_window = attention_time / n
        products = (hardware - attention) / linear_rate + attention_time
    output_rate = product_rate(spec, rates, output_layer_format(spec))
    if output_rate != linear_rate:  # a profile that keeps the output layer in 16 bits
        output = facts.output_layer_hardware_flops_per_step
        products = products + output / output_rate - output / linear_rate
    matmul = products / n * facts.slowest_stage_factor * busiest + shape_loss
    passes = ELEMENTWISE_PASSES + where(spec.training.recompute == "full", RERUN_PASSES, 0)
    elementwise = passes * composition.split_bytes(facts.full_tags) / stages * m
    if facts.rerun_tags:
        # What recompute_modules rebuilds is written again and its inputs read again in
        # the backward, the two passes full recomputation adds (memory-bound kernels:
        # norms, activations, permutations).
        elementwise = elementwise + (RERUN_PASSES * composition.split_bytes(facts.rerun_tags)
                                     / stages * m)
    if not (isinstance(dequantized_per_pass, float) and dequantized_per_pass == 0.0):
        # QLoRA dequantizes each base layer for the forward, the input-gradient products and
        # a recomputed forward, every micro-batch (llmpar.finetune.footprint).
        elementwise = elementwise + dequantized_per_pass * m * (
            2 + where(spec.training.recompute == "full", 1, 0))
    per_micro_batch, per_step, gathered = casts
    cast = (per_micro_batch * m + per_step) / stages + gathered
    elementwise = elementwise + cast
    compute = matmul + elementwise / bandwidth
    windows = overlap_windows(compute, attention_window,
                              backward_share(facts, composition, hardware), m,
                              weight_gradient_share(facts, composition, hardware), matmul)
    costs = hide_costs(costs, windows)
    exposed = sum((c.exposed for c in costs), start=0.0)
    states = [k.states for k in memory.kinds]
    traffic = memory.at_peak([ADAM_STEP_PASSES * (s["optimizer"] + s["weights"]) + s["gradients"]
                              for s in states])
    on_gpu = memory.at_peak([1 - _share(k.offloaded["optimizer"], k.held["optimizer"])
                             for k in memory.kinds])
    optimizer = traffic * on_gpu / bandwidth
    bubble_seconds = bubble * compute
    exposed_host = host.exposed(compute)
    issue = step_issue_seconds(spec, issue_per_micro_batch, m)
    launch_bound = exposed_issue_seconds(issue, compute)
    overhead = framework_overhead(spec, m) + launch_bound
    step = compute + exposed + bubble_seconds + optimizer + exposed_host + overhead
    return TimeCore(time_model="modelled", step=step, costs=costs, host=host, compute=compute,
                    matmul=matmul, shape_loss=shape_loss, slowest=facts.slowest_stage_factor,
                    elementwise_bytes=elementwise, cast_bytes=cast, exposed=exposed,
                    bubble_fraction=bubble,
                    bubble=bubble_seconds, optimizer=optimizer, on_gpu=on_gpu,
                    exposed_host=exposed_host, overhead=overhead, issue=issue,
                    launch_bound=launch_bound, windows=windows, attention_rates=kernel)


def framework_overhead(spec: Spec, micro_batches: Value) -> Value:
    """Exposed host time of one step on one GPU under the framework profile: its
    per-micro-batch overhead for each of the step's micro-batches, plus its per-step
    overhead (the per-launch overhead is in the products' fixed time,
    `llmpar.evaluation.matmuls.launch_seconds`)."""
    profile = spec.training.profile
    return (profile.micro_batch_overhead_seconds * micro_batches
            + profile.step_overhead_seconds)


def product_rates(spec: Spec, rates: Rates) -> tuple[float, float]:
    """FLOP/s one GPU sustains on the linear layers' products and on attention's, each in
    its `[precision]` format (`llmpar.evaluation.matmuls.product_rate`)."""
    precision = spec.precision
    return (product_rate(spec, rates, precision.linear_format),
            product_rate(spec, rates, precision.attention_format))


def executed_flops(facts: TrainingFacts, composition: Composition) -> Value:
    """The FLOPs the GPUs execute in one step, all GPUs (what HFU counts): the model
    FLOPs, the reruns of recomputation, what the strategies add or skip, and a
    workload's other models' FLOPs."""
    return (facts.hardware_flops_per_step + composition.sum_of("extra_flops_per_step")
            - composition.sum_of("skipped_flops_per_step")
            + composition.sum_of("model_flops_per_step"))


def model_flops(facts: TrainingFacts, composition: Composition) -> Value:
    """The step's model FLOPs (what MFU counts): the trained model's and a workload's
    other models' (`Transform.model_flops_per_step`)."""
    return facts.flops_per_step + composition.sum_of("model_flops_per_step")


def _share(part: Value, whole: Value) -> Value:
    """part / whole, 0 where whole is 0."""
    return where(whole > 0, part / where(whole > 0, whole, 1.0), 0.0)


def cost_records(costs: Sequence[Cost], hardware: Hardware | None = None
                 ) -> tuple[tuple[CollectiveCost, ...], list[str]]:
    """The plan's collective records (one layout) and warnings for uncosted links."""
    records = []
    for cost in costs:
        collective = cost.collective
        if cost.calls == 0:
            continue
        records.append(CollectiveCost(
            strategy=collective.strategy, name=collective.name, operation=collective.operation,
            buffer_bytes=round(cost.buffer_bytes), group_size=collective.group_size,
            tier=cost.tier, calls_per_step=float(cost.calls), seconds=float(cost.seconds),
            exposed_seconds=float(cost.exposed), hides_behind=collective.hides_behind,
            reason=collective.reason, window_seconds=float(cost.window),
            pieces=None if not cost.piece else 1 / float(cost.piece),
            algorithm="" if hardware is None or not cost.costed
            else algorithm_of(collective, hardware, float(cost.buffer_bytes))))
    return tuple(records), uncosted_links(costs)


def uncosted_links(costs: Sequence[Cost]) -> list[str]:
    """Warnings for the collectives on a link [hardware] gives no bandwidth (one layout)."""
    return [f"{cost.collective.name}: no {cost.tier} bandwidth in [hardware]; not costed"
            for cost in costs if not cost.costed]


def communication_seconds(costs: Sequence[Cost]) -> float:
    """All communication of one step on one GPU (one layout): the sum of the seconds of
    `cost_records`' collectives, in their order."""
    return float(sum(float(cost.seconds) for cost in costs if cost.calls != 0))

