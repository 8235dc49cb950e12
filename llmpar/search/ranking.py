"""Objectives, the order of layouts, and the Pareto front of memory versus step time."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from llmpar.spec import Spec

TIME_OBJECTIVES = ("step_time", "tokens_per_second_per_gpu", "cost")
"""Objectives that, for one spec (fixed GPUs and tokens per step), order layouts as
step time does."""


@attrs.frozen(kw_only=True)
class Entry:
    """A layout that is valid and fits: its number in the enumeration and its score."""

    index: int
    total_bytes: int
    step_seconds: float | None
    num_gpus: int = 0
    """The layout's GPU count when a search tries several (`[search] num_gpus`); 0: the
    spec's one count."""

    @property
    def seconds(self) -> float:
        return math.inf if self.step_seconds is None else self.step_seconds

    @property
    def gpu_seconds(self) -> float:
        """GPUs x step seconds: per token of the fixed global batch, what orders
        `cost` and `tokens_per_second_per_gpu` across GPU counts (`objective_value`)."""
        return self.num_gpus * self.seconds


def sort_key(entry: Entry, objective: str) -> tuple[float, float, float, int]:
    """Best first: the objective, then less memory, then less time, then fewer GPUs, then
    enumeration order. For one GPU count the time objectives rank alike; across counts
    cost and tokens per second per GPU rank by GPU-seconds per step (the price and the
    tokens per step are the same for every count), and `gpus` by the count, ties broken
    by step time."""
    if objective == "memory":
        return (entry.total_bytes, entry.seconds, entry.num_gpus, entry.index)
    if objective == "gpus":
        return (entry.num_gpus, entry.seconds, entry.total_bytes, entry.index)
    if objective in ("cost", "tokens_per_second_per_gpu") and entry.num_gpus:
        return (entry.gpu_seconds, entry.total_bytes, entry.num_gpus, entry.index)
    return (entry.seconds, entry.total_bytes, entry.num_gpus, entry.index)


def objective_value(objective: str, spec: Spec, total_bytes: int,
                    step_seconds: float | None) -> float | None:
    """The objective in its unit: seconds, tokens/s per GPU, dollars per million tokens
    (at `[hardware] gpu_hour_cost`), or bytes."""
    if objective == "memory":
        return float(total_bytes)
    if objective == "gpus":
        return float(spec.hardware.num_gpus)
    if step_seconds is None:
        return None
    num_gpus = spec.hardware.num_gpus
    tokens = tokens_per_step(spec)
    if objective == "tokens_per_second_per_gpu":
        return tokens / step_seconds / num_gpus
    if objective == "cost":
        price = spec.hardware.gpu_hour_cost or 0.0
        return price * num_gpus * step_seconds / 3600 / tokens * 1e6
    return step_seconds


def tokens_per_step(spec: Spec) -> int:
    training = spec.training
    assert training.global_batch_size is not None
    return training.global_batch_size * training.sequence_length


def pareto_front(entries: Iterable[Entry]) -> list[Entry]:
    """Layouts no other beats on both memory and step time, by memory ascending; of
    layouts with equal memory and time, the first enumerated."""
    front: list[Entry] = []
    best = math.inf
    for entry in sorted(entries, key=lambda e: (e.total_bytes, e.seconds, e.index)):
        if entry.seconds < best:
            front.append(entry)
            best = entry.seconds
    return front


def top(entries: Iterable[Entry], objective: str, count: int) -> list[Entry]:
    return sorted(entries, key=lambda e: sort_key(e, objective))[:count]


def gpus_front(entries: Iterable[Entry], objective: str) -> list[Entry]:
    """Across GPU counts: the best layout of each count (by `objective`'s time, or
    GPU-seconds per step for cost and tokens per second per GPU), kept when it beats every
    layout on fewer GPUs; fewest GPUs first."""
    by_cost = objective in ("cost", "tokens_per_second_per_gpu")

    def value(entry: Entry) -> float:
        return entry.gpu_seconds if by_cost else entry.seconds

    front: list[Entry] = []
    best = math.inf
    for entry in sorted(entries, key=lambda e: (e.num_gpus, value(e), e.total_bytes,
                                                e.index)):
        if value(entry) < best:
            front.append(entry)
            best = value(entry)
    return front
