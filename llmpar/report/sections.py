"""The sections of a plan report as Tables of formatted cells. Formulas live
elsewhere; these only select and format the Plan's numbers."""

from __future__ import annotations

from collections.abc import Sequence

from llmpar.plan import Plan, RunGoodput
from llmpar.report.fields import format_gb_gib, format_size
from llmpar.report.serving import continuous, phases, serving, serving_memory
from llmpar.report.tables import Table
from llmpar.units import GB, GiB, format_count, format_duration

BUBBLE_WARNING_FRACTION = 0.2
"""Pipeline bubble, as a share of compute time, above which a report warns."""


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:,.2f}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GiB:,.2f}"


def header(plan: Plan) -> Table:
    layout = " x ".join(f"{name} {degree}" for name, degree in plan.layout.items())
    groups = ", ".join(f"{name} {format_count(count)}"
                       for name, count in plan.parameters_by_group.items() if count)
    parameters = f"parameters: {format_count(plan.parameters)}"
    if plan.active_parameters != plan.parameters:
        parameters += f" ({format_count(plan.active_parameters)} active per token)"
    notes = [f"layout: {layout or '-'}", parameters + (f"; {groups}" if groups else "")]
    notes += [f"{note.strategy}: {note.text}" for note in plan.notes]
    tuned = plan.training.finetune if plan.training is not None else None
    if tuned is not None:
        share = tuned.trainable_parameters / max(1, plan.parameters)
        notes.append(f"finetune: {tuned.method}, {format_count(tuned.trainable_parameters)} "
                     f"trainable ({share:.2%} of the model), "
                     f"{format_count(tuned.adapter_parameters)} in adapters")
    return Table(title=f"{plan.model} on {plan.num_gpus:,} x {plan.gpu}", columns=(),
                 notes=tuple(notes))


def _activations_label(plan: Plan) -> str:
    k = f", k = {plan.activation_k:.1f}" if plan.activation_k else ""
    return f"activations ({plan.activation_model}{k})"


def memory(plan: Plan) -> Table:
    """Per-GPU components in GB and GiB, each with its share of capacity."""
    parts = [("weights", plan.weights_bytes), ("gradients", plan.gradients_bytes),
             ("optimizer states", plan.optimizer_bytes)]
    if plan.activations_bytes is not None:
        parts.append((_activations_label(plan), plan.activations_bytes))
    if plan.buffers_bytes:
        parts.append(("buffers", plan.buffers_bytes))
    parts.append(("total", plan.total_bytes))
    capacity = plan.capacity_bytes
    rows = [(label, _gb(value), _gib(value), f"{value / capacity:.1%}") for label, value in parts]
    rows.append(("capacity", _gb(capacity), _gib(capacity), "100.0%"))
    bars = [value / capacity for _, value in parts] + [None]
    notes = []
    if plan.activations_bytes is None:
        notes.append("activations: not estimated (see warnings)")
    notes.append(f"{'fits' if plan.fits else 'DOES NOT FIT'}: "
                 f"{plan.total_bytes / capacity:.1%} of capacity (GB = 10^9 bytes, "
                 "GiB = 2^30 bytes)")
    if len(plan.stages) > 1:
        notes.append(f"pipeline stage {plan.peak_stage}, the one that needs the most memory")
    if plan.host_bytes:
        notes.append(f"host memory: {format_gb_gib(plan.host_bytes)} per GPU (offloaded)")
    return Table(title="Memory per GPU", columns=("", "GB", "GiB", "of capacity"),
                 rows=tuple(rows), bars=tuple(bars), marked=(len(parts) - 1,),
                 notes=tuple(notes))


PEAK_TOP = 4
"""Transient buffers the peak section lists by name (the rest are summed)."""


