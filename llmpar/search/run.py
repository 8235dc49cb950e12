"""Running a prepared search: over processes when asked, by the fast path when it
covers the search, else exhaustively.

The fast path (llmpar.search.fast) needs numpy and models only the built-in
strategies; a plugin's dimension or strategy, `exact=True`, or a missing numpy
make the search evaluate every layout exactly (same results, slower).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from llmpar.search.exhaustive import Judge, Progress, run_exhaustive
from llmpar.search.tally import Tally, merge

if TYPE_CHECKING:
    from llmpar.search.prepare import Prepared
    from llmpar.session import Session
    from llmpar.strategy import Strategy

PARALLEL_LAYOUTS = 200_000
"""With jobs = 0, spaces at least this large are split over every core: below it,
starting processes (each loads llmpar and lays out the space again, about a second)
costs more than it saves."""
BUILTIN = frozenset({"data", "tensor", "sequence", "context", "expert", "pipeline"})
KNOWN_KEYS = frozenset({"tensor.degree", "context.degree", "expert.degree", "pipeline.degree",
                        "data.degree", "data.zero", "sequence", "context.kind",
                        "pipeline.schedule", "pipeline.virtual_stages",
                        "pipeline.layers_per_stage", "training.micro_batch_size",
                        "training.recompute"})


def unsupported(prepared: Prepared, strategies: Mapping[str, Strategy]) -> str | None:
    """Why the fast path cannot cover this search (a plugin takes part, or numpy is
    not installed), or None."""
    if importlib.util.find_spec("numpy") is None:
        return "numpy is not installed"
    keys = {d.key for d in prepared.space.dimensions} | {"data.degree"}
    unknown = sorted(keys - KNOWN_KEYS)
    if unknown:
        return f"dimensions {', '.join(unknown)} are not built in"
    foreign = sorted((set(prepared.spec.parallel) | {d.strategy for d in
                                                     prepared.space.dimensions}) - BUILTIN)
    for name in BUILTIN & set(strategies):
        if not type(strategies[name]).__module__.startswith("llmpar.strategies."):
            foreign.append(name)
    return f"strategies {', '.join(foreign)} are not built in" if foreign else None


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
    """Judge or prune every layout of `nodes`, by the fast path when it applies."""
    why = None if exact else unsupported(prepared, session.strategies)
    if not exact and why is None:
        from llmpar.search.fast import run_fast

        return run_fast(session, prepared, nodes, progress)
    indices = (prepared.offsets[n] + i for n in nodes for i in range(prepared.space.nodes[n].size))
    total = sum(prepared.space.nodes[n].size for n in nodes)
    tally = run_exhaustive(Judge(prepared, session.strategies), indices, total, progress)
    if why is not None:
        tally.notes.append(f"every layout was evaluated exactly: {why}")
    return tally
