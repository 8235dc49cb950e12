"""The plain-text report of a Plan: aligned tables, bars against capacity."""

from __future__ import annotations

from collections.abc import Sequence

from llmpar.plan import Plan
from llmpar.report.sections import all_sections
from llmpar.report.tables import Table, render_text


def text_report(plan: Plan, extra: Sequence[Table] = ()) -> str:
    """The whole plan, readable in a terminal without colour (with plugins' `extra`
    sections)."""
    return "\n\n".join(render_text(table) for table in all_sections(plan, extra))