def memory_peak(plan: Plan) -> Table | None:
    """The step's peak as the framework allocates it: the three numbers a user can
    check, which torch call each compares with, and what is alive at the peak."""
    peak = plan.training.memory_peak if plan.training is not None else None
    if peak is None:
        return None
    capacity = plan.capacity_bytes
    parts = [("allocated peak", peak.allocated_bytes, "torch.cuda.max_memory_allocated()"),
             ("reserved peak", peak.reserved_bytes, "torch.cuda.max_memory_reserved()"),
             ("device memory", peak.device_bytes, "nvidia-smi (decides fits)")]
    rows = [(label, _gb(value), _gib(value), f"{value / capacity:.1%}", call)
            for label, value, call in parts]
    transients = sorted((b for b in peak.alive if b.transient), key=lambda b: -b.bytes)
    listed = ", ".join(f"{b.name} {_gib(b.bytes)} GiB" for b in transients[:PEAK_TOP])
    if len(transients) > PEAK_TOP:
        rest = sum(b.bytes for b in transients[PEAK_TOP:])
        listed += f", {len(transients) - PEAK_TOP} more {_gib(rest)} GiB"
    where = f"stage {peak.stage}, " if len(plan.stages) > 1 else ""
    notes = [f"peak at {where}{peak.moment}: steady state {_gib(peak.steady_bytes)} GiB"
             + (f" + {listed}" if listed else ""),
             f"NCCL buffers {_gib(peak.nccl_bytes)} GiB, cuBLAS workspace "
             f"{_gib(peak.workspace_bytes)} GiB, CUDA context {_gib(peak.cuda_context_bytes)} "
             "GiB; `llmpar explain SPEC peak_allocated_bytes`"]
    if peak.device_bytes > capacity >= plan.total_bytes:
        notes.append("the steady state fits, the peak does not")
    return Table(title="Memory peak per GPU (as the framework allocates it)",
                 columns=("", "GB", "GiB", "of capacity", "compare with"),
                 rows=tuple(rows), bars=tuple(value / capacity for _, value, _ in parts),
                 notes=tuple(notes), text_columns=(0, 4))


def saved_tensors(plan: Plan, top: int = 5) -> Table | None:
    per_layer = sorted((r for r in plan.activation_tensors if r.per_layer),
                       key=lambda r: r.bytes, reverse=True)
    if not per_layer:
        return None
    rows = tuple((r.name, r.shape, f"{r.bytes / GiB:,.3f}", r.reason) for r in per_layer[:top])
    return Table(title="Largest saved tensors of one layer (one micro-batch)",
                 columns=("tensor", "shape", "GiB", "why kept"), rows=rows,
                 text_columns=(0, 1, 3))


def compute(plan: Plan) -> Table:
    method = "exact count" if plan.flops_method == "exact" else "6ND"
    rows = [
        ("tokens per step", f"{plan.tokens_per_step:,}"),
        ("sequences x length", f"{plan.global_batch_size:,} x {plan.sequence_length:,}"),
        ("micro-batches x size, per replica", f"{plan.micro_batches_per_step:,} x "
                                              f"{plan.micro_batch_size:,}"),
        (f"model FLOPs per step ({method})", f"{plan.flops_per_step:.4g}"),
        ("6ND FLOPs per step", f"{plan.flops_per_step_6nd:.4g}"),
        ("hardware FLOPs per step", f"{plan.hardware_flops_per_step:.4g}"),
    ]
    if plan.step_seconds is not None:
        rows.append(("step time", format_duration(plan.step_seconds)))
    if plan.tokens_per_second is not None:
        rows.append(("tokens per second", f"{plan.tokens_per_second:,.0f}"))
    if plan.mfu is not None:
        rows.append(("MFU", f"{plan.mfu:.1%}"))
    if plan.hfu is not None:
        rows.append(("HFU", f"{plan.hfu:.1%}"))
    trust = plan.training.step_time_trust if plan.training is not None else ""
    framework = plan.training.framework if plan.training is not None else ""
    model = f"time model: {plan.time_model}" + (
        f"; framework profile: {framework}" if framework else "")
    notes = (model,) + ((f"step time: {trust}",) if trust else ())
    return Table(title="Compute", columns=("quantity", "value"), rows=tuple(rows),
                 notes=notes)


def _duration(seconds: float) -> str:
    return "0 s" if seconds == 0 else format_duration(seconds)


def _share(seconds: float, step: float | None) -> str:
    return f"{seconds / step:.1%}" if step else "-"


