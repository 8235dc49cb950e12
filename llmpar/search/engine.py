"""`llmpar.search`: the best layouts of a spec's model on its GPUs, found exhaustively."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.loading.reader import SpecSource
from llmpar.search.exhaustive import Judge, Progress
from llmpar.search.prepare import Prepared, prepare, read_spec
from llmpar.search.ranking import (
    TIME_OBJECTIVES,
    Entry,
    gpus_front,
    objective_value,
    pareto_front,
    top,
)
from llmpar.search.result import GpuCount, GpusPoint, ParetoPoint, Ranked, SearchResult
from llmpar.search.run import run_search
from llmpar.search.space import nothing_left
from llmpar.search.tally import Tally, merge
from llmpar.spec import Spec

if TYPE_CHECKING:
    from llmpar.session import Session


def search(source: SpecSource | Spec, overrides: Mapping[str, Any] | None = None, *,
           objective: str | None = None, top: int | None = None,
           constraints: Mapping[str, Any] | None = None, session: Session | None = None,
           jobs: int = 1, exact: bool = False,
           progress: Progress | None = None) -> SearchResult:
    """Every valid layout of the spec's model on its GPUs, ranked by `objective`.

    `objective`, `top` and `constraints` (any `[search]` key, e.g.
    {"tensor_within_node": True, "max_degrees": {"pipeline": 16}}) override the
    spec's `[search]` table; `overrides` sets dotted spec keys as in `llmpar.evaluate`.
    The spec's `[parallel.*]` tables pin what they state. `jobs` > 1 splits the space
    over that many processes (the default session's plugins only); 0 uses every core
    when the space is large. `exact` evaluates every valid layout instead of pruning
    with bounds (for checking; slow). `progress(stage, done, total)` is called as it
    goes. See docs/search.md.
    """
    started = time.perf_counter()
    if session is not None and session is not _default_session() and jobs != 1:
        raise ValueError("jobs other than 1 search in processes with the default session; "
                         "pass session=None, or jobs=1 to use this session")
    session = session or _default_session()
    changes = {**(constraints or {}), "objective": objective, "top": top}
    counts = _counts(session, source, overrides or {}, changes)
    if counts is not None:  # [search] num_gpus: the spec's own count is only the default
        return search_counts(session, source, overrides or {}, changes, counts, jobs=jobs,
                             exact=exact, progress=progress, started=started)
    prepared = prepare(session, source, overrides or {}, changes)
    if prepared.settings.hardware:
        raise SpecError([Problem("$.search.hardware", "compares several machines: search "
                                 "them with llmpar.search.search_hardware (as `llmpar "
                                 "search` does)")], prepared.spec.source)
    if not prepared.space.nodes:
        raise SpecError([nothing_left(prepared.space, prepared.settings)],
                        prepared.spec.source)
    tally = run_search(session, prepared, source, overrides or {}, changes, jobs=jobs,
                       exact=exact, progress=progress)
    return finish(session, prepared, tally, time.perf_counter() - started)


def _default_session() -> Session:
    import llmpar

    return llmpar.default_session()


def finish(session: Session, prepared: Prepared, tally: Tally, seconds: float) -> SearchResult:
    """Rank the entries: Plans of the best (through `session.evaluate`), and the
    Pareto front's points."""
    settings, spec = prepared.settings, prepared.spec
    objective = settings.objective
    best = top(tally.entries, objective, settings.top)
    front = pareto_front(tally.entries)
    judge = Judge(prepared, session.strategies, session.cache)
    ranked = tuple(_ranked(session, judge, prepared, entry, rank)
                   for rank, entry in enumerate(best, 1))
    pareto = tuple(_point(judge, prepared, entry) for entry in front)
    considered = prepared.space.considered
    return SearchResult(
        objective=objective, considered=considered, evaluated=tally.evaluated,
        rejected=dict(sorted(tally.rejected.items())), examples=dict(tally.examples),
        ranked=tally.fitting, seconds=seconds,
        results=ranked, pareto=pareto,
        warnings=tuple(_warnings(spec, objective, tally)))


def _ranked(session: Session, judge: Judge, prepared: Prepared, entry: Entry,
            rank: int) -> Ranked:
    choice = prepared.choice(entry.index)
    spec = judge.builder.build(choice)
    plan = session.evaluate(spec)
    value = objective_value(prepared.settings.objective, spec, plan.total_bytes,
                            plan.step_seconds)
    return Ranked(rank=rank, choices=choice, objective=value, spec=spec, plan=plan)


def _point(judge: Judge, prepared: Prepared, entry: Entry) -> ParetoPoint:
    choice = prepared.choice(entry.index)
    return ParetoPoint(choices=choice, total_bytes=entry.total_bytes,
                       step_seconds=entry.step_seconds, spec=judge.builder.build(choice))


def _warnings(spec: Spec, objective: str, tally: Tally) -> list[str]:
    found = []
    if objective in TIME_OBJECTIVES and tally.time_models - {"modelled"}:
        gpu = spec.hardware.gpu.name
        found.append(f"step time is not modelled for {gpu!r} (time model: "
                     f"{', '.join(sorted(tally.time_models))}): it is the same for every "
                     "layout, so layouts rank by memory; give the GPU matmul_efficiency "
                     "and memory_efficiency to rank by time")
    return found + tally.notes


def _counts(session: Session, source: SpecSource | Spec, overrides: Mapping[str, Any],
            changes: Mapping[str, Any]) -> tuple[int, ...] | None:
    """`[search] num_gpus` of the spec with `changes`, None when it lists none (reading the
    spec is about a millisecond, against the search's fraction of a second and more)."""
    search_overrides = {f"search.{key}": value for key, value in changes.items()
                        if value is not None}
    spec, _ = read_spec(session, source, {**overrides, **search_overrides})
    return None if spec.search is None else spec.search.num_gpus


COUNT_PROBLEMS = ("$.search.values", "$.search")
"""Problems of one GPU count that leave it without layouts (a degree list none of whose
degrees divides it, a pin it cannot take), not of the spec: that count is passed over."""


def _prepare_count(session: Session, source: SpecSource | Spec,
                   overrides: Mapping[str, Any], changes: Mapping[str, Any],
                   num_gpus: int) -> Prepared | Problem:
    try:
        prepared = prepare(session, source, {**overrides, "hardware.num_gpus": num_gpus},
                           changes)
    except SpecError as error:
        if all(p.path == "$.search" or p.path.startswith("$.search.values.")
               for p in error.problems):
            return error.problems[0]
        raise
    if not prepared.space.nodes:
        return nothing_left(prepared.space, prepared.settings)
    return prepared


def search_counts(session: Session, source: SpecSource | Spec,
                  overrides: Mapping[str, Any], changes: Mapping[str, Any],
                  counts: tuple[int, ...], *, jobs: int, exact: bool,
                  progress: Progress | None, started: float) -> SearchResult:
    """`[search] num_gpus`: each count's space searched as the spec's own would be (the
    fast path, node by node), the results ranked together."""
    parts: list[tuple[Prepared, Tally]] = []
    summaries: list[GpuCount] = []
    for num_gpus in counts:
        found = _prepare_count(session, source, overrides, changes, num_gpus)
        if isinstance(found, Problem):
            summaries.append(GpuCount(num_gpus=num_gpus, considered=0, ranked=0,
                                      best_step_seconds=None, note=found.message))
            continue
        tally = run_search(session, found, source,
                           {**overrides, "hardware.num_gpus": num_gpus}, changes, jobs=jobs,
                           exact=exact, progress=progress)
        tally.entries = [attrs.evolve(e, num_gpus=num_gpus) for e in tally.entries]
        parts.append((found, tally))
        fastest = min((e.seconds for e in tally.entries), default=None)
        summaries.append(GpuCount(num_gpus=num_gpus, considered=found.space.considered,
                                  ranked=tally.fitting, best_step_seconds=fastest))
    if not parts:
        spec, _ = read_spec(session, source, overrides)
        raise SpecError([Problem("$.search.num_gpus", "no count of "
                                 f"{list(counts)!r} leaves a layout to search: "
                                 + "; ".join(f"{s.num_gpus}: {s.note}" for s in summaries))],
                        spec.source)
    return _finish_counts(session, parts, summaries, time.perf_counter() - started)


def _finish_counts(session: Session, parts: list[tuple[Prepared, Tally]],
                   summaries: list[GpuCount], seconds: float) -> SearchResult:
    """Rank the entries of every count together (`ranking.sort_key`), with the Pareto
    fronts of memory versus time and of GPU count versus time or cost."""
    # A layout's number across counts: its part's offset plus its number in the part.
    offsets, entries, total = [], [], 0
    for prepared, tally in parts:
        offsets.append(total)
        entries += [attrs.evolve(e, index=e.index + total) for e in tally.entries]
        total += prepared.space.considered
    judges = [Judge(p, session.strategies, session.cache) for p, _ in parts]

    def locate(entry: Entry) -> tuple[Prepared, Judge, Entry]:
        part = max(i for i, offset in enumerate(offsets) if offset <= entry.index)
        local = attrs.evolve(entry, index=entry.index - offsets[part])
        return parts[part][0], judges[part], local

    first = parts[0][0]
    settings = first.settings
    objective = settings.objective
    ranked = []
    for rank, entry in enumerate(top(entries, objective, settings.top), 1):
        prepared, judge, local = locate(entry)
        ranked.append(_ranked(session, judge, prepared, local, rank))
    pareto = []
    for entry in pareto_front(entries):
        prepared, judge, local = locate(entry)
        pareto.append(_point(judge, prepared, local))
    front = []
    for entry in gpus_front(entries, objective):
        prepared, judge, local = locate(entry)
        choice = prepared.choice(local.index)
        spec = judge.builder.build(choice)
        cost = (None if spec.hardware.gpu_hour_cost is None else
                objective_value("cost", spec, entry.total_bytes, entry.step_seconds))
        front.append(GpusPoint(num_gpus=entry.num_gpus, choices=choice,
                               total_bytes=entry.total_bytes, step_seconds=entry.step_seconds,
                               cost=cost, spec=spec))
    tally = merge(t for _, t in parts)
    return SearchResult(
        objective=objective, considered=total, evaluated=tally.evaluated,
        rejected=dict(sorted(tally.rejected.items())), examples=dict(tally.examples),
        ranked=tally.fitting, seconds=seconds, results=tuple(ranked), pareto=tuple(pareto),
        warnings=tuple(_warnings(first.spec, objective, tally)),
        gpu_counts=tuple(summaries), gpus_pareto=tuple(front))
