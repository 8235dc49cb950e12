"""Reports of a Plan: plain text, Markdown, JSON, and rich in a terminal.

Formulas live elsewhere; reports only select and format a Plan's numbers.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import TextIO

from llmpar.plan import Plan
from llmpar.report.json_format import json_report
from llmpar.report.markdown import markdown_report
from llmpar.report.sections import report_warnings
from llmpar.report.tables import Table
from llmpar.report.text import text_report

FORMATS = ("text", "markdown", "json", "rich")

__all__ = ["FORMATS", "json_report", "markdown_report", "print_report", "render",
           "report_warnings", "rich_available", "text_report"]


def render(plan: Plan, fmt: str = "text", extra: Sequence[Table] = ()) -> str:
    """The plan as `fmt`: "text", "markdown" or "json" (plugins' `extra` sections in the
    text and Markdown reports); "rich" renders as text here (`print_report` draws it)."""
    if fmt == "json":
        return json_report(plan)
    return (text_report if fmt == "text" else markdown_report)(plan, extra)


def rich_available() -> bool:
    """Whether the optional rich extra is installed."""
    return importlib.util.find_spec("rich") is not None


def print_report(plan: Plan, fmt: str = "text", stream: TextIO | None = None,
                 extra: Sequence[Table] = ()) -> None:
    """Print the plan; text goes through rich when it is installed and `stream` is a
    terminal, plain otherwise; "rich" always (a SpecError without rich). NO_COLOR (any
    non-empty value) turns colour off."""
    stream = stream or sys.stdout
    if fmt == "rich" or (fmt == "text" and rich_available() and stream.isatty()):
        from llmpar.cli.output import rich_console

        console = rich_console(stream)  # a SpecError without rich, before importing it
        from llmpar.report.terminal import print_rich

        print_rich(plan, console, extra)
        return
    print(render(plan, fmt, extra), file=stream)