def time_breakdown(plan: Plan) -> Table | None:
    """compute + exposed communication + bubble + optimizer = step (modelled time)."""
    if plan.time_model != "modelled":
        return None
    step = plan.step_seconds
    parts = [("compute", plan.compute_seconds or 0.0),
             ("+ exposed communication", plan.exposed_communication_seconds),
             ("+ pipeline bubble", plan.bubble_seconds),
             ("+ optimizer step", plan.optimizer_seconds)]
    if plan.offload_seconds:
        parts.append(("+ exposed offload", plan.exposed_offload_seconds))
    overhead = plan.training.host_overhead_seconds if plan.training is not None else 0.0
    if overhead:
        parts.append(("+ host overhead", overhead))
    rows = [(label, _duration(value), _share(value, step)) for label, value in parts]
    rows.append(("= step", format_duration(step) if step is not None else "-",
                 "100.0%" if step else "-"))
    notes: tuple[str, ...] = (
        f"all communication {format_duration(plan.communication_seconds)}, "
        f"of which {format_duration(plan.exposed_communication_seconds)} exposed",
        f"bubble fraction {plan.bubble_fraction:.1%} of compute time")
    if plan.offload_seconds:
        notes += (f"host-link copies {format_duration(plan.offload_seconds)}, of which "
                  f"{format_duration(plan.exposed_offload_seconds)} exposed",)
    return Table(title="Step time", columns=("", "time", "of step"), rows=tuple(rows),
                 marked=(len(rows) - 1,), notes=notes)


def collectives(plan: Plan) -> Table | None:
    if not plan.collectives:
        return None
    rows = [(c.strategy, c.operation, c.tier, format_size(c.buffer_bytes), f"{c.group_size:,}",
             f"{c.calls_per_step:,.4g}", _duration(c.seconds),
             _duration(c.window_seconds) if c.window_seconds else "-",
             _duration(c.exposed_seconds)) for c in plan.collectives]
    rows.append(("total", "", "", "", "", "",
                 _duration(sum(c.seconds for c in plan.collectives)), "",
                 _duration(sum(c.exposed_seconds for c in plan.collectives))))
    return Table(title="Collectives per step, on one GPU",
                 columns=("strategy", "operation", "tier", "buffer", "group", "calls/step",
                          "time", "window", "exposed"),
                 rows=tuple(rows), marked=(len(rows) - 1,), text_columns=(0, 1, 2),
                 notes=("buffer: bytes each GPU contributes to one call (MB = 10^6 bytes)",
                        "window: the work it can hide behind, shared with the collectives "
                        "behind the same work (-: on the critical path; llmpar explain SPEC "
                        "exposed_communication_seconds)"))


def _in_flight(count: float) -> str:
    """Whole micro-batches as integers; interleaved schedules' fractions to 2 places."""
    return f"{count:.0f}" if count == int(count) else f"{count:.2f}"


def stages(plan: Plan) -> Table | None:
    if len(plan.stages) <= 1:
        return None
    rows, marked = [], []
    for i, s in enumerate(plan.stages):
        activations = _gib(s.activations_bytes) if s.activations_bytes is not None else "-"
        rows.append((str(s.stage), f"{s.layers:,}", _gib(s.weights_bytes),
                     _gib(s.gradients_bytes), _gib(s.optimizer_bytes), activations,
                     _gib(s.buffers_bytes), _gb(s.total_bytes), _gib(s.total_bytes),
                     _in_flight(s.micro_batches_in_flight)))
        if s.stage == plan.peak_stage:
            marked.append(i)
    return Table(title="Memory per pipeline stage (per GPU)",
                 columns=("stage", "layers", "weights GiB", "grads GiB", "optimizer GiB",
                          "activations GiB", "buffers GiB", "total GB", "total GiB",
                          "in flight"),
                 rows=tuple(rows), marked=tuple(marked),
                 notes=(f"* peak: stage {plan.peak_stage}", "in flight: micro-batches whose "
                        "activations a stage holds at its peak"))


