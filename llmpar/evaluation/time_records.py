"""What a Plan shows of one layout's step time: its parts and their derivations."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import attrs

from llmpar.evaluation.casts import casts_fp8, fp8_scaling
from llmpar.evaluation.launches import SOURCE as LAUNCHES_SOURCE
from llmpar.evaluation.launches import issues_host_time
from llmpar.evaluation.step_time import (
    ASSUMED_SOURCE,
    MODELLED_SOURCE,
    OFFLOAD_SOURCE,
    TimeCore,
    communication_seconds,
)
from llmpar.evaluation.timing import StepFlops
from llmpar.plan import CollectiveCost, Derivation
from llmpar.spec import Spec

if TYPE_CHECKING:
    from llmpar.evaluation.evaluate import Evaluation


@attrs.frozen(kw_only=True)
class StepTime:
    """The step-time fields of a training plan (`step_time_record`); its collectives'
    records are the plan's own (`cost_records`)."""

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
    host_overhead_seconds: float = 0.0
    issue_seconds: float = 0.0
    launch_bound_seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    derivations: tuple[Derivation, ...] = ()


class _CommonFields(TypedDict):
    """The StepTime fields every time model fills the same way."""

    communication_seconds: float
    offload_seconds: float
    bubble_fraction: float


def step_time_record(spec: Spec, core: Evaluation, warnings: list[str], flops: StepFlops,
                     collectives: tuple[CollectiveCost, ...] | None = None) -> StepTime:
    """The plan's step-time fields of one evaluated layout; their derivations
    (`step_time_derivations`) only when given the collectives' records (`cost_records`)."""
    time: TimeCore = core.time
    host = time.host
    common = _CommonFields(communication_seconds=communication_seconds(time.costs),
                           offload_seconds=float(host.seconds),
                           bubble_fraction=float(time.bubble_fraction))
    gpu = spec.hardware.gpu
    warnings = list(warnings)
    derivations = (() if collectives is None
                   else step_time_derivations(spec, core, collectives, flops))
    if time.time_model == "none":
        if gpu.peak_flops_per_s(spec.precision.compute) is None:
            warnings.append(f"GPU {gpu.name!r} states no {spec.precision.compute} peak; "
                            "no step time")
        else:
            warnings.append("no utilization known: set [training] mfu, or use a GPU preset "
                            "with achievable_mfu or efficiencies; no step time")
        return StepTime(time_model="none", step_seconds=None, warnings=tuple(warnings),
                        derivations=derivations, **common)
    assert time.step is not None
    step = float(time.step)
    if time.time_model == "assumed-mfu":
        return StepTime(time_model="assumed-mfu", step_seconds=step,
                        exposed_offload_seconds=float(time.exposed_host),
                        warnings=tuple(warnings), derivations=derivations, **common)
    assert time.compute is not None
    exposed, compute = float(time.exposed), float(time.compute)
    if exposed > compute:
        warnings.append(f"exposed communication ({exposed:.3g} s) exceeds compute "
                        f"({compute:.3g} s)")
    return StepTime(time_model="modelled", step_seconds=step, compute_seconds=compute,
                    exposed_communication_seconds=exposed,
                    bubble_seconds=float(time.bubble), optimizer_seconds=float(time.optimizer),
                    exposed_offload_seconds=float(time.exposed_host),
                    host_overhead_seconds=float(time.overhead),
                    issue_seconds=float(time.issue), launch_bound_seconds=float(time.launch_bound),
                    warnings=tuple(warnings), derivations=derivations, **common)


