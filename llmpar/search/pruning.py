"""Best-first exact evaluation of the layouts the estimates keep, with pruning.

Layouts go in order of their estimate of the primary quantity (step time, or memory
when that is the objective or time is not modelled). One is pruned when its
estimates less the margin rank it below the current N-th best exactly evaluated
layout and a point of the current exact Pareto front needs no more memory and no
more time than its estimates less the margin: then neither the top N nor the front
can hold it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from llmpar.search.ranking import Entry, pareto_front
from llmpar.search.result import REJECTED_BOUND
from llmpar.search.tally import Tally

if TYPE_CHECKING:
    from llmpar.search.exhaustive import Judge, Progress

BATCH = 64


@attrs.frozen(kw_only=True)
class Survivors:
    """Layouts by enumeration number, with their estimated memory and step time."""

    index: np.ndarray
    memory: np.ndarray
    seconds: np.ndarray

    @classmethod
    def of(cls, parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Survivors:
        if not parts:
            return cls(index=np.zeros(0, np.int64), memory=np.zeros(0), seconds=np.zeros(0))
        return cls(index=np.concatenate([p[0] for p in parts]).astype(np.int64),
                   memory=np.concatenate([p[1] for p in parts]),
                   seconds=np.concatenate([p[2] for p in parts]))

    def closest(self, count: int) -> Survivors:
        """The `count` with the least estimated memory."""
        keep = np.argsort(self.memory, kind="stable")[:count]
        return Survivors(index=self.index[keep], memory=self.memory[keep],
                         seconds=self.seconds[keep])


class Frontier:
    """The exact top N (by the primary quantity) and Pareto front found so far."""

    def __init__(self, primary: str, top: int):
        self.primary, self.top = primary, top
        self.entries: list[Entry] = []
        self.best: list[float] = []
        self.front_memory = np.zeros(0)
        self.front_seconds = np.zeros(0)

    def add(self, entries: list[Entry]) -> None:
        if not entries:
            return
        self.entries += entries
        values = [e.total_bytes if self.primary == "memory" else e.seconds for e in entries]
        self.best = sorted(self.best + values)[: self.top]
        front = pareto_front(self.entries)
        self.entries = front + [e for e in self.entries if e not in front]
        self.front_memory = np.array([e.total_bytes for e in front], dtype=float)
        self.front_seconds = np.array([e.seconds for e in front], dtype=float)

    @property
    def nth(self) -> float:
        return self.best[-1] if len(self.best) >= self.top else math.inf

    def hopeless(self, memory: np.ndarray, seconds: np.ndarray,
                 primary: np.ndarray) -> np.ndarray:
        """Which bounds can reach neither the top N nor the Pareto front."""
        outranked = primary > self.nth
        if not self.front_memory.size:
            return np.zeros(memory.shape, dtype=bool)
        below = np.searchsorted(self.front_memory, memory, side="right")
        fastest = np.where(below > 0, self.front_seconds[np.maximum(below - 1, 0)], np.inf)
        return outranked & (fastest <= seconds)


def best_first(judge: Judge, survivors: Survivors, primary: str, top: int, margin: float,
               tally: Tally, progress: Progress | None = None) -> None:
    """Evaluate the survivors best first; prune the hopeless; add entries to `tally`."""
    memory = survivors.memory * (1 - margin)
    seconds = survivors.seconds * (1 - margin)
    key = memory if primary == "memory" else seconds
    frontier = Frontier(primary, top)
    seeds = _likely_best(survivors, key, top)
    frontier.add(_evaluate_all(judge, survivors, seeds, tally))
    rest = np.setdiff1d(np.arange(key.size), seeds, assume_unique=True)
    order = rest[np.lexsort((survivors.index[rest], key[rest]))]
    position = 0
    while position < order.size:
        batch = order[position:position + BATCH]
        position += batch.size
        hopeless = frontier.hopeless(memory[batch], seconds[batch], key[batch])
        tally.reject(REJECTED_BOUND, int(hopeless.sum()))
        frontier.add(_evaluate_all(judge, survivors, batch[~hopeless], tally))
        if position < order.size and key[order[position]] > frontier.nth:
            order = _drop_dominated(order, position, frontier, memory, seconds, key, tally)
            position = 0
        if progress is not None:
            progress("evaluating", tally.evaluated,
                     tally.evaluated + order.size - position)


def _likely_best(survivors: Survivors, key: np.ndarray, top: int) -> np.ndarray:
    """The estimated top N and the estimated Pareto front: evaluated first, they make
    the bounds tight from the start."""
    if not key.size:
        return np.zeros(0, dtype=np.int64)
    best = np.lexsort((survivors.index, key))[:top]
    order = np.lexsort((survivors.index, survivors.seconds, survivors.memory))
    fastest = np.minimum.accumulate(survivors.seconds[order])
    on_front = np.concatenate(([True], survivors.seconds[order][1:] < fastest[:-1]))
    return np.unique(np.concatenate((best, order[on_front])))


def _evaluate_all(judge: Judge, survivors: Survivors, positions: np.ndarray,
                  tally: Tally) -> list[Entry]:
    found = []
    for i in positions.tolist():
        entry = _evaluate(judge, survivors, i, tally)
        if entry is not None:
            found.append(entry)
    tally.entries += found
    return found


def _drop_dominated(order: np.ndarray, position: int, frontier: Frontier, memory: np.ndarray,
                    seconds: np.ndarray, key: np.ndarray, tally: Tally) -> np.ndarray:
    """Every later layout is outranked now; keep only those the front does not dominate."""
    rest = order[position:]
    hopeless = frontier.hopeless(memory[rest], seconds[rest], key[rest])
    tally.reject(REJECTED_BOUND, int(hopeless.sum()))
    return rest[~hopeless]


def _evaluate(judge: Judge, survivors: Survivors, i: int, tally: Tally) -> Entry | None:
    index = int(survivors.index[i])
    problem, score = judge.examine(index)
    if score is not None:
        gaps = [abs(score.total_bytes - survivors.memory[i]) / max(score.total_bytes, 1)]
        if score.step_seconds and math.isfinite(survivors.seconds[i]):
            gaps.append(abs(score.step_seconds - survivors.seconds[i]) / score.step_seconds)
        tally.drift = max(tally.drift, *gaps)
    return judge.count(index, problem, score, tally)
