"""The search's fast path: estimate every layout of a node at once, prune, evaluate
the rest exactly, best first.

1. Per node, the rules (llmpar.search.rules) reject layouts that break a strategy's
   check, and the estimates (estimate_memory, estimate_time) give memory and step
   time of the rest.
2. A layout whose estimated memory, less MARGIN, exceeds the limit is rejected.
3. The rest are evaluated exactly in order of their estimate; a layout whose
   estimate, less MARGIN, ranks below the current top N and is dominated on memory
   and time by a point of the current Pareto front is pruned ("outranked").
Every layout kept is checked by the strategies and scored by evaluation's own
functions (llmpar.search.exact). Each exact evaluation is also compared with the
estimate; a gap above MARGIN / 2 turns into a warning in the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from llmpar.search.estimate_memory import memory
from llmpar.search.estimate_time import step_seconds
from llmpar.search.exhaustive import Judge, Progress
from llmpar.search.facts import Facts
from llmpar.search.grid import Grid
from llmpar.search.pruning import Survivors, best_first
from llmpar.search.ranking import Entry
from llmpar.search.result import REJECTED_MEMORY
from llmpar.search.rules import PATHS, reason_codes
from llmpar.search.tally import Tally

if TYPE_CHECKING:
    from llmpar.search.prepare import Prepared
    from llmpar.session import Session

MARGIN = 0.01
"""Relative slack on every estimate before it rejects or prunes a layout. The
estimates match evaluation to rounding for the built-in strategies (tests check
1e-9); the slack absorbs model changes until the estimates follow them."""
SAMPLES = 16
"""Layouts the estimate rejected for memory closest to the limit, evaluated exactly
as a check."""


def run_fast(session: Session, prepared: Prepared, nodes: list[int],
             progress: Progress | None) -> Tally:
    """Estimate, reject and prune the layouts of `nodes`; evaluate the rest exactly."""
    judge = Judge(prepared, session.strategies)
    facts = Facts(prepared.spec)
    tally = Tally()
    survivors, near = _estimate_nodes(facts, judge, nodes, tally, progress)
    _check_memory_rejections(judge, near, tally)
    objective = prepared.settings.objective
    primary = "memory" if objective == "memory" or not facts.modelled else "time"
    best_first(judge, survivors, primary, prepared.settings.top, MARGIN, tally, progress)
    if tally.drift > MARGIN / 2:
        tally.notes.append(f"the fast estimate differed from the evaluation by up to "
                           f"{tally.drift:.2%}, more than half its margin ({MARGIN:.0%}): "
                           "layouts may have been pruned wrongly; rerun with exact=True "
                           "and report it")
    return tally


def _estimate_nodes(facts: Facts, judge: Judge, nodes: list[int], tally: Tally,
                    progress: Progress | None) -> tuple[Survivors, Survivors]:
    """Reject by rules and by estimated memory; the rest, and the memory rejections
    closest to the limit."""
    prepared = judge.prepared
    limit = prepared.memory_limit_bytes
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    near: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    firsts: dict[int, int] = {}
    done, total = 0, sum(prepared.space.nodes[n].size for n in nodes)
    for n in nodes:
        node = prepared.space.nodes[n]
        grid = Grid(node, facts.shared)
        codes = grid.full(reason_codes(facts, grid))
        offset = prepared.offsets[n]
        for code, count in zip(*np.unique(codes[codes > 0], return_counts=True)):
            tally.reject(PATHS[code - 1], int(count))
            firsts.setdefault(int(code), offset + int(np.argmax(codes == code)))
        valid = np.flatnonzero(codes == 0)
        if valid.size:
            mem, seconds = _estimates(facts, grid)
            mem, seconds = mem[valid], seconds[valid]
            fits = mem * (1 - MARGIN) <= limit
            tally.reject(REJECTED_MEMORY, int((~fits).sum()))
            kept.append((offset + valid[fits], mem[fits], seconds[fits]))
            near.append((offset + valid[~fits], mem[~fits], seconds[~fits]))
        done += node.size
        if progress is not None:
            progress("estimating", done, total)
    _examples(judge, firsts, tally)
    return Survivors.of(kept), Survivors.of(near).closest(SAMPLES)


def _estimates(facts: Facts, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    mem, traffic = memory(facts, grid)
    # Unmodelled step time is the same for every layout: no bound on it prunes anything.
    seconds = step_seconds(facts, grid, traffic) if facts.modelled else np.full(grid.shape,
                                                                                np.inf)
    return grid.full(mem), grid.full(seconds)


def _examples(judge: Judge, firsts: Mapping[int, int], tally: Tally) -> None:
    """The strategies' own message for each rule's first rejection; a rule that
    disagrees with the strategies is reported as drift."""
    for code, index in sorted(firsts.items()):
        problem, _ = judge.examine(index)
        if problem is None or problem.path != PATHS[code - 1]:
            found = "no problem" if problem is None else problem.path
            tally.notes.append(f"the search's rule {PATHS[code - 1]} rejected layout {index}, "
                               f"but the strategies' checks report {found}: rerun with "
                               "exact=True and report it")
            continue
        tally.examples.setdefault(problem.path, problem.message)


def _check_memory_rejections(judge: Judge, near: Survivors, tally: Tally) -> None:
    """Evaluate the estimate's memory rejections closest to the limit; one that fits
    after all is kept and reported as drift."""
    for index, estimate in zip(near.index.tolist(), near.memory.tolist()):
        problem, score = judge.examine(index)
        if problem is not None or score is None:
            continue
        tally.evaluated += 1
        tally.drift = max(tally.drift, abs(score.total_bytes - estimate) / estimate)
        if score.total_bytes <= judge.prepared.memory_limit_bytes:
            tally.rejected[REJECTED_MEMORY] -= 1
            tally.entries.append(Entry(index=index, total_bytes=score.total_bytes,
                                       step_seconds=score.step_seconds))
