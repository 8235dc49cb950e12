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
    exposed   = communication not hidden behind compute (each collective states
                the share of it that can overlap and the work it hides behind;
                hiding is capped by that work: ring attention's exchange by the
                attention products' time, everything by compute)
    bubble    = bubble_fraction * compute (pipeline schedules)
    optimizer = optimizer-step bytes / (HBM bandwidth * memory_efficiency), for the
                optimizer states on the GPU (offloaded ones are updated by the host)
    offload   = host work on offloaded states not hidden behind compute
                (llmpar.evaluation.offload; 0 without offloading)
    step      = compute + exposed + bubble + optimizer + offload
Elementwise bytes: every saved activation is written and read in the forward
pass and read with its gradient written and read in the backward pass, 4 passes
over the inventory (6 with full recomputation, which runs the forward twice).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llmpar.communication.collectives import call_seconds
from llmpar.evaluation.balance import slowest_stage_factor
from llmpar.evaluation.matmuls import RankShape, shape_loss_seconds
from llmpar.evaluation.memory import Memory, split_inventory, stages_of
from llmpar.evaluation.offload import OffloadTime, host_work_time, offloaded_share
from llmpar.evaluation.timing import StepFlops
from llmpar.footprint.baseline import Footprint
from llmpar.plan import CollectiveCost, Derivation
from llmpar.roofline import rates_of
from llmpar.spec import Spec
from llmpar.strategy import Layout, Transform

ASSUMED_SOURCE = ("T = C / (n * F_peak * MFU), the founding document's training-time rule; "
                  "Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1")
MODELLED_SOURCE = ("llmpar.evaluation.step_time: compute + exposed communication + bubble + "
                   "optimizer")
ELEMENTWISE_PASSES = 4
ADAM_STEP_PASSES = 2
"""The optimizer reads and writes its states and the weights once each, and reads the
gradients (a fused Adam kernel, e.g. apex FusedAdam / torch `fused=True`)."""


@attrs.frozen(kw_only=True)
class StepTime:
    time_model: str
    step_seconds: float | None
    compute_seconds: float | None = None
    communication_seconds: float = 0.0
    exposed_communication_seconds: float = 0.0
    bubble_fraction: float = 0.0
    bubble_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    offload_seconds: float = 0.0
    exposed_offload_seconds: float = 0.0
    collectives: tuple[CollectiveCost, ...] = ()
    warnings: tuple[str, ...] = ()
    derivations: tuple[Derivation, ...] = ()


def cost_collectives(spec: Spec, transforms: list[Transform]) -> tuple[list[CollectiveCost],
                                                                        list[str]]:
    """Every collective still in force, costed on its link, for one step on one GPU."""
    replaced = {name for t in transforms for name in t.replaces}
    costs, warnings = [], []
    for transform in transforms:
        for collective in transform.collectives:
            if collective.name in replaced or collective.group_size <= 1:
                continue
            per_call, tier = call_seconds(collective, spec.hardware)
            if per_call is None:
                warnings.append(f"{collective.name}: no {tier} bandwidth in [hardware]; "
                                "not costed")
                per_call = 0.0
            seconds = per_call * collective.calls_per_step
            costs.append(CollectiveCost(
                strategy=collective.strategy, operation=collective.operation,
                buffer_bytes=round(collective.buffer_bytes), group_size=collective.group_size,
                tier=tier, calls_per_step=collective.calls_per_step, seconds=seconds,
                exposed_seconds=seconds * (1 - collective.overlap),
                hides_behind=collective.hides_behind, reason=collective.reason))
    return costs, warnings


def _cap(costs: list[CollectiveCost], work: float,
         selected: Callable[[CollectiveCost], bool]) -> list[CollectiveCost]:
    """Cap the hidden share of the selected collectives at the work they hide behind,
    scaling each one's hidden share alike."""
    hideable = sum(c.seconds - c.exposed_seconds for c in costs if selected(c))
    if hideable <= work or hideable == 0:
        return costs
    scale = work / hideable
    return [attrs.evolve(c, exposed_seconds=c.seconds - (c.seconds - c.exposed_seconds) * scale)
            if selected(c) else c for c in costs]


def hide(costs: list[CollectiveCost], compute: float,
         attention: float) -> list[CollectiveCost]:
    """Hide what overlaps behind the work it can overlap: what hides behind attention at
    most the attention's time, and all of it together at most the compute."""
    costs = _cap(costs, attention, lambda c: c.hides_behind == "attention")
    return _cap(costs, compute, lambda c: True)


def materialized_scores(footprint: Footprint) -> bool:
    """Whether attention runs as eager products over materialized scores (activation
    models that keep the scores), not FlashAttention."""
    return footprint.activations is not None and footprint.activations.has_attention_scores


def rank_shape(spec: Spec, layout: Layout) -> RankShape:
    context = spec.parallel.get("context")
    return RankShape(tensor=layout.degree("tensor"), context=layout.degree("context"),
                     expert=layout.degree("expert"), expert_tensor=layout.expert_tensor,
                     micro_batch_size=spec.training.micro_batch_size,
                     context_ring=getattr(context, "kind", "ring") == "ring")


def _elementwise_bytes(spec: Spec, footprint: Footprint, layout: Layout,
                       transforms: list[Transform], micro_batches: int) -> float:
    if footprint.activations is None:
        return 0.0
    per_gpu = split_inventory(footprint.activations, transforms).total_bytes
    passes = ELEMENTWISE_PASSES + (2 if spec.training.recompute == "full" else 0)
    return passes * per_gpu / layout.degree("pipeline") * micro_batches


def step_time(spec: Spec, footprint: Footprint, layout: Layout, flops: StepFlops,
              transforms: list[Transform], memory: Memory, micro_batches: int) -> StepTime:
    """How long one optimizer step takes, and why."""
    gpu, n = spec.hardware.gpu, spec.hardware.num_gpus
    peak = gpu.peak_flops_per_s(spec.precision.compute)
    costs, warnings = cost_collectives(spec, transforms)
    bubble = sum(t.bubble_fraction for t in transforms)
    communication = sum(c.seconds for c in costs)
    offload = host_work_time(spec, footprint, transforms)
    if peak is None:
        warnings.append(f"GPU {gpu.name!r} states no {spec.precision.compute} peak; no step time")
        return StepTime(time_model="none", step_seconds=None, collectives=tuple(costs),
                        communication_seconds=communication, offload_seconds=offload.seconds,
                        warnings=tuple(warnings), derivations=offload.derivations)
    mfu, mfu_source = spec.training.mfu, "[training] mfu"
    modelled = (mfu is None and gpu.matmul_efficiency is not None
                and gpu.memory_efficiency is not None and gpu.hbm_bandwidth_bytes_per_s)
    if not modelled:
        if mfu is None and gpu.achievable_mfu is not None:
            mfu, mfu_source = gpu.achievable_mfu, f"GPU preset: {gpu.achievable_mfu_source}"
        if mfu is None:
            warnings.append("no utilization known: set [training] mfu, or use a GPU preset "
                            "with achievable_mfu or efficiencies; no step time")
            return StepTime(time_model="none", step_seconds=None, collectives=tuple(costs),
                            communication_seconds=communication, offload_seconds=offload.seconds,
                            warnings=tuple(warnings), derivations=offload.derivations)
        assumed = flops.flops_per_step / (n * peak * mfu)
        exposed_offload = offload.exposed(assumed)
        step = assumed + exposed_offload
        inputs = {"flops_per_step": flops.flops_per_step, "num_gpus": n,
                  f"peak_{spec.precision.compute}_flops_per_s": peak, "mfu": mfu}
        rule = "flops_per_step / (num_gpus * peak * mfu)"
        if offload.seconds:
            rule += " + exposed offload"
            inputs["exposed_offload_seconds"] = exposed_offload
        return StepTime(
            time_model="assumed-mfu", step_seconds=step, collectives=tuple(costs),
            communication_seconds=communication, bubble_fraction=bubble,
            offload_seconds=offload.seconds, exposed_offload_seconds=exposed_offload,
            warnings=tuple(warnings),
            derivations=(Derivation(
                quantity="step_seconds", value=step, unit="s", rule=rule,
                source=f"{ASSUMED_SOURCE}; mfu from {mfu_source}",
                inputs=inputs),) + offload.derivations)
    return _modelled(spec, footprint, layout, flops, transforms, memory, micro_batches, peak,
                     costs, bubble, warnings, offload)


def _modelled(spec: Spec, footprint: Footprint, layout: Layout, flops: StepFlops,
              transforms: list[Transform], memory: Memory, micro_batches: int, peak: float,
              costs: list[CollectiveCost], bubble: float, warnings: list[str],
              offload: OffloadTime) -> StepTime:
    gpu, n = spec.hardware.gpu, spec.hardware.num_gpus
    assert gpu.matmul_efficiency and gpu.memory_efficiency and gpu.hbm_bandwidth_bytes_per_s
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
    rate = peak * gpu.matmul_efficiency
    shape_loss = shape_loss_seconds(
        spec, rank_shape(spec, layout), rates_of(gpu), spec.training.recompute,
        memory.recomputed_fraction, materialized_scores(footprint)
    ) / layout.degree("pipeline") * micro_batches
    stages = stages_of(spec, transforms)
    slowest = slowest_stage_factor(spec, stages, memory.recomputed_fraction)
    matmul = flops.hardware_flops_per_step / n / rate * slowest + shape_loss
    elementwise = _elementwise_bytes(spec, footprint, layout, transforms, micro_batches)
    compute = matmul + elementwise / bandwidth
    costs = hide(costs, compute, flops.attention_hardware_flops_per_step / n / rate)
    exposed = sum(c.exposed_seconds for c in costs)
    peak_stage = memory.peak
    optimizer_traffic = (ADAM_STEP_PASSES * (peak_stage.optimizer_bytes + peak_stage.weights_bytes)
                         + peak_stage.gradients_bytes)
    stage = stages[peak_stage.stage]
    on_gpu = 1 - offloaded_share(spec, footprint, stage, transforms, "optimizer")
    optimizer = optimizer_traffic * on_gpu / bandwidth
    bubble_seconds = bubble * compute
    exposed_offload = offload.exposed(compute)
    step = compute + exposed + bubble_seconds + optimizer + exposed_offload
    if exposed > compute:
        warnings.append(f"exposed communication ({exposed:.3g} s) exceeds compute "
                        f"({compute:.3g} s)")
    rule = "compute + exposed communication + bubble * compute + optimizer step"
    inputs = {"matmul_seconds": matmul, "matmul_shape_seconds": shape_loss,
              "slowest_stage_factor": slowest,
              "elementwise_bytes": elementwise,
              "compute_seconds": compute, "exposed_communication_seconds": exposed,
              "bubble_fraction": bubble, "optimizer_seconds": optimizer,
              "matmul_efficiency": gpu.matmul_efficiency,
              "memory_efficiency": gpu.memory_efficiency}
    if offload.seconds:
        rule += " + exposed offload"
        inputs.update(exposed_offload_seconds=exposed_offload, optimizer_share_on_gpu=on_gpu)
    derivation = Derivation(
        quantity="step_seconds", value=step, unit="s", rule=rule,
        source=f"{MODELLED_SOURCE}; efficiencies: {gpu.efficiency_source}",
        inputs=inputs)
    return StepTime(time_model="modelled", step_seconds=step, compute_seconds=compute,
                    communication_seconds=sum(c.seconds for c in costs),
                    exposed_communication_seconds=exposed, bubble_fraction=bubble,
                    bubble_seconds=bubble_seconds, optimizer_seconds=optimizer,
                    offload_seconds=offload.seconds, exposed_offload_seconds=exposed_offload,
                    collectives=tuple(costs), warnings=tuple(warnings),
                    derivations=(derivation,) + offload.derivations)
