"""A report section as plain data, and its plain-text and Markdown renderings.

Sections (`llmpar.report.sections`) build `Table`s of already-formatted cells; the
renderers here, and the optional rich one, only lay them out.
"""

from __future__ import annotations

import attrs

BAR_WIDTH = 30


@attrs.frozen(kw_only=True)
class Table:
    """A titled table of formatted cells."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...] = ()
    bars: tuple[float | None, ...] = ()
    """Per row, a share of capacity to draw as a bar (None: no bar); empty: no bars."""
    marked: tuple[int, ...] = ()
    """Rows to highlight (the total, the peak stage)."""
    notes: tuple[str, ...] = ()
    """Lines printed under the table."""
    text_columns: tuple[int, ...] = (0,)
    """Indices of the columns that hold text (left-aligned); the others are numbers."""


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """'#' for the filled share, '.' for the rest, '>' past a full bar."""
    filled = max(0, min(width, round(fraction * width)))
    return "#" * filled + "." * (width - filled) + (">" if fraction > 1 else "")


def _cells(table: Table) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    header = table.columns
    rows = [tuple(row) for row in table.rows]
    if table.bars:
        header = header + ("",)
        rows = [row + ("" if share is None else bar(share),)
                for row, share in zip(rows, table.bars)]
    return header, rows


def render_text(table: Table) -> str:
    """Aligned columns under the title, marked rows flagged with '*'."""
    header, rows = _cells(table)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...], mark: str) -> str:
        is_bar = bool(table.bars)
        parts = [cell.ljust(w) if i in table.text_columns or (is_bar and i == len(cells) - 1)
                 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
        return f"{mark} " + "  ".join(parts).rstrip()

    lines = [table.title]
    if any(header):
        lines.append(line(header, " "))
    lines += [line(row, "*" if i in table.marked else " ") for i, row in enumerate(rows)]
    lines += [f"  {note}" for note in table.notes]
    return "\n".join(lines)


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def render_markdown(table: Table) -> str:
    """A `###` heading, a pipe table (marked rows in bold) and the notes."""
    columns = [c or " " for c in table.columns]
    align = [":---" if i in table.text_columns else "---:" for i in range(len(columns))]
    lines = [f"### {table.title}", ""]
    if table.rows:
        lines.append("| " + " | ".join(_escape(c) for c in columns) + " |")
        lines.append("| " + " | ".join(align) + " |")
        for i, row in enumerate(table.rows):
            cells = [_escape(c) for c in row]
            if i in table.marked:
                cells = [f"**{c}**" if c else c for c in cells]
            lines.append("| " + " | ".join(cells) + " |")
    if table.notes:
        lines += ([""] if table.rows else []) + [f"- {_escape(note)}" for note in table.notes]
    return "\n".join(lines)
