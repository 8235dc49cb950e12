"""The Markdown report of a Plan: one pipe table per section."""

from __future__ import annotations

from collections.abc import Sequence

from llmpar.plan import Plan
from llmpar.report.sections import all_sections
from llmpar.report.tables import Table, render_markdown


def markdown_report(plan: Plan, extra: Sequence[Table] = ()) -> str:
    """The whole plan as GitHub-flavoured Markdown (with plugins' `extra` sections)."""
    first, *rest = all_sections(plan, extra)
    lines = [f"## {first.title}", ""] + [f"- {note}" for note in first.notes]
    return "\n\n".join(["\n".join(lines)] + [render_markdown(table) for table in rest]) + "\n"
