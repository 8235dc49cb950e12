"""`[search] hardware`: the same layout search on several machines, compared.

    result = llmpar.search.search_hardware("job.toml", constraints={
        "hardware": ["dgx-h100", "dgx-h200", "dgx-b200"],
        "gpu_hour_costs": {"dgx-h100": 2.5, "dgx-h200": 3.5, "dgx-b200": 5.0}})
    result.best.name, result.best.result.best.plan.step_seconds

Each entry is a cluster or GPU preset. Its spec is the searched spec with `[hardware]`
changed as `llmpar.spec.search.Search.hardware` says, and it is searched exactly as
`llmpar.search` searches one spec (the fast path, the same bounds and ranking): this
module only builds the variants and orders their best layouts, so no formula lives here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError, did_you_mean
from llmpar.loading.dump import spec_to_dict
from llmpar.loading.presets import PresetNotFound
from llmpar.loading.reader import SpecSource, apply_overrides, read_source
from llmpar.search.exhaustive import Progress
from llmpar.search.ranking import objective_value
from llmpar.search.result import Ranked, SearchResult
from llmpar.search.serving import (
    ServingCandidate,
    ServingSearchResult,
    cost_per_million_tokens,
    search_serving,
)
from llmpar.spec import Spec

if TYPE_CHECKING:
    from llmpar.session import Session

KEPT_WITH_A_CLUSTER = ("num_gpus", "memory_headroom_bytes", "collective_algorithms")
"""`[hardware]` keys a cluster entry keeps from the spec: the job's size and the user's
modelling choices, not the machine's."""
HIGHER_IS_BETTER = ("tokens_per_second_per_gpu",)


@attrs.frozen(kw_only=True)
class HardwareEntry:
    """One machine of `[search] hardware`: what it is, its price and its search."""

    name: str
    """The entry as `[search] hardware` lists it."""
    kind: str
    """"cluster" or "gpu": which preset it names."""
    gpu_hour_cost: float | None
    """Dollars per GPU-hour, where known."""
    result: SearchResult | ServingSearchResult
    """A training spec's search, or a serving spec's."""

    @property
    def best(self) -> Ranked | ServingCandidate | None:
        return self.result.results[0] if self.result.results else None

    @property
    def objective(self) -> float | None:
        """The objective of the best layout, in its unit (None: nothing fits)."""
        best = self.best
        return best.score if isinstance(best, ServingCandidate) else (
            None if best is None else best.objective)

    @property
    def gpu(self) -> str | None:
        """The GPU preset of the best layout."""
        best = self.best
        if isinstance(best, ServingCandidate):
            return str(best.table["hardware"]["gpu"]["name"])
        return None if best is None else best.spec.hardware.gpu.name

    @property
    def cost_per_million_tokens(self) -> float | None:
        """Dollars per million tokens (a serving spec's: output tokens) of the best layout,
        where its price is known."""
        best = self.best
        if best is None or self.gpu_hour_cost is None:
            return None
        if isinstance(best, ServingCandidate):
            return cost_per_million_tokens(self.gpu_hour_cost, best.tokens_per_second_per_gpu)
        return objective_value("cost", best.spec, best.plan.total_bytes,
                               best.plan.step_seconds)

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"hardware": self.name, "kind": self.kind, "gpu": self.gpu,
                "gpu_hour_cost": self.gpu_hour_cost,
                "cost_per_million_tokens": self.cost_per_million_tokens,
                "best": None if best is None else best.to_dict(),
                "search": self.result.to_dict()}


@attrs.frozen(kw_only=True)
class HardwareSearchResult:
    """Every entry's search, best machine first (entries where nothing fits last, in the
    order listed)."""

    objective: str
    entries: tuple[HardwareEntry, ...]
    seconds: float
    serving: bool = False
    """A serving spec's layouts (TTFT and TPOT limits), not a training spec's."""

    @property
    def best(self) -> HardwareEntry:
        if not self.entries or self.entries[0].best is None:
            raise LookupError("no layout is valid and fits on any of the hardware")
        return self.entries[0]

    def to_dict(self) -> dict[str, Any]:
        fits = self.entries and self.entries[0].best is not None
        return {"objective": self.objective, "serving": self.serving,
                "best_hardware": self.entries[0].name if fits else None,
                "seconds": self.seconds,
                "hardware": [entry.to_dict() for entry in self.entries]}


