"""Two plans side by side: every field that differs, in human units, with B/A."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.plan import Plan, ServingPool
from llmpar.plan_json import POOL_FROM_V1, V1_KEYS
from llmpar.report.fields import format_value
from llmpar.report.tables import Table

SKIPPED_FIELDS = ("activation_tensors", "collectives", "stages", "warnings", "derivations",
                  "phases", "training", "serving")
"""Record lists: `llmpar evaluate` shows them; their totals are compared here."""
POOL_FIELDS_SINCE_V1 = tuple(f.name for f in attrs.fields(ServingPool)
                             if f.name not in V1_KEYS and f.name not in POOL_FROM_V1
                             and f.name not in SKIPPED_FIELDS)
"""The serving pool's fields that schema 1's flat record lacks (`serving.max_prompt_tokens`,
...): compared from the first pool."""


@attrs.frozen(kw_only=True)
class Difference:
    """One plan field whose values differ."""

    field: str
    a: Any
    b: Any

    @property
    def ratio(self) -> float | None:
        """b / a for two numbers with a non-zero a, else None."""
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool)
                      for x in (self.a, self.b))
        return self.b / self.a if numbers and self.a else None


def _flat(plan: Plan) -> dict[str, Any]:
    """Scalar fields, with dict fields spread as `field.key`; totals of record lists."""
    values: dict[str, Any] = {}
    for name in V1_KEYS:  # schema 1's fields, in their order
        value = getattr(plan, name)
        if name in SKIPPED_FIELDS:
            continue
        if isinstance(value, dict):
            values.update({f"{name}.{key}": item for key, item in value.items()})
        else:
            values[name] = value
    for name in POOL_FIELDS_SINCE_V1 if plan.serving else ():
        values[f"serving.{name}"] = getattr(plan.serving[0], name)
    values["collectives.seconds"] = sum(c.seconds for c in plan.collectives)
    values["collectives.exposed_seconds"] = sum(c.exposed_seconds for c in plan.collectives)
    values["warnings.count"] = len(plan.warnings)
    return values


def plan_differences(a: Plan, b: Plan) -> tuple[Difference, ...]:
    """Every field whose value differs between `a` and `b`, in Plan order."""
    flat_a, flat_b = _flat(a), _flat(b)
    names = list(flat_a) + [name for name in flat_b if name not in flat_a]
    return tuple(Difference(field=name, a=flat_a.get(name), b=flat_b.get(name))
                 for name in names if flat_a.get(name) != flat_b.get(name))


def diff_table(a: Plan, b: Plan, label_a: str = "A", label_b: str = "B") -> Table:
    """The differences as a table: field, A, B, B/A."""
    rows = tuple((d.field, format_value(d.field, d.a), format_value(d.field, d.b),
                  f"{d.ratio:.3g}x" if d.ratio is not None else "")
                 for d in plan_differences(a, b))
    notes: tuple[str, ...] = (f"A: {label_a}", f"B: {label_b}")
    if not rows:
        notes += ("the plans are the same",)
    return Table(title="Plan differences (GB = 10^9 bytes, GiB = 2^30 bytes)",
                 columns=("field", "A", "B", "B/A"), rows=rows, notes=notes)
