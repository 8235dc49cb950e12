"""Figures of plans, with matplotlib (the optional `plot` extra: pip install 'llmpar[plot]').

The `*_figure` functions return a `matplotlib.figure.Figure` made without pyplot, so
nothing global is touched; save it with `figure.savefig("out.png")` (or .svg). Memory
is in GiB (2^30 bytes) per GPU; the data behind each figure comes from the Plans as is.
The data helpers (`sequence_lengths`, `sweep`, `component_gib`) need no matplotlib.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.plan import Plan
from llmpar.spec import Spec
from llmpar.units import GiB

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from llmpar.evaluation.peak import MemoryMoment
    from llmpar.search.result import ParetoPoint

COMPONENTS = (("weights", "weights_bytes"), ("gradients", "gradients_bytes"),
              ("optimizer states", "optimizer_bytes"), ("KV cache", "kv_cache_bytes"),
              ("activations", "activations_bytes"), ("buffers", "buffers_bytes"))
"""Stacked memory components, bottom to top: (label, Plan field). A serving plan's are
its weights, KV cache, activation workspace and runtime allowance (`buffers`); a training
plan has no KV cache (counted as 0, so not drawn)."""

SEQUENCE_START = 512
SEQUENCE_AT_LEAST = 32768
MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
SERVING_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Batches (static `batch_size`, or `concurrency`) a serving batch sweep tries."""
LOG_SCALE_SPAN = 10
"""Step times spanning more than this factor get a logarithmic axis."""


def component_gib(plan: Plan) -> dict[str, float]:
    """Per-GPU GiB of each component (activations not estimated count as 0)."""
    return {label: (getattr(plan, field) or 0) / GiB for label, field in COMPONENTS}


def sequence_lengths(spec_sequence_length: int) -> tuple[int, ...]:
    """512, 1024, ... doubling up to max(32768, the spec's), which ends the list."""
    top = max(SEQUENCE_AT_LEAST, spec_sequence_length)
    values = [SEQUENCE_START]
    while values[-1] * 2 <= top:
        values.append(values[-1] * 2)
    return tuple(values) + ((top,) if values[-1] != top else ())


def sweep_axis(spec: Spec, kind: str) -> tuple[str, tuple[int, ...], str]:
    """(key, values, axis label) of a "sequence" or "batch" sweep of `spec`: the sequence
    length or micro-batch of a training spec; the prompt length, or the static batch (the
    concurrency under continuous batching) of a serving spec."""
    inference = spec.inference
    if inference is None:
        if kind == "sequence":
            return ("training.sequence_length", sequence_lengths(spec.training.sequence_length),
                    "sequence length (tokens)")
        return "training.micro_batch_size", MICRO_BATCH_SIZES, "micro-batch size (sequences)"
    if kind == "sequence":
        return ("inference.prompt_tokens", sequence_lengths(inference.prompt_tokens),
                "prompt length (tokens)")
    if inference.request_rate_per_s is not None:
        raise SpecError([Problem("$.inference.request_rate_per_s",
                                 "a batch sweep varies batch_size or concurrency; give one of "
                                 "them (or plot sequence) for a request-rate spec")],
                        spec.source)
    if inference.concurrency is not None:
        return ("inference.concurrency", SERVING_BATCH_SIZES,
                "concurrency (requests in flight)")
    return "inference.batch_size", SERVING_BATCH_SIZES, "batch size (sequences per replica)"


def serving_times(plan: Plan) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) of a serving plan: the steady state's under continuous batching."""
    pool = plan.serving[0]
    state = pool.continuous
    if state is not None:
        return state.ttft_seconds, state.tpot_seconds
    return pool.prefill_seconds, pool.tpot_seconds


@attrs.frozen(kw_only=True)
class Sweep:
    """Plans of one spec as one key varies; points whose spec is invalid are skipped."""

    label: str
    key: str
    values: tuple[int, ...]
    plans: tuple[Plan, ...]
    skipped: tuple[tuple[int, str], ...] = ()
    """(value, first problem) of each skipped point."""


def sweep(evaluate: Callable[[dict[str, object]], Plan], label: str, key: str,
          values: Sequence[int]) -> Sweep:
    """Evaluate `{key: value}` for each value; raise the first error if none is valid."""
    kept, plans, skipped, first_error = [], [], [], None
    for value in values:
        try:
            plans.append(evaluate({key: value}))
            kept.append(value)
        except SpecError as error:
            first_error = first_error or error
            skipped.append((value, str(error.problems[0]) if error.problems else str(error)))
    if not plans and first_error is not None:
        raise first_error
    return Sweep(label=label, key=key, values=tuple(kept), plans=tuple(plans),
                 skipped=tuple(skipped))


