"""Plain-text reports of a Plan. Formulas live elsewhere; this only formats."""

from __future__ import annotations

from llmpar.plan import Plan
from llmpar.units import GB, GiB, format_count, format_duration

BAR_WIDTH = 30


def _bar(fraction: float) -> str:
    filled = min(BAR_WIDTH, round(fraction * BAR_WIDTH))
    overflow = ">" if fraction > 1 else ""
    return "#" * filled + "." * (BAR_WIDTH - filled) + overflow


def _memory_row(label: str, num_bytes: float, capacity: float) -> str:
    return (f"  {label:<36}{num_bytes / GB:>12,.2f}{num_bytes / GiB:>12,.2f}  "
            f"{_bar(num_bytes / capacity)}")


def memory_section(plan: Plan) -> list[str]:
    lines = [f"Memory per GPU{'':<24}{'GB':>12}{'GiB':>12}  (bar: share of capacity)"]
    activations_label = f"activations ({plan.activation_model}"
    activations_label += f", k = {plan.activation_k:.1f})" if plan.activation_k else ")"
    rows = [("weights", plan.weights_bytes), ("gradients", plan.gradients_bytes),
            ("optimizer states", plan.optimizer_bytes)]
    if plan.activations_bytes is not None:
        rows.append((activations_label, plan.activations_bytes))
    if plan.buffers_bytes:
        rows.append(("buffers", plan.buffers_bytes))
    lines += [_memory_row(label, value, plan.capacity_bytes) for label, value in rows]
    if plan.activations_bytes is None:
        lines.append(f"  {'activations':<36}{'not estimated':>24}")
    lines.append(_memory_row("total", plan.total_bytes, plan.capacity_bytes))
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(f"  {'capacity':<36}{plan.capacity_bytes / GB:>12,.2f}"
                 f"{plan.capacity_bytes / GiB:>12,.2f}  {verdict}")
    return lines


def activation_section(plan: Plan, top: int = 5) -> list[str]:
    per_layer = sorted((r for r in plan.activation_tensors if r.per_layer),
                       key=lambda r: r.bytes, reverse=True)
    if not per_layer:
        return []
    lines = ["Largest saved tensors of one layer (one micro-batch)"]
    for row in per_layer[:top]:
        lines.append(f"  {row.name:<30}{row.shape:<22}{row.bytes / GiB:>10,.3f} GiB  "
                     f"({row.reason})")
    return lines


def compute_section(plan: Plan) -> list[str]:
    lines = ["Compute"]
    lines.append(f"  {'tokens per step':<28}{plan.tokens_per_step:,} "
                 f"({plan.global_batch_size} sequences of {plan.sequence_length}, "
                 f"{plan.micro_batches_per_step} micro-batches of {plan.micro_batch_size} "
                 "per replica)")
    method = "exact count" if plan.flops_method == "exact" else "6ND"
    lines.append(f"  {'model FLOPs per step':<28}{plan.flops_per_step:.4g} ({method}; "
                 f"6ND gives {plan.flops_per_step_6nd:.4g})")
    if plan.step_seconds is not None:
        lines.append(f"  {'step time':<28}{format_duration(plan.step_seconds)}")
        lines.append(f"  {'tokens per second':<28}{plan.tokens_per_second:,.0f}")
        hfu = f", HFU {plan.hfu:.1%}" if plan.hfu is not None else ""
        lines.append(f"  {'utilization':<28}MFU {plan.mfu:.1%}{hfu}")
    return lines


def run_section(plan: Plan) -> list[str]:
    if plan.train_tokens is None:
        return []
    lines = ["Whole run"]
    lines.append(f"  {'tokens':<28}{format_count(plan.train_tokens)} "
                 f"({plan.train_steps:,.0f} steps)")
    lines.append(f"  {'model FLOPs':<28}{plan.train_flops:.3g}")
    if plan.train_seconds is not None and plan.gpu_hours is not None:
        lines.append(f"  {'time':<28}{format_duration(plan.train_seconds)} on "
                     f"{plan.num_gpus:,} GPUs")
        lines.append(f"  {'GPU-hours':<28}{plan.gpu_hours:,.0f}")
    return lines


def text_report(plan: Plan) -> str:
    """The whole plan, readable in a terminal."""
    layout = " x ".join(f"{name} {degree}" for name, degree in plan.layout.items())
    groups = ", ".join(f"{name} {format_count(count)}"
                       for name, count in plan.parameters_by_group.items())
    header = [f"{plan.model} on {plan.num_gpus:,} x {plan.gpu}   layout: {layout}",
              f"Parameters: {format_count(plan.parameters)}" + (f" ({groups})" if groups else "")]
    sections = [header, memory_section(plan), activation_section(plan),
                compute_section(plan), run_section(plan)]
    if plan.warnings:
        sections.append(["Warnings"] + [f"  - {w}" for w in plan.warnings])
    return "\n\n".join("\n".join(lines) for lines in sections if lines)
