"""`llmpar.search`: the best layouts of a spec's model on its GPUs, found exhaustively."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmpar.errors import Problem, SpecError
from llmpar.loading.reader import SpecSource
from llmpar.search.exhaustive import Judge, Progress
from llmpar.search.prepare import Prepared, prepare
from llmpar.search.ranking import TIME_OBJECTIVES, Entry, objective_value, pareto_front, top
from llmpar.search.result import ParetoPoint, Ranked, SearchResult
from llmpar.search.run import run_search
from llmpar.search.space import nothing_left
from llmpar.search.tally import Tally
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
