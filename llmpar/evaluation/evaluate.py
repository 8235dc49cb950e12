"""evaluate: spec -> baseline footprint -> strategy transforms -> Plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llmpar.dtypes import bytes_per_element
from llmpar.errors import PluginError
from llmpar.evaluation.memory import per_gpu_memory
from llmpar.evaluation.offload import host_memory_warning
from llmpar.evaluation.step_time import StepTime, step_time
from llmpar.evaluation.timing import StepFlops, run_length, step_flops
from llmpar.footprint.baseline import Footprint, baseline_footprint
from llmpar.plan import Derivation, Plan
from llmpar.spec import Spec
from llmpar.strategy import Layout, StrategyContext, Transform

if TYPE_CHECKING:
    from llmpar.strategy import Strategy


def transforms_of(spec: Spec, footprint: Footprint, layout: Layout,
                  strategies: Mapping[str, Strategy]) -> list[Transform]:
    """Each active strategy's transform, by phase then name (never plugin order)."""
    ctx = StrategyContext(spec=spec, footprint=footprint, layout=layout)
    transforms = []
    for name in sorted(spec.parallel, key=lambda n: (strategies[n].phase, n)):
        strategy = strategies[name]
        try:
            transform = strategy.transform(spec.parallel[name], ctx)
        except Exception as exc:
            raise PluginError(f"strategy {name!r} failed to transform the spec: "
                              f"{type(exc).__name__}: {exc}") from exc
        transforms.append(transform)
    return transforms


def activation_k(spec: Spec, footprint: Footprint) -> float | None:
    """The founding document's k = M / (b * s * L * h * d), before recompute or splits."""
    model, training = spec.model, spec.training
    if footprint.activations is None or model.hidden_size is None or not model.num_layers:
        return None
    d = bytes_per_element(spec.precision.activations)
    denominator = (training.micro_batch_size * training.sequence_length * model.num_layers
                   * model.hidden_size * d)
    return footprint.activations.total_bytes / denominator


def _micro_batches(transforms: list[Transform]) -> int:
    counts = [t.micro_batches_per_step for t in transforms if t.micro_batches_per_step]
    return counts[0] if counts else 1


def _utilization(flops: StepFlops, time: StepTime, spec: Spec) -> tuple[float | None,
                                                                        float | None]:
    peak = spec.hardware.gpu.peak_flops_per_s(spec.precision.compute)
    if time.step_seconds is None or peak is None:
        return None, None
    capacity = spec.hardware.num_gpus * peak * time.step_seconds
    return flops.flops_per_step / capacity, flops.hardware_flops_per_step / capacity


def _warnings(spec: Spec, footprint: Footprint, transforms: list[Transform], total: int,
              capacity: int, time: StepTime) -> list[str]:
    warnings = list(time.warnings)
    if footprint.activations_unavailable:
        warnings.append(f"no activation estimate: {footprint.activations_unavailable}; "
                        "total_bytes and fits count model states only")
    inventory = footprint.activations
    selective = spec.training.recompute == "selective"
    if selective and inventory is not None and not inventory.has_attention_scores:
        warnings.append(f"selective recomputation changes nothing: the {inventory.model!r} "
                        "activation model keeps no attention scores")
    if total > capacity:
        warnings.append(f"does not fit: needs {total / 2**30:,.2f} GiB per GPU, "
                        f"has {capacity / 2**30:,.2f} GiB")
    for transform in transforms:
        warnings += [f"{transform.strategy}: {text}" for text in transform.warnings]
    return warnings


