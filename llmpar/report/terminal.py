"""The report rendered with rich (an optional extra): tables and coloured bars.

Only imported when rich is installed; `llmpar.report.print_report` decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from llmpar.plan import Plan
from llmpar.report.sections import all_sections
from llmpar.report.tables import BAR_WIDTH, Table

FULL_SHARE_WARNING = 0.9
"""A bar turns yellow above this share of capacity, red above all of it."""


def _bar(share: float | None) -> Text:
    if share is None:
        return Text("")
    filled = max(0, min(BAR_WIDTH, round(share * BAR_WIDTH)))
    colour = "red" if share > 1 else "yellow" if share > FULL_SHARE_WARNING else "green"
    text = Text("█" * filled, style=colour)
    text.append("·" * (BAR_WIDTH - filled), style="dim")
    return text


def rich_table(table: Table) -> RenderableType:
    """One section as a rich Table (or its notes, for a section without columns)."""
    if not table.rows:
        style = "bold red" if table.title == "Warnings" else ""
        lines = [Text(table.title, style="bold")]
        lines += [Text(f"  {note}", style=style) for note in table.notes]
        return Group(*lines)
    out = RichTable(title=table.title, title_justify="left", title_style="bold",
                    caption="\n".join(table.notes) or None, caption_justify="left")
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="left" if i in table.text_columns else "right")
    if table.bars:
        out.add_column("")
    for i, row in enumerate(table.rows):
        cells: list[RenderableType] = list(row)
        if table.bars:
            cells.append(_bar(table.bars[i]))
        out.add_row(*cells, style="bold" if i in table.marked else None)
    return out


def rich_report(plan: Plan, extra: Sequence[Table] = ()) -> RenderableType:
    """The whole plan as rich renderables."""
    parts: list[RenderableType] = []
    for table in all_sections(plan, extra):
        parts += [rich_table(table), Text("")]
    return Group(*parts[:-1])


def print_rich(plan: Plan, console: Console | None = None, extra: Sequence[Table] = ()) -> None:
    (console or Console()).print(rich_report(plan, extra))
