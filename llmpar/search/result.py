"""What a search returns: the ranked layouts as Plans, the Pareto front, and counts."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.plan import Plan
from llmpar.spec import Spec

REJECTED_MEMORY = "memory"
"""Rejection reason: does not fit in the GPU's memory (or `[search] memory_limit_bytes`)."""


@attrs.frozen(kw_only=True)
class Ranked:
    """One layout: its choices, the spec that runs it, and its Plan."""

    rank: int
    """1 for the best."""
    choices: dict[str, Any] = attrs.field(hash=False)
    """A value for every search dimension ("tensor.degree", "data.zero", "sequence",
    "training.micro_batch_size", ...)."""
    objective: float | None
    """The objective in its unit (seconds, tokens/s per GPU, $ per million tokens, bytes)."""
    spec: Spec
    plan: Plan

    @property
    def layout(self) -> dict[str, int]:
        return self.plan.layout

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "layout": dict(self.plan.layout),
                "choices": dict(self.choices), "objective": self.objective,
                "total_bytes": self.plan.total_bytes, "step_seconds": self.plan.step_seconds,
                "plan": self.plan.to_dict()}

    def to_toml(self) -> str:
        """The layout's spec as TOML that `llmpar evaluate` runs."""
        import llmpar

        return llmpar.dump_spec(self.spec)


@attrs.frozen(kw_only=True)
class ParetoPoint:
    """A layout on the Pareto front: its choices, memory, step time and spec. Its
    numbers are evaluation's; `llmpar.evaluate(point.spec)` gives the whole Plan."""

    choices: dict[str, Any] = attrs.field(hash=False)
    total_bytes: int
    step_seconds: float | None
    spec: Spec

    @property
    def layout(self) -> dict[str, int]:
        return degrees_of(self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "choices": dict(self.choices),
                "total_bytes": self.total_bytes, "step_seconds": self.step_seconds}


def degrees_of(choices: dict[str, Any]) -> dict[str, int]:
    """Every strategy's degree above 1 (data's always), from a layout's choices."""
    found = {key.removesuffix(".degree"): value for key, value in choices.items()
             if key.endswith(".degree")}
    return {name: d for name, d in found.items() if d > 1 or name == "data"}


@attrs.frozen(kw_only=True)
class SearchResult:
    """Every layout considered, how many were evaluated or rejected and why, the best
    ones as Plans, and the Pareto front of memory per GPU versus step time."""

    objective: str
    considered: int
    """Layouts enumerated: every combination of the dimensions' values."""
    evaluated: int
    """Valid layouts whose memory and step time were computed (every one: the fast path
    evaluates a node of layouts in one call)."""
    rejected: dict[str, int] = attrs.field(hash=False)
    """Layouts left out, by reason: a rule's key path (the first problem the strategies'
    checks report), or "memory"."""
    examples: dict[str, str] = attrs.field(hash=False)
    """One message per rejection reason."""
    ranked: int
    """Layouts evaluated that pass every check and fit: the pool the results and
    the front come from; considered = ranked + the sum of rejected."""
    seconds: float
    results: tuple[Ranked, ...]
    pareto: tuple[ParetoPoint, ...]
    """Memory ascending; each needs less memory than the next and takes longer."""
    warnings: tuple[str, ...] = ()

    @property
    def best(self) -> Ranked:
        if not self.results:
            raise LookupError("no layout is valid and fits; see `rejected`")
        return self.results[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data."""
        return {"objective": self.objective, "considered": self.considered,
                "evaluated": self.evaluated, "ranked": self.ranked,
                "rejected": dict(self.rejected), "rejection_examples": dict(self.examples),
                "seconds": self.seconds, "warnings": list(self.warnings),
                "results": [r.to_dict() for r in self.results],
                "pareto": [r.to_dict() for r in self.pareto]}
