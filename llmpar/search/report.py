"""A search result as text: counts, rejections by reason, the ranked layouts and the
Pareto front."""

from __future__ import annotations

from typing import Any

from llmpar.report.tables import Table, render_text
from llmpar.search.listing import DimensionListing
from llmpar.search.result import SearchResult, degrees_of

ABBREVIATIONS = {"data": "DP", "tensor": "TP", "pipeline": "PP", "context": "CP",
                 "expert": "EP"}
LISTED_VALUES = 12
"""Values shown per key in `--dimensions`; beyond, the first and last few and a count."""
OBJECTIVE_UNITS = {"step_time": "s", "tokens_per_second_per_gpu": "tokens/s/GPU",
                   "cost": "$/M tokens", "memory": "bytes", "gpus": "GPUs"}


def layout_text(choices: dict[str, Any]) -> str:
    """'TP8 PP16 DP8' (strategies above degree 1, and data)."""
    degrees = degrees_of(choices)
    return " ".join(f"{ABBREVIATIONS.get(name, name)}{degree}"
                    for name, degree in sorted(degrees.items()))


def options_text(choices: dict[str, Any]) -> str:
    """The non-degree choices, short: 'b=1 full ZeRO-1 SP 1f1b'."""
    parts = [f"b={choices.get('training.micro_batch_size')}",
             str(choices.get("training.recompute"))]
    for key, value in sorted(choices.items()):
        if key.endswith(".degree") or key.startswith("training."):
            continue
        parts.append(_option(key, value, choices))
    return " ".join(p for p in parts if p)


def _option(key: str, value: Any, choices: dict[str, Any]) -> str:
    if key == "data.zero":
        return f"ZeRO-{value}"
    if key == "data.shard_degree":  # hybrid sharding over groups of that many data ranks
        return "" if value is None else f"HSDP(s={value})"
    if key == "sequence":
        return "SP" if value else ""
    if key == "pipeline.schedule":
        return value if choices.get("pipeline.degree", 1) > 1 else ""
    if key == "pipeline.virtual_stages":
        return f"v={value}" if value != 1 else ""
    if key == "pipeline.layers_per_stage":
        return "uneven" if value is not None else ""
    if key == "context.kind":
        return value if choices.get("context.degree", 1) > 1 else ""
    if value is False or value is None:  # a switch left off: nothing to say
        return ""
    return key if value is True else f"{key}={value}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:,.1f}"


def text_report(result: SearchResult) -> str:
    lines = [f"{result.considered:,} layouts considered, {result.evaluated:,} valid ones "
             f"evaluated, {result.ranked:,} of them fitting, in {result.seconds:.2f} s"]
    rejected = Table(title="Rejected", columns=("reason", "layouts", "e.g."),
                     rows=tuple((reason, f"{count:,}", result.examples.get(reason, ""))
                                for reason, count in sorted(result.rejected.items(),
                                                            key=lambda kv: -kv[1])),
                     text_columns=(0, 2))
    lines += ["", render_text(rejected)]
    unit = OBJECTIVE_UNITS[result.objective]
    counted = bool(result.gpu_counts)
    best = Table(title=f"Best layouts by {result.objective} ({unit})",
                 columns=("#", "objective", *(("GPUs",) if counted else ()), "step s",
                          "GiB/GPU", "layout", "options"),
                 rows=tuple((str(r.rank), _number(r.objective),
                             *((f"{r.spec.hardware.num_gpus:,}",) if counted else ()),
                             _number(r.plan.step_seconds),
                             _gib(r.plan.total_bytes), layout_text(r.choices),
                             options_text(r.choices)) for r in result.results),
                 text_columns=(5, 6) if counted else (4, 5))
    front = Table(title="Pareto front: memory per GPU versus step time",
                  columns=("GiB/GPU", "step s", *(("GPUs",) if counted else ()), "layout",
                           "options"),
                  rows=tuple((_gib(p.total_bytes), _number(p.step_seconds),
                              *((f"{p.spec.hardware.num_gpus:,}",) if counted else ()),
                              layout_text(p.choices), options_text(p.choices))
                             for p in result.pareto),
                  text_columns=(3, 4) if counted else (2, 3))
    lines += ["", render_text(best), "", render_text(front)]
    if counted:
        lines += ["", *gpu_count_tables(result)]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines)


def gpu_count_tables(result: SearchResult) -> list[str]:
    """`[search] num_gpus`: what each count holds, and the front of GPU count versus step
    time (or cost)."""
    counts = Table(title="GPU counts tried ([search] num_gpus)",
                   columns=("GPUs", "layouts", "ranked", "fastest step s", "note"),
                   rows=tuple((f"{c.num_gpus:,}", f"{c.considered:,}", f"{c.ranked:,}",
                               _number(c.best_step_seconds), c.note)
                              for c in result.gpu_counts), text_columns=(4,))
    by_cost = result.objective in ("cost", "tokens_per_second_per_gpu")
    front = Table(title="Pareto front: GPUs versus " + ("cost" if by_cost else "step time"),
                  columns=("GPUs", "step s", "$/M tokens", "GiB/GPU", "layout", "options"),
                  rows=tuple((f"{p.num_gpus:,}", _number(p.step_seconds), _number(p.cost),
                              _gib(p.total_bytes), layout_text(p.choices),
                              options_text(p.choices)) for p in result.gpus_pareto),
                  text_columns=(4, 5))
    return [render_text(counts), "", render_text(front)]


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"


def dimensions_report(listing: DimensionListing) -> str:
    """The keys `[search] values` takes, as a table: what each varies and the values
    layouts of this spec's space take."""
    table = Table(title="Search dimensions: the keys [search] values takes",
                  columns=("key", "values in this space", "what"),
                  rows=tuple((d.key, "-" if d.values is None else _values_text(d.values),
                              d.description) for d in listing.dimensions),
                  text_columns=(0, 1, 2))
    lines = [render_text(table)]
    if listing.problem is not None:
        lines += ["", "values not listed: the space was not laid out:", listing.problem]
    return "\n".join(lines)


def _values_text(values: tuple[Any, ...]) -> str:
    shown = [_value_text(v) for v in values]
    if len(shown) > LISTED_VALUES:
        shown = shown[:LISTED_VALUES - 3] + ["..."] + shown[-2:] + [f"({len(values):,} values)"]
    return ", ".join(shown) if shown else "(none)"


def _value_text(value: Any) -> str:
    """As TOML writes it; None (a field left unset) as 'unset'."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)
