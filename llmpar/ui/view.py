"""What the page draws of a plan, as plain data: every number is the Plan's (or the
session's memory timeline), labelled and formatted here, so the page's script only lays
it out. Bars carry the raw bytes or seconds beside the formatted text; the page scales
them to the largest value shown and to the GPU's capacity, nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmpar.evaluation.peak import ACTIVE_MOMENTS, MemoryMoment
from llmpar.plan import Plan
from llmpar.plot import COMPONENTS, serving_times
from llmpar.report.fields import format_gb_gib, format_size
from llmpar.report.sections import all_sections
from llmpar.report.tables import Table
from llmpar.spec import Spec
from llmpar.units import format_duration


def _bytes(label: str, num_bytes: float | None) -> dict[str, Any]:
    value = num_bytes or 0
    return {"label": label, "value": value, "text": format_gb_gib(value)}


def _seconds(label: str, seconds: float | None) -> dict[str, Any]:
    return {"label": label, "value": seconds,
            "text": "-" if seconds is None else
            ("0 s" if seconds == 0 else format_duration(seconds))}


def _number(label: str, value: float | None, text: str, key: str) -> dict[str, Any]:
    return {"label": label, "value": value, "text": text, "key": key}


def _components(record: object) -> list[dict[str, Any]]:
    """The stacked components of a plan or a stage (those it has), bottom to top."""
    return [_bytes(label, getattr(record, field, None)) for label, field in COMPONENTS
            if getattr(record, field, None)]


def memory_view(plan: Plan) -> dict[str, Any]:
    """Per-GPU memory of the peak stage by component, and of each pipeline stage."""
    return {"components": _components(plan), "total": _bytes("total", plan.total_bytes),
            "capacity": _bytes("capacity", plan.capacity_bytes), "fits": plan.fits,
            "peak_stage": plan.peak_stage,
            "stages": [{"stage": s.stage, "layers": s.layers, "components": _components(s),
                        "total": _bytes(f"stage {s.stage}", s.total_bytes),
                        "in_flight": s.micro_batches_in_flight}
                       for s in plan.stages] if len(plan.stages) > 1 else []}


MOMENT_ORDER = ("start", *ACTIVE_MOMENTS, "embeddings reduce-scatter", "cool-down end",
                "optimizer step")
"""The moments of a step in the order they happen (`llmpar.evaluation.peak`)."""


def peak_view(plan: Plan, timeline: Sequence[MemoryMoment]) -> dict[str, Any] | None:
    """The step's memory peak and every stage's allocated memory at each moment."""
    peak = plan.training.memory_peak if plan.training is not None else None
    if peak is None:
        return None
    return {"allocated": _bytes("allocated peak", peak.allocated_bytes),
            "reserved": _bytes("reserved peak", peak.reserved_bytes),
            "device": _bytes("device peak", peak.device_bytes),
            "moment": peak.moment, "stage": peak.stage,
            "moments": sorted({m.moment for m in timeline},
                              key=lambda name: (name not in MOMENT_ORDER,
                                                MOMENT_ORDER.index(name)
                                                if name in MOMENT_ORDER else 0, name)),
            "timeline": [{"stage": m.stage, **_bytes(m.moment, m.allocated_bytes)}
                         for m in timeline]}


def step_view(plan: Plan) -> dict[str, Any] | None:
    """The step's parts as `llmpar.report.sections.time_breakdown` lists them."""
    if plan.time_model != "modelled" or plan.training is None:
        return None
    parts = [_seconds("compute", plan.compute_seconds or 0.0),
             _seconds("exposed communication", plan.exposed_communication_seconds),
             _seconds("pipeline bubble", plan.bubble_seconds),
             _seconds("optimizer step", plan.optimizer_seconds)]
    if plan.offload_seconds:
        parts.append(_seconds("exposed offload", plan.exposed_offload_seconds))
    if plan.training.host_overhead_seconds:
        parts.append(_seconds("host overhead", plan.training.host_overhead_seconds))
    return {"parts": parts, "step": _seconds("step", plan.step_seconds)}