def hardware_list(session: Session, source: SpecSource | Spec,
                  overrides: Mapping[str, Any] | None = None,
                  constraints: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The `[search] hardware` a search of this spec compares (empty: none)."""
    if constraints and constraints.get("hardware") is not None:
        return tuple(constraints["hardware"])
    raw, _label = _raw(source, overrides)
    table = raw.get("search")
    listed = table.get("hardware", ()) if isinstance(table, Mapping) else ()
    return tuple(listed) if isinstance(listed, list | tuple) else ()


def search_hardware(source: SpecSource | Spec, overrides: Mapping[str, Any] | None = None, *,
                    objective: str | None = None, top: int | None = None,
                    constraints: Mapping[str, Any] | None = None,
                    session: Session | None = None, jobs: int = 1, exact: bool = False,
                    progress: Progress | None = None) -> HardwareSearchResult:
    """`llmpar.search` of the spec on each machine of `[search] hardware` (or
    `constraints["hardware"]`), best machine first by the objective of each one's best
    layout; a serving spec's by `llmpar.search.serving.search_serving` (`jobs`, `exact`
    and `progress` do not apply). Arguments as `llmpar.search`'s."""
    from llmpar.search.engine import search

    started = time.perf_counter()
    if session is None:
        import llmpar

        session = llmpar.default_session()
    raw, label = _raw(source, overrides)
    settings = {**dict(raw.get("search") or {}), **{k: v for k, v in
                                                    (constraints or {}).items()
                                                    if v is not None}}
    if objective is not None:
        settings["objective"] = objective
    names = tuple(settings.pop("hardware", ()))
    costs = dict(settings.pop("gpu_hour_costs", {}))
    # A file stays the source, so that what it names relative to its folder (a model's
    # hf_config, a preset's file) is found there; its tables are changed by overrides.
    base: SpecSource = raw if isinstance(source, Spec) else source
    given = {} if isinstance(source, Spec) else dict(overrides or {})
    try:
        spec = session.load_spec(base, {**given, "search": {
            **settings, "hardware": list(names), "gpu_hour_costs": costs}})
    except SpecError as error:
        raise error.with_source(label) from None
    assert spec.search is not None  # the table above
    kinds = _kinds(session, names, spec, label)
    prices = _prices(spec, names, costs, label)
    entries = []
    for name in names:
        variant = {**given, "search": settings,
                   "hardware": _hardware_table(raw["hardware"], name, kinds[name],
                                               prices[name])}
        try:
            result: SearchResult | ServingSearchResult
            if spec.inference is not None:
                result = search_serving(session, session.load_spec(base, variant),
                                        objective=objective, top=top)
            else:
                result = search(base, variant, objective=objective, top=top,
                                session=session, jobs=jobs, exact=exact, progress=progress)
        except SpecError as error:
            raise SpecError([attrs.evolve(p, message=f"with [search] hardware {name!r}: "
                                                     f"{p.message}") for p in error.problems],
                            label) from None
        entries.append(HardwareEntry(name=name, kind=kinds[name], gpu_hour_cost=prices[name],
                                     result=result))
    chosen = spec.search.objective
    ordered = sorted(entries, key=lambda entry: _order(entry, chosen))
    return HardwareSearchResult(objective=chosen, entries=tuple(ordered),
                                seconds=time.perf_counter() - started,
                                serving=spec.inference is not None)