def step_time_derivations(spec: Spec, core: Evaluation,
                          collectives: tuple[CollectiveCost, ...],
                          flops: StepFlops) -> tuple[Derivation, ...]:
    """How the step time of `step_time_record` was derived: the step, the exposed
    communication, the offloaded work and the host overheads."""
    time: TimeCore = core.time
    host = time.host
    offload = _offload_derivation(core) if host.by_work else ()
    gpu = spec.hardware.gpu
    if time.time_model == "none":
        return offload
    assert time.step is not None
    step = float(time.step)
    if time.time_model == "assumed-mfu":
        inputs: dict[str, float | int | str] = {
            "flops_per_step": flops.flops_per_step, "num_gpus": spec.hardware.num_gpus,
            f"peak_{spec.precision.compute}_flops_per_s":
                gpu.peak_flops_per_s(spec.precision.compute) or 0.0,
            "mfu": time.mfu or 0.0, "framework_profile": spec.training.profile.name}
        rule = "flops_per_step / (num_gpus * peak * mfu)"
        if host.seconds:
            rule += " + exposed offload"
            inputs["exposed_offload_seconds"] = float(time.exposed_host)
        derivation = Derivation(quantity="step_seconds", value=step, unit="s", rule=rule,
                                source=f"{ASSUMED_SOURCE}; mfu from {time.mfu_source}",
                                inputs=inputs)
        return (derivation,) + offload
    assert time.compute is not None
    exposed, compute = float(time.exposed), float(time.compute)
    rule = "compute + exposed communication + bubble * compute + optimizer step"
    inputs = {"matmul_seconds": float(time.matmul), "matmul_shape_seconds": float(time.shape_loss),
              "slowest_stage_factor": float(time.slowest),
              "elementwise_bytes": float(time.elementwise_bytes), "compute_seconds": compute,
              "exposed_communication_seconds": exposed,
              "bubble_fraction": float(time.bubble_fraction),
              "optimizer_seconds": float(time.optimizer),
              "matmul_efficiency": gpu.matmul_efficiency or 0.0,
              "memory_efficiency": gpu.memory_efficiency or 0.0,
              "framework_profile": spec.training.profile.name}
    if host.seconds:
        rule += " + exposed offload"
        inputs.update(exposed_offload_seconds=float(time.exposed_host),
                      optimizer_share_on_gpu=float(time.on_gpu))
    efficiencies = gpu.efficiency_source
    if time.attention_rates is not None:
        forward, backward = time.attention_rates
        inputs.update(attention_kernel=forward.kernel,
                      attention_seconds=float(time.windows["attention"]),
                      attention_forward_efficiency=forward.compute_efficiency,
                      attention_backward_efficiency=backward.compute_efficiency)
        efficiencies += (f"; attention at its kernel's measured rates "
                         f"(llmpar.evaluation.attention): {forward.source}")
    if casts_fp8(spec):
        inputs.update(fp8_cast_bytes=float(time.cast_bytes), fp8_scaling=fp8_scaling(spec))
    overhead = _overhead_derivation(spec, time)
    if overhead:
        rule += " + host overhead"
        inputs["host_overhead_seconds"] = float(time.overhead)
    derivation = Derivation(quantity="step_seconds", value=step, unit="s", rule=rule,
                            source=f"{MODELLED_SOURCE}; efficiencies: {efficiencies}",
                            inputs=inputs)
    hidden = _exposed_derivation(time, collectives) if collectives else ()
    return (derivation,) + hidden + offload + overhead


def _overhead_derivation(spec: Spec, time: TimeCore) -> tuple[Derivation, ...]:
    """Where the framework profile's host overheads come from (none when all are 0)."""
    profile = spec.training.profile
    launches = _launch_derivation(spec, time)
    if not (profile.kernel_overhead_seconds or profile.micro_batch_overhead_seconds
            or profile.step_overhead_seconds):
        return launches
    return (Derivation(
        quantity="host_overhead_seconds", value=float(time.overhead), unit="s",
        rule=("micro_batch_overhead_seconds * micro-batches + step_overhead_seconds "
              "+ launch_bound_seconds; kernel_overhead_seconds is paid per launch inside "
              "matmul_shape_seconds"),
        source=f"framework profile {profile.name!r}: {profile.overhead_source}",
        inputs={"micro_batch_overhead_seconds": profile.micro_batch_overhead_seconds,
                "step_overhead_seconds": profile.step_overhead_seconds,
                "kernel_overhead_seconds": profile.kernel_overhead_seconds,
                "launch_bound_seconds": float(time.launch_bound)}),) + launches


