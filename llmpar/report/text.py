"""The plain-text report of a Plan: aligned tables, bars against capacity."""

from __future__ import annotations

from llmpar.plan import Plan
from llmpar.report.sections import all_sections
from llmpar.report.tables import render_text


def text_report(plan: Plan) -> str:
    """The whole plan, readable in a terminal without colour."""
    return "\n\n".join(render_text(table) for table in all_sections(plan))
