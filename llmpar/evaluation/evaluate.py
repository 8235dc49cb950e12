"""evaluate: spec -> baseline footprint -> strategy transforms -> Plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llmpar.dtypes import bytes_per_element
from llmpar.errors import PluginError
from llmpar.evaluation.memory import per_gpu_memory
from llmpar.evaluation.timing import step_compute
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


def build_plan(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy]) -> Plan:
    """Compose the plan of a validated spec under a resolved layout."""
    footprint = baseline_footprint(spec)
    transforms = transforms_of(spec, footprint, layout, strategies)
    memory = per_gpu_memory(spec, footprint, transforms)
    compute = step_compute(spec, footprint, layout.degree("data"), transforms)
    capacity = spec.hardware.gpu.memory_bytes
    total = memory.total_bytes
    warnings = list(compute.warnings)
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
    fits_rule = Derivation(
        quantity="total_bytes", value=total, unit="bytes",
        rule="weights + gradients + optimizer + activations + buffers",
        source="sum of the per-GPU components above",
        inputs={"capacity_bytes": capacity})
    return Plan(
        model=spec.model.name, gpu=spec.hardware.gpu.name, num_gpus=spec.hardware.num_gpus,
        layout=dict(layout.degrees),
        weights_bytes=memory.weights_bytes, gradients_bytes=memory.gradients_bytes,
        optimizer_bytes=memory.optimizer_bytes, activations_bytes=memory.activations_bytes,
        buffers_bytes=memory.buffers_bytes, total_bytes=total, capacity_bytes=capacity,
        fits=total <= capacity,
        parameters=round(footprint.parameters.total),
        active_parameters=round(footprint.parameters.active),
        parameters_by_group=dict(footprint.parameters.by_group),
        sequence_length=spec.training.sequence_length,
        micro_batch_size=spec.training.micro_batch_size,
        global_batch_size=compute.global_batch_size,
        micro_batches_per_step=compute.micro_batches_per_step,
        tokens_per_step=compute.tokens_per_step, flops_per_step=compute.flops_per_step,
        flops_per_step_6nd=compute.flops_per_step_6nd, flops_method=compute.flops_method,
        hardware_flops_per_step=compute.hardware_flops_per_step,
        step_seconds=compute.step_seconds, tokens_per_second=compute.tokens_per_second,
        mfu=compute.mfu, hfu=compute.hfu, train_tokens=compute.train_tokens,
        train_steps=compute.train_steps, train_flops=compute.train_flops,
        train_seconds=compute.train_seconds, gpu_hours=compute.gpu_hours,
        activation_model=spec.training.activation_model,
        activation_k=activation_k(spec, footprint),
        activation_tensors=memory.activation_tensors,
        warnings=tuple(warnings),
        derivations=memory.derivations + (fits_rule,) + compute.derivations,
    )