def _launch_derivation(spec: Spec, time: TimeCore) -> tuple[Derivation, ...]:
    """How issuing the kernels becomes exposed host time (none for a profile that states
    no host time of its launches)."""
    profile = spec.training.profile
    if not issues_host_time(profile):
        return ()
    assert time.compute is not None
    return (Derivation(
        quantity="launch_bound_seconds", value=float(time.launch_bound), unit="s",
        rule=("max(0, issue_seconds - compute_seconds): the host issues kernels ahead of the "
              "GPU and the GPU waits only for what issuing takes beyond its work; "
              "issue_seconds = micro-batches x (launches x host_seconds_per_kernel + layer "
              "passes x host_seconds_per_layer), or CUDA graph replays x "
              f"graph_launch_seconds (cuda_graphs = {profile.cuda_graphs!r})"),
        source=f"{LAUNCHES_SOURCE}; the host times: the framework profile's host_source",
        inputs={"issue_seconds": float(time.issue), "compute_seconds": float(time.compute),
                "host_seconds_per_kernel": profile.host_seconds_per_kernel,
                "host_seconds_per_layer": profile.host_seconds_per_layer,
                "elementwise_kernels_per_layer": profile.elementwise_kernels_per_layer,
                "graph_launch_seconds": profile.graph_launch_seconds,
                "cuda_graphs": profile.cuda_graphs, "framework_profile": profile.name}),)


def _exposed_derivation(time: TimeCore, collectives: tuple[CollectiveCost, ...]
                        ) -> tuple[Derivation, ...]:
    """How each collective's exposed part follows from the window it hides behind."""
    inputs: dict[str, float | int | str] = {
        f"{kind}_work_seconds": float(time.windows[kind])
        for kind in dict.fromkeys(c.hides_behind for c in collectives)}
    for c in collectives:
        inputs[f"{c.name}_seconds"] = c.seconds
        if c.pieces is not None:
            inputs[f"{c.name}_pieces"] = c.pieces
        inputs[f"{c.name}_window_seconds"] = c.window_seconds
        inputs[f"{c.name}_exposed_seconds"] = c.exposed_seconds
    return (Derivation(
        quantity="exposed_communication_seconds", value=float(time.exposed), unit="s",
        rule=("sum of each collective's exposed_seconds; the collectives that hide behind "
              "one kind of work share its window: exposed = unhidden + hideable * "
              "max(0, sum of hideable - window) / sum of hideable, where unhidden = "
              "seconds * (1 - overlap) + one piece (seconds * overlap / pieces) and window "
              "= that work less the part before the first piece is ready (work * (1 - the "
              "smallest share of its collective one piece takes among them)); all hidden "
              "parts together at most compute_seconds"),
        source=("llmpar.evaluation.step_time.hide_costs; the work "
                "(llmpar.evaluation.step_time.overlap_windows): last-backward and "
                "first-forward = compute / micro-batches x the backward (forward) share of "
                "the executed FLOPs; layers and compute = compute_seconds; attention = "
                "the attention products' time; projections = the matrix products' time "
                "less attention's; pieces and overlap from each strategy's Collective "
                "(Megatron-Core's gradient buckets, FSDP's per-layer units, chunked "
                "tensor-parallel collectives); a collective's compute_share of each second "
                "it hides is exposed"),
        inputs=inputs),)


def _offload_derivation(core: Evaluation) -> tuple[Derivation, ...]:
    time = core.time
    work = core.composition.host_work
    host = time.host
    overlappable = float(host.overlappable)
    inputs: dict[str, float | int | str] = {f"{w.name}_seconds": float(s)
                                            for w, s in zip(work, host.by_work)}
    inputs.update(overlappable_seconds=overlappable,
                  stage=core.kinds.representatives[int(host.kind)].index)
    return (Derivation(
        quantity="offload_seconds", value=float(host.seconds), unit="s",
        rule=("sum over host work of passes_per_step * P * seconds_per_parameter, P the "
              "component's parameters on one GPU after shards; exposed = total - "
              "min(overlappable part, compute)"),
        source=OFFLOAD_SOURCE + "; ".join(f"{w.name}: {w.reason}" for w in work),
        inputs=inputs),)