def collectives_view(plan: Plan) -> list[dict[str, Any]]:
    return [{"strategy": c.strategy, "operation": c.operation, "name": c.name,
             "tier": c.tier, "group_size": c.group_size, "calls_per_step": c.calls_per_step,
             "buffer": format_size(c.buffer_bytes),
             "time": _seconds("time", c.seconds), "exposed": _seconds("exposed",
                                                                        c.exposed_seconds)}
            for c in plan.collectives]


def run_view(plan: Plan, spec: Spec) -> list[dict[str, Any]]:
    """Step, throughput, utilization, and the whole run's time, GPU-hours and cost."""
    rows = [_number("step time", plan.step_seconds, _seconds("", plan.step_seconds)["text"],
                    "step_seconds"),
            _number("tokens/s", plan.tokens_per_second,
                    "-" if plan.tokens_per_second is None else f"{plan.tokens_per_second:,.0f}",
                    "tokens_per_second"),
            _number("MFU", plan.mfu, "-" if plan.mfu is None else f"{plan.mfu:.1%}", "mfu"),
            _number("run time", plan.train_seconds,
                    _seconds("", plan.train_seconds)["text"], "train_seconds"),
            _number("GPU-hours", plan.gpu_hours,
                    "-" if plan.gpu_hours is None else f"{plan.gpu_hours:,.0f}", "gpu_hours")]
    price = spec.hardware.gpu_hour_cost
    if price is not None and plan.gpu_hours is not None:
        # GPU-hours times `[hardware] gpu_hour_cost` (dollars per GPU-hour).
        cost = plan.gpu_hours * price
        rows.append(_number("cost", cost, f"${cost:,.0f} at ${price:,.2f}/GPU-hour",
                            "run_cost"))
    elif plan.gpu_hours is not None:
        rows.append(_number("cost (set hardware.gpu_hour_cost)", None, "-", "run_cost"))
    return rows


def serving_view(plan: Plan) -> dict[str, Any] | None:
    """KV cache, TTFT and TPOT (the steady state's under continuous batching) and
    throughput of a serving plan."""
    if not plan.serving:
        return None
    pool = plan.serving[0]
    ttft, tpot = serving_times(plan)
    rate = (pool.continuous.tokens_per_second_per_gpu if pool.continuous is not None
            else pool.tokens_per_second_per_gpu)
    return {"rows": [
        _number("KV cache per GPU", pool.kv_cache_bytes,
                format_gb_gib(pool.kv_cache_bytes or 0), "kv_cache_bytes"),
        _number("TTFT", ttft, _seconds("", ttft)["text"], "ttft_seconds"),
        _number("TPOT", tpot, _seconds("", tpot)["text"], "tpot_seconds"),
        _number("output tokens/s per GPU", rate, "-" if rate is None else f"{rate:,.1f}",
                "tokens_per_second_per_gpu"),
        _number("max batch", pool.max_batch_size,
                "-" if pool.max_batch_size is None else f"{pool.max_batch_size:,}",
                "max_batch_size")],
        "trust": pool.time_trust}


def table_view(table: Table) -> dict[str, Any]:
    return {"title": table.title, "columns": list(table.columns),
            "rows": [list(row) for row in table.rows], "marked": list(table.marked),
            "notes": list(table.notes), "text_columns": list(table.text_columns)}


def plan_view(plan: Plan, spec: Spec, timeline: Sequence[MemoryMoment],
              extra: Sequence[Table] = ()) -> dict[str, Any]:
    """Everything the page shows of one plan."""
    serving = serving_view(plan)
    trust = (serving or {}).get("trust", "") or (
        plan.training.step_time_trust if plan.training is not None else "")
    return {"workload": plan.workload,
            "title": f"{plan.model} on {plan.num_gpus:,} x {plan.gpu}",
            "layout": dict(plan.layout), "memory": memory_view(plan),
            "peak": peak_view(plan, timeline), "step": step_view(plan),
            "collectives": collectives_view(plan), "run": run_view(plan, spec),
            "serving": serving, "trust": trust, "warnings": list(plan.warnings),
            "tables": [table_view(t) for t in all_sections(plan, extra)]}


__all__ = ["plan_view"]
