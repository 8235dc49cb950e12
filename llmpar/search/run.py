"""Running a prepared search: over processes when asked, by the fast path
(llmpar.search.vectorised: evaluation's own code on arrays, a node at a time), or with
`exact=True` one layout at a time (for checking: the same numbers, slower)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from llmpar.search.exhaustive import Judge, Progress, run_exhaustive
from llmpar.search.tally import Tally, merge

if TYPE_CHECKING:
    from llmpar.search.prepare import Prepared
    from llmpar.session import Session

PARALLEL_LAYOUTS = 200_000
"""With jobs = 0, spaces at least this large are split over every core: below it,
starting processes (each loads llmpar and lays out the space again, about a second)
costs more than it saves."""


def run_search(session: Session, prepared: Prepared, source: Any,
               overrides: Mapping[str, Any], changes: Mapping[str, Any], *, jobs: int,
               exact: bool, progress: Progress | None) -> Tally:
    """Judge or prune every layout; with `jobs` > 1, in that many processes; with 0, in
    one per core when the space is large enough to repay starting them."""
    nodes = list(range(len(prepared.space.nodes)))
    if jobs == 0:
        large = prepared.space.considered >= PARALLEL_LAYOUTS
        jobs = (os.cpu_count() or 1) if large else 1
    if jobs > 1 and len(nodes) > 1:
        parts = [nodes[i::jobs] for i in range(jobs)]
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_part, source, dict(overrides), dict(changes), part, exact)
                       for part in parts if part]
            return merge(future.result() for future in futures)
    return run_nodes(session, prepared, nodes, exact, progress)


def _part(source: Any, overrides: dict[str, Any], changes: dict[str, Any], nodes: list[int],
          exact: bool) -> Tally:
    import llmpar
    from llmpar.search.prepare import prepare

    session = llmpar.default_session()
    return run_nodes(session, prepare(session, source, overrides, changes), nodes, exact, None)


def run_nodes(session: Session, prepared: Prepared, nodes: list[int], exact: bool,
              progress: Progress | None) -> Tally:
    """Judge every layout of `nodes`, by the fast path unless `exact`."""
    if not exact:
        from llmpar.search.vectorised import run_fast

        return run_fast(prepared, session, nodes, progress)
    indices = (prepared.offsets[n] + i for n in nodes for i in range(prepared.space.nodes[n].size))
    total = sum(prepared.space.nodes[n].size for n in nodes)
    return run_exhaustive(Judge(prepared, session.strategies, session.cache), indices, total,
                          progress)
