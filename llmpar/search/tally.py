"""Counting what a search did with each layout, and merging counts of parts."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llmpar.search.ranking import Entry


@attrs.define
class Tally:
    """Valid layouts that fit (as entries), rejections by reason, exact evaluations."""

    entries: list[Entry] = attrs.field(factory=list)
    """Layouts that can be among the top ones or on the Pareto front."""
    fitting: int = 0
    """Valid layouts that fit."""
    rejected: dict[str, int] = attrs.field(factory=dict)
    examples: dict[str, str] = attrs.field(factory=dict)
    evaluated: int = 0
    time_models: set[str] = attrs.field(factory=set)
    notes: list[str] = attrs.field(factory=list)
    """Warnings for the result."""

    def reject(self, reason: str, count: int = 1, example: str = "") -> None:
        if count <= 0:
            return
        self.rejected[reason] = self.rejected.get(reason, 0) + count
        if example and reason not in self.examples:
            self.examples[reason] = example


def merge(parts: Iterable[Tally]) -> Tally:
    total = Tally()
    for part in parts:
        total.entries += part.entries
        total.fitting += part.fitting
        for reason, count in part.rejected.items():
            total.reject(reason, count, part.examples.get(reason, ""))
        total.evaluated += part.evaluated
        total.time_models |= part.time_models
        total.notes += [note for note in part.notes if note not in total.notes]
    return total