def _raw(source: SpecSource | Spec,
         overrides: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """The spec's table with `overrides` set, and its label for messages."""
    if isinstance(source, Spec):
        raw, label = spec_to_dict(source), source.source
    else:
        raw, label = read_source(source)
    return apply_overrides(raw, overrides or {}), label


def _kinds(session: Session, names: tuple[str, ...], spec: Spec,
           label: str | None) -> dict[str, str]:
    """Whether each entry names a cluster or a GPU preset (a cluster first)."""
    kinds, problems = {}, []
    for index, name in enumerate(names):
        for kind in ("clusters", "gpus"):
            try:
                session.presets.path(kind, name)
            except PresetNotFound:
                continue
            kinds[name] = kind[:-1]
            break
        else:
            known = session.presets.names("clusters") + session.presets.names("gpus")
            problems.append(Problem(f"$.search.hardware[{index}]",
                                    f"no cluster or GPU preset named {name!r}"
                                    f"{did_you_mean(name, known)}"))
    if not names:
        problems.append(Problem("$.search.hardware", "list the clusters or GPUs to compare"))
    if problems:
        raise SpecError(problems, label)
    return kinds


def _prices(spec: Spec, names: tuple[str, ...], costs: Mapping[str, float],
            label: str | None) -> dict[str, float | None]:
    """Each entry's dollars per GPU-hour: `gpu_hour_costs`, or the spec's own price for
    the entry that names the spec's GPU or cluster."""
    hardware = spec.hardware
    own = {hardware.gpu.name, hardware.cluster}
    prices = {name: costs.get(name, hardware.gpu_hour_cost if name in own else None)
              for name in names}
    problems = [Problem(f"$.search.gpu_hour_costs.{name}",
                        f"prices an entry that [search] hardware does not list"
                        f"{did_you_mean(name, names)}") for name in costs if name not in names]
    unpriced = [name for name, price in prices.items() if price is None]
    assert spec.search is not None
    if spec.search.objective == "cost" and unpriced:
        problems.append(Problem("$.search.gpu_hour_costs",
                                "the cost objective needs dollars per GPU-hour for every "
                                f"entry; missing: {', '.join(unpriced)}"))
    if problems:
        raise SpecError(problems, label)
    return prices


def _hardware_table(given: Any, name: str, kind: str, price: float | None) -> dict[str, Any]:
    """The spec's `[hardware]` on entry `name`."""
    table = dict(given) if isinstance(given, Mapping) else {}
    if kind == "cluster":
        table = {"cluster": name, **{k: table[k] for k in KEPT_WITH_A_CLUSTER if k in table}}
    else:
        table["gpu"] = name
    table.pop("gpu_hour_cost", None)
    if price is not None:
        table["gpu_hour_cost"] = price
    return table


def _order(entry: HardwareEntry, objective: str) -> tuple[int, float]:
    """Machines with a layout that fits first, by the objective of their best."""
    value = entry.objective
    if value is None:
        return (1, 0.0)
    return (0, -value if objective in HIGHER_IS_BETTER else value)


def text_report(result: HardwareSearchResult) -> str:
    """The machines side by side (best layout of each, its cost where priced), then the
    best machine's own search report."""
    from llmpar.report.tables import Table, render_text
    from llmpar.search import report, serving

    unit = report.OBJECTIVE_UNITS[result.objective]
    rows = []
    for rank, entry in enumerate(result.entries, 1):
        best = entry.best
        shown: tuple[str, ...] = ("-", "nothing fits", "-", "-", "-", "-")
        if isinstance(best, serving.ServingCandidate):
            shown = (str(entry.gpu), report._number(entry.objective),
                     report._number(best.tpot_seconds), report._gib(best.total_bytes),
                     " ".join(f"{k}={v}" for k, v in best.layout.items()), "")
        elif best is not None:
            shown = (str(entry.gpu), report._number(entry.objective),
                     report._number(best.plan.step_seconds), report._gib(best.plan.total_bytes),
                     report.layout_text(best.choices), report.options_text(best.choices))
        rows.append((str(rank), entry.name, entry.kind, *shown[:4],
                     _money(entry.gpu_hour_cost), _money(entry.cost_per_million_tokens),
                     *shown[4:]))
    time_column = "TPOT s" if result.serving else "step s"
    table = Table(title=f"Best layout on each machine by {result.objective} ({unit})",
                  columns=("#", "hardware", "kind", "GPU", "objective", time_column,
                           "GiB/GPU", "$/GPU-h", "$/M tokens", "layout", "options"),
                  rows=tuple(rows), text_columns=(1, 2, 3, 9, 10),
                  notes=(f"in {result.seconds:.2f} s; $: [search] gpu_hour_costs "
                         "(- where no price is given)",))
    lines = [render_text(table)]
    if result.entries and result.entries[0].best is not None:
        first = result.entries[0]
        own = (serving.text_report(first.result)
               if isinstance(first.result, serving.ServingSearchResult)
               else report.text_report(first.result))
        lines += ["", f"Best machine: {first.name}", "", own]
    else:
        lines += ["", "no layout fits on any of these machines"]
    return "\n".join(lines)


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4g}"