def memory_figure(plans: Sequence[Plan], labels: Sequence[str]) -> Figure:
    """Stacked per-GPU memory of each plan, with each GPU's capacity as a line."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6.0, 1.6 * len(plans) + 3), 5), layout="constrained")
    ax = figure.add_subplot()
    positions = range(len(plans))
    bottoms = [0.0] * len(plans)
    for label, _field in COMPONENTS:
        heights = [component_gib(plan)[label] for plan in plans]
        if not any(heights):
            continue
        ax.bar(positions, heights, 0.6, bottom=bottoms, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, plan in zip(positions, plans):
        # matplotlib takes label=None (no legend entry); its stubs only say str
        ax.hlines(plan.capacity_bytes / GiB, x - 0.4, x + 0.4, colors="black",
                  linestyles="dashed",
                  label="capacity" if x == 0 else None)  # type: ignore[arg-type, unused-ignore]
        ax.annotate(f"{plan.total_bytes / GiB:,.1f}", (x, bottoms[x]), ha="center",
                    va="bottom", xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(list(positions), [_wrap(label) for label in labels])
    ax.set_ylabel("memory per GPU (GiB = 2^30 bytes)")
    ax.set_title("Memory per GPU")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def _wrap(label: str, width: int = 22) -> str:
    words, lines = label.split(), [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + len(word) >= width:
            lines.append("")
        lines[-1] = f"{lines[-1]} {word}".strip()
    return "\n".join(lines)


def sweep_figure(sweeps: Sequence[Sweep], xlabel: str) -> Figure:
    """Memory per GPU (stacked for one sweep, totals for several) and step time against
    the swept value, on log-2 x axes."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    memory_ax, time_ax = figure.subplots(1, 2)
    if len(sweeps) == 1:
        _stacked_memory(memory_ax, sweeps[0])
    else:
        for s in sweeps:
            memory_ax.plot(s.values, [p.total_bytes / GiB for p in s.plans], marker="o",
                           label=s.label)
    capacities = {p.capacity_bytes for s in sweeps for p in s.plans}
    for capacity in sorted(capacities):
        memory_ax.axhline(capacity / GiB, color="black", linestyle="dashed", linewidth=1,
                          label="capacity" if capacity == min(capacities) else None)
    serving = all(p.workload == "inference" for s in sweeps for p in s.plans)
    times: list[float] = []
    for s in sweeps:
        if serving:  # TPOT solid, TTFT dashed in the same colour
            pairs = [serving_times(p) for p in s.plans]
            tpot = [t if t is not None else float("nan") for _, t in pairs]
            ttft = [t if t is not None else float("nan") for t, _ in pairs]
            line = time_ax.plot(s.values, tpot, marker="o", label=f"{s.label} TPOT")[0]
            time_ax.plot(s.values, ttft, marker="s", linestyle="dashed",
                         color=line.get_color(), label=f"{s.label} TTFT")
            times += [t for t in tpot + ttft if t == t]
        else:
            seconds = [p.step_seconds if p.step_seconds is not None else float("nan")
                       for p in s.plans]
            time_ax.plot(s.values, seconds, marker="o", label=s.label)
            times += [t for t in seconds if t == t]
    memory_ax.set_ylabel("memory per GPU (GiB = 2^30 bytes)")
    memory_ax.set_title("Memory per GPU")
    time_ax.set_ylabel("seconds" if serving else "step time (s)")
    time_ax.set_title("Time to first token and per output token" if serving else "Step time")
    ticks = sorted({v for s in sweeps for v in s.values})
    for ax in (memory_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{v:,}" for v in ticks])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.legend(fontsize="small")
    times = [t for t in times if t > 0]
    if times and max(times) > LOG_SCALE_SPAN * min(times):
        time_ax.set_yscale("log")
    return figure


def _stacked_memory(ax: Axes, s: Sweep) -> None:
    layers = {label: [component_gib(p)[label] for p in s.plans] for label, _ in COMPONENTS}
    shown = {label: values for label, values in layers.items() if any(values)}
    ax.stackplot(s.values, *shown.values(), labels=list(shown), alpha=0.85)
    ax.plot(s.values, [p.total_bytes / GiB for p in s.plans], color="black", marker="o",
            linewidth=1, label=f"total ({s.label})")


PARETO_LISTED = 24
"""Lines listing the front beside a Pareto plot, the fastest last; the rest are counted
(`llmpar search --format json` lists them all)."""


def _distinct(labels: Sequence[str]) -> list[str]:
    """Labels "degrees; choice, choice, ..." with only the choices that differ between
    them (what every point shares says nothing about the front)."""
    split = [(head, [c.strip() for c in rest.split(",") if c.strip()])
             for head, _, rest in (label.partition(";") for label in labels)]
    shared = set.intersection(*(set(c) for _, c in split)) if len(split) > 1 else set()
    return [head + ("; " + ", ".join(c for c in choices if c not in shared)
                    if set(choices) - shared else "") for head, choices in split]


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def pareto_figure(points: Sequence[ParetoPoint], labels: Sequence[str], title: str) -> Figure:
    """A search's Pareto front: memory per GPU against step time, one point per layout
    (`points`: the search result's `pareto`, each with total_bytes and step_seconds).
    The front's two corners (least memory, fastest) are annotated inside the axes; every
    point is numbered and listed with its label beside the plot, so labels never pile on
    the points."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5.5), layout="constrained")
    ax, side = figure.subplots(1, 2, width_ratios=(3, 2))
    timed = [(p, label) for p, label in zip(points, labels) if p.step_seconds is not None]
    memory = [p.total_bytes / GiB for p, _ in timed]
    # every timed point has step_seconds; repeating the test narrows the type for mypy
    seconds = [p.step_seconds for p, _ in timed if p.step_seconds is not None]
    ax.plot(memory, seconds, marker="o", drawstyle="steps-post")
    short = _distinct([label for _, label in timed])
    if timed:
        corners = [(0, "least memory", (0.97, 0.97))]
        if len(timed) > 1:
            corners.append((len(timed) - 1, "fastest", (0.97, 0.62)))
        for index, name, where in corners:
            ax.annotate(f"{index + 1}. {name}:\n{_wrap(_short(short[index], 90), 34)}",
                        (memory[index], seconds[index]), xytext=where,
                        textcoords="axes fraction", ha="right", va="top", fontsize=8,
                        arrowprops={"arrowstyle": "->", "color": "0.4"})
    ax.set_xlabel("memory per GPU (GiB = 2^30 bytes)")
    ax.set_ylabel("step time (s)")
    ax.set_title(title, fontsize=10)
    if seconds and max(seconds) > 10 * min(seconds):
        ax.set_yscale("log")  # a front spans orders of magnitude in step time
    side.set_axis_off()
    rows = [f"{i + 1}. {m:,.1f} GiB, {t:,.3g} s: {_short(label, 64)}"
            for i, (label, m, t) in enumerate(zip(short, memory, seconds))]
    hidden = len(rows) - (PARETO_LISTED - 1)  # the first ones and the fastest are shown
    shown = rows if len(rows) <= PARETO_LISTED else (
        rows[:PARETO_LISTED - 2] + [f"... {hidden} more (llmpar search --format json)",
                                    rows[-1]])
    side.text(0.0, 1.0, "\n".join(["the front, least memory first:", *shown]), va="top",
              ha="left", fontsize=7, family="monospace", transform=side.transAxes)
    return figure


TIMELINE_MOMENTS = ("start", "warm-up end", "loss forward", "loss backward",
                    "output layer backward", "layer backward", "cool-down end",
                    "optimizer step")
"""The modelled moments of a step, in the order they happen on a stage."""
TIMELINE_BETWEEN = {"output layer reduce-scatter": 4.5, "embeddings reduce-scatter": 5.5}
"""The moments only some stacks have (FSDP2's edge units' reduce-scatters), drawn between
their neighbours in step order."""


def _position(moment: str) -> float:
    """Where a moment is drawn: its place in `TIMELINE_MOMENTS`, or `TIMELINE_BETWEEN`."""
    return (TIMELINE_MOMENTS.index(moment) if moment in TIMELINE_MOMENTS
            else TIMELINE_BETWEEN[moment])
TIMELINE_STAGES = 8
"""Stages drawn one line each; a deeper pipeline draws its first, last and peak stages."""


def timeline_series(moments: Sequence[MemoryMoment]
                    ) -> dict[int, list[tuple[float, float]]]:
    """Per stage, (moment position, `_position`, GiB) in step order."""
    found: dict[int, list[tuple[float, float]]] = {}
    for moment in moments:
        found.setdefault(moment.stage, []).append(
            (_position(moment.moment), moment.allocated_bytes / GiB))
    return {stage: sorted(points) for stage, points in sorted(found.items())}


def timeline_figure(moments: Sequence[MemoryMoment], plan: Plan, title: str) -> Figure:
    """Allocated memory per stage over one step at the modelled moments (warm-up, the
    loss, backward, cool-down, optimizer step), the peak marked and labelled with what is
    alive then, and the GPU's capacity."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 5), layout="constrained")
    ax = figure.add_subplot()
    series = timeline_series(moments)
    peak = plan.training.memory_peak if plan.training is not None else None
    shown = list(series)
    if len(shown) > TIMELINE_STAGES:
        keep = {shown[0], shown[-1]} | ({peak.stage} if peak is not None else set())
        shown = [stage for stage in shown if stage in keep]
    for stage in shown:
        xs, ys = zip(*series[stage])
        ax.plot(xs, ys, marker="o", drawstyle="steps-mid", label=f"stage {stage}")
    ax.axhline(plan.capacity_bytes / GiB, color="black", linestyle="dashed", linewidth=1,
               label="capacity")
    if peak is not None:
        x = _position(peak.moment)
        y = peak.allocated_bytes / GiB
        transients = sorted((b for b in peak.alive if b.transient), key=lambda b: -b.bytes)
        alive = "\n".join(f"+ {b.name} {b.bytes / GiB:,.2f} GiB" for b in transients[:3])
        ax.plot([x], [y], marker="*", markersize=14, color="red", linestyle="none",
                label="peak")
        ax.annotate(f"peak {y:,.2f} GiB: stage {peak.stage}, {peak.moment}\n"
                    f"steady state {peak.steady_bytes / GiB:,.2f} GiB\n{alive}".rstrip(),
                    (x, y), xytext=(0, 10), textcoords="offset points", fontsize=8,
                    va="bottom", ha="right" if x > len(TIMELINE_MOMENTS) / 2 else "left")
    used = sorted({x for stage in shown for x, _ in series[stage]})
    names = {_position(name): name for name in (*TIMELINE_MOMENTS, *TIMELINE_BETWEEN)}
    ax.set_xticks(used, [_wrap(names[x], 12) for x in used], fontsize=8)
    ax.set_ylabel("allocated memory per GPU (GiB = 2^30 bytes)")
    ax.set_title(title)
    ax.set_ylim(0, max(plan.capacity_bytes, peak.allocated_bytes if peak else 0) / GiB * 1.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def step_parts(plan: Plan) -> list[tuple[str, float]]:
    """A modelled training step's time as the report's *Step time* table adds it up, with
    the exposed communication split by the strategy that issues it: (label, seconds),
    summing to `plan.step_seconds`. Empty when the step time is not modelled."""
    if plan.time_model != "modelled" or plan.training is None:
        return []
    exposed: dict[str, float] = {}
    for collective in plan.collectives:
        exposed[collective.strategy] = exposed.get(collective.strategy, 0.0) \
            + collective.exposed_seconds
    parts = [("compute", plan.compute_seconds or 0.0)]
    parts += [(f"exposed {strategy} communication", seconds)
              for strategy, seconds in sorted(exposed.items(), key=lambda kv: -kv[1])
              if seconds > 0]
    parts += [("pipeline bubble", plan.bubble_seconds),
              ("optimizer step", plan.optimizer_seconds),
              ("exposed offload", plan.exposed_offload_seconds),
              ("host overhead", plan.training.host_overhead_seconds)]
    return [(label, seconds) for label, seconds in parts if seconds > 0 or label == "compute"]


def waterfall_figure(plan: Plan, title: str) -> Figure:
    """The step time as a waterfall: compute, the exposed communication of each strategy,
    the pipeline bubble, the optimizer step (and offload and host overhead where there
    are any), each bar starting where the one before ends, then the whole step."""
    from matplotlib.figure import Figure

    parts = step_parts(plan)
    if not parts or plan.step_seconds is None:
        raise SpecError([Problem("$.training", "a step-time waterfall needs a training spec "
                                 "whose step time is modelled (a GPU with efficiencies, "
                                 "no [training] mfu)")])
    figure = Figure(figsize=(9, 1.2 + 0.45 * (len(parts) + 1)), layout="constrained")
    ax = figure.add_subplot()
    step = plan.step_seconds
    start = 0.0
    rows = [*parts, ("step", step)]
    for row, (label, seconds) in enumerate(rows):
        left = 0.0 if label == "step" else start
        ax.barh(row, seconds, left=left, height=0.6,
                color="black" if label == "step" else f"C{row % 10}")
        ax.annotate(f"{_seconds_text(seconds)} ({seconds / step:.1%})", (left + seconds, row),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        if label != "step":
            start += seconds
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, step * 1.25)
    ax.set_xlabel("time per optimizer step (s)")
    ax.set_title(title)
    return figure


def _seconds_text(seconds: float) -> str:
    return f"{seconds:,.3g} s" if seconds >= 1 else f"{seconds * 1e3:,.3g} ms"
