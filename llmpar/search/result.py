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
        """Degree of every active strategy (the plan's layout)."""
        return self.plan.layout

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "num_gpus": self.spec.hardware.num_gpus,
                "layout": dict(self.plan.layout),
                "choices": dict(self.choices), "objective": self.objective,
                "total_bytes": self.plan.total_bytes, "step_seconds": self.plan.step_seconds,
                "plan": self.plan.to_dict()}

    def to_toml(self) -> str:
        """The layout's spec as TOML that `llmpar evaluate` runs: its presets by name,
        with only the keys that differ from them (`Session.emit_spec`)."""
        import llmpar

        return llmpar.default_session().emit_spec(self.spec)


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
        """Every strategy's degree above 1 (data's always), from the choices."""
        return degrees_of(self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "choices": dict(self.choices),
                "total_bytes": self.total_bytes, "step_seconds": self.step_seconds,
                "num_gpus": self.spec.hardware.num_gpus}


def degrees_of(choices: dict[str, Any]) -> dict[str, int]:
    """Every strategy's degree above 1 (data's always), from a layout's choices."""
    found = {key.removesuffix(".degree"): value for key, value in choices.items()
             if key.endswith(".degree")}
    return {name: d for name, d in found.items() if d > 1 or name == "data"}


@attrs.frozen(kw_only=True)
class GpuCount:
    """What the search found on one of `[search] num_gpus`'s counts."""

    num_gpus: int
    considered: int
    ranked: int
    """Layouts on this many GPUs that pass every check, fit and meet the limits
    (`train_seconds_max`, `tokens_per_second_min`)."""
    best_step_seconds: float | None
    """The fastest of them; None when none is ranked."""
    note: str = ""
    """Why no layout was laid out on this count (a pin or `[search] values` it cannot
    take), if so."""

    def to_dict(self) -> dict[str, Any]:
        return {"num_gpus": self.num_gpus, "considered": self.considered,
                "ranked": self.ranked, "best_step_seconds": self.best_step_seconds,
                "note": self.note}


@attrs.frozen(kw_only=True)
class GpusPoint:
    """A layout on the front of GPU count versus step time (or versus cost): the best
    layout of its count, better than the best on any fewer GPUs."""

    num_gpus: int
    choices: dict[str, Any] = attrs.field(hash=False)
    total_bytes: int
    step_seconds: float | None
    cost: float | None
    """Dollars per million tokens at `[hardware] gpu_hour_cost`; None without a price."""
    spec: Spec

    @property
    def layout(self) -> dict[str, int]:
        """Every strategy's degree above 1 (data's always), from the choices."""
        return degrees_of(self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {"num_gpus": self.num_gpus, "layout": self.layout,
                "choices": dict(self.choices), "total_bytes": self.total_bytes,
                "step_seconds": self.step_seconds, "cost": self.cost}


@attrs.frozen(kw_only=True)
class SearchResult:
    """Every layout considered, how many were evaluated or rejected and why, the best
    ones as Plans, and the Pareto front of memory per GPU versus step time."""

    objective: str
    """What the layouts are ranked by (`[search] objective`: step_time,
    tokens_per_second_per_gpu, cost, memory or gpus)."""
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
    """Wall time of the search."""
    results: tuple[Ranked, ...]
    """The best layouts, best first (at most `[search] top`)."""
    pareto: tuple[ParetoPoint, ...]
    """Memory ascending; each needs less memory than the next and takes longer."""
    warnings: tuple[str, ...] = ()
    """What the search could not do or what its ranking leaves out."""
    gpu_counts: tuple[GpuCount, ...] = ()
    """With `[search] num_gpus`: each count tried, fewest first (else empty)."""
    gpus_pareto: tuple[GpusPoint, ...] = ()
    """With `[search] num_gpus`: the front of GPU count versus step time (versus cost for
    the cost and tokens_per_second_per_gpu objectives), fewest GPUs first."""

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
                "pareto": [r.to_dict() for r in self.pareto],
                "gpu_counts": [c.to_dict() for c in self.gpu_counts],
                "gpus_pareto": [p.to_dict() for p in self.gpus_pareto]}