def build_plan(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy]) -> Plan:
    """Compose the plan of a validated spec under a resolved layout."""
    footprint = baseline_footprint(spec)
    transforms = transforms_of(spec, footprint, layout, strategies)
    memory = per_gpu_memory(spec, footprint, transforms)
    extra = sum(t.extra_flops_per_step for t in transforms)
    flops = step_flops(spec, footprint, layout.degree("data"), extra, memory.recomputed_fraction)
    micro_batches = _micro_batches(transforms)
    time = step_time(spec, footprint, layout, flops, transforms, memory, micro_batches)
    source = time.derivations[0].source if time.derivations else ""
    run = run_length(spec, footprint.parameters.total, flops, time.step_seconds, source)
    peak, capacity = memory.peak, spec.hardware.gpu.memory_bytes
    mfu, hfu = _utilization(flops, time, spec)
    total_rule = Derivation(
        quantity="total_bytes", value=peak.total_bytes, unit="bytes",
        rule="weights + gradients + optimizer + activations + buffers of the peak stage",
        source="sum of the per-GPU components above",
        inputs={"capacity_bytes": capacity, "peak_stage": peak.stage})
    host_bytes = max(stage.host_bytes for stage in memory.stages)
    host_rules = (Derivation(
        quantity="host_bytes", value=host_bytes, unit="bytes",
        rule=("offloaded components' bytes on one GPU after shards (busiest stage), taken "
              "out of weights, gradients and optimizer bytes"),
        source="the strategies' Transform.offloads: " + "; ".join(
            f"{o.component}: {o.reason}" for t in transforms for o in t.offloads),
        inputs={"gpus_per_node": spec.hardware.gpus_per_node}),) if host_bytes else ()
    return Plan(
        model=spec.model.name, gpu=spec.hardware.gpu.name, num_gpus=spec.hardware.num_gpus,
        layout=dict(layout.degrees),
        weights_bytes=peak.weights_bytes, gradients_bytes=peak.gradients_bytes,
        optimizer_bytes=peak.optimizer_bytes, activations_bytes=peak.activations_bytes,
        buffers_bytes=peak.buffers_bytes, total_bytes=peak.total_bytes, capacity_bytes=capacity,
        fits=peak.total_bytes <= capacity, host_bytes=host_bytes,
        parameters=round(footprint.parameters.total),
        active_parameters=round(footprint.parameters.active),
        parameters_by_group=dict(footprint.parameters.by_group),
        sequence_length=spec.training.sequence_length,
        micro_batch_size=spec.training.micro_batch_size,
        global_batch_size=flops.global_batch_size, micro_batches_per_step=micro_batches,
        tokens_per_step=flops.tokens_per_step, flops_per_step=flops.flops_per_step,
        flops_per_step_6nd=flops.flops_per_step_6nd, flops_method=flops.flops_method,
        hardware_flops_per_step=flops.hardware_flops_per_step,
        step_seconds=time.step_seconds,
        tokens_per_second=(None if time.step_seconds is None
                           else flops.tokens_per_step / time.step_seconds),
        mfu=mfu, hfu=hfu, train_tokens=run.train_tokens, train_steps=run.train_steps,
        train_flops=run.train_flops, train_seconds=run.train_seconds, gpu_hours=run.gpu_hours,
        activation_model=spec.training.activation_model,
        activation_k=activation_k(spec, footprint),
        activation_tensors=memory.activation_tensors,
        time_model=time.time_model, compute_seconds=time.compute_seconds,
        communication_seconds=time.communication_seconds,
        exposed_communication_seconds=time.exposed_communication_seconds,
        bubble_fraction=time.bubble_fraction, bubble_seconds=time.bubble_seconds,
        optimizer_seconds=time.optimizer_seconds, offload_seconds=time.offload_seconds,
        exposed_offload_seconds=time.exposed_offload_seconds, collectives=time.collectives,
        peak_stage=peak.stage, stages=memory.stages,
        warnings=tuple(_warnings(spec, footprint, transforms, peak.total_bytes, capacity, time)
                       + host_memory_warning(spec, host_bytes)),
        derivations=(memory.derivations + (total_rule,) + host_rules + flops.derivations
                     + time.derivations + run.derivations),
    )