def run(plan: Plan) -> Table | None:
    goodput = None if plan.training is None else plan.training.goodput
    if plan.train_tokens is None and goodput is None:
        return None
    rows = []
    if plan.train_tokens is not None:
        rows += [("tokens", f"{format_count(plan.train_tokens)}"),
                 ("steps", f"{plan.train_steps:,.0f}" if plan.train_steps is not None else "-"),
                 ("model FLOPs",
                  f"{plan.train_flops:.3g}" if plan.train_flops is not None else "-")]
    if plan.train_seconds is not None:
        steps_only = " (steps only)" if goodput is not None else ""
        rows.append(("time", f"{format_duration(plan.train_seconds)} on "
                             f"{plan.num_gpus:,} GPUs{steps_only}"))
    if plan.gpu_hours is not None:
        rows.append(("GPU-hours", f"{plan.gpu_hours:,.0f}"))
    if goodput is not None:
        rows += goodput_rows(goodput)
    return Table(title="Whole run", columns=("quantity", "value"), rows=tuple(rows))


def goodput_rows(goodput: RunGoodput) -> list[tuple[str, str]]:
    """Checkpoints, interruptions and the wall-clock time they imply."""
    rows = [("checkpoint", f"{format_size(goodput.checkpoint_bytes)}, written in "
                           f"{format_duration(goodput.checkpoint_write_seconds)}, stops "
                           f"training {format_duration(goodput.checkpoint_blocking_seconds)}")]
    if goodput.checkpoint_interval_seconds is not None:
        rows.append(("checkpoint every",
                     format_duration(goodput.checkpoint_interval_seconds)))
    if goodput.seconds_between_interruptions is not None:
        expected = ("" if goodput.interruptions is None
                    else f"; {goodput.interruptions:,.0f} over the run")
        rows.append(("interruptions", "one every "
                     f"{format_duration(goodput.seconds_between_interruptions)}, each losing "
                     f"{format_duration(goodput.lost_seconds_per_interruption)}{expected}"))
    rows.append(("goodput", f"{goodput.goodput_fraction:.1%}"))
    if goodput.wall_seconds is not None:
        rows.append(("wall time", format_duration(goodput.wall_seconds)))
    return rows


def report_warnings(plan: Plan) -> tuple[str, ...]:
    """The plan's warnings plus those a reader should not miss, unless the plan says them
    already: does not fit, a large pipeline bubble, communication that outlasts compute."""
    found = list(plan.warnings)

    def add(topic: str, text: str) -> None:
        if not any(topic in warning for warning in found):
            found.append(text)

    if not plan.fits:
        add("does not fit", f"does not fit: needs {plan.total_bytes / GiB:,.2f} GiB per GPU, "
                            f"has {plan.capacity_bytes / GiB:,.2f} GiB")
    if plan.bubble_fraction > BUBBLE_WARNING_FRACTION:
        add("bubble", f"pipeline bubble is {plan.bubble_fraction:.1%} of compute time (above "
                      f"{BUBBLE_WARNING_FRACTION:.0%}): more micro-batches per step or "
                      "interleaved stages shrink it")
    compute_seconds, exposed = plan.compute_seconds, plan.exposed_communication_seconds
    if compute_seconds and exposed > compute_seconds:
        add("exposed communication", f"exposed communication ({format_duration(exposed)}) "
                                     f"exceeds compute ({format_duration(compute_seconds)}) "
                                     "per step")
    return tuple(found)


def warnings(plan: Plan) -> Table | None:
    found = report_warnings(plan)
    return Table(title="Warnings", columns=(), notes=found) if found else None


def all_sections(plan: Plan, extra: Sequence[Table] = ()) -> tuple[Table, ...]:
    """Every section that has something to show, in report order; `extra` (plugins'
    sections, `llmpar_report_sections`) before the warnings."""
    built: tuple[Table | None, ...]
    if plan.workload == "inference":
        built = (header(plan), serving_memory(plan), serving(plan), continuous(plan),
                 phases(plan), collectives(plan))
    else:
        built = (header(plan), memory(plan), memory_peak(plan), stages(plan),
                 saved_tensors(plan), compute(plan),
                 time_breakdown(plan), collectives(plan), run(plan))
    return tuple(table for table in (*built, *extra, warnings(plan)) if table is not None)
