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

    @property
    def seconds(self) -> float:
        return math.inf if self.step_seconds is None else self.step_seconds


def sort_key(entry: Entry, objective: str) -> tuple[float, float, float, int]:
    """Best first: the objective, then less memory, then less time, then enumeration order."""
    if objective == "memory":
        return (entry.total_bytes, entry.seconds, 0.0, entry.index)
    return (entry.seconds, entry.total_bytes, 0.0, entry.index)


def objective_value(objective: str, spec: Spec, total_bytes: int,
                    step_seconds: float | None) -> float | None:
    """The objective in its unit: seconds, tokens/s per GPU, dollars per million tokens
    (at `[hardware] gpu_hour_cost`), or bytes."""
    if objective == "memory":
        return float(total_bytes)
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
