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

FORMATS = ("text", "markdown", "json")

__all__ = ["FORMATS", "json_report", "markdown_report", "print_report", "render",
           "report_warnings", "rich_available", "text_report"]


def render(plan: Plan, fmt: str = "text", extra: Sequence[Table] = ()) -> str:
    """The plan as `fmt`: "text", "markdown" or "json" (plugins' `extra` sections in the
    text and Markdown reports)."""
    if fmt == "json":
        return json_report(plan)
    return (text_report if fmt == "text" else markdown_report)(plan, extra)


def rich_available() -> bool:
    """Whether the optional rich extra is installed."""
    return importlib.util.find_spec("rich") is not None


def print_report(plan: Plan, fmt: str = "text", stream: TextIO | None = None,
                 extra: Sequence[Table] = ()) -> None:
    """Print the plan; text goes through rich when it is installed and `stream` is a
    terminal, plain otherwise."""
    stream = stream or sys.stdout
    if fmt == "text" and rich_available() and stream.isatty():
        from rich.console import Console

        from llmpar.report.terminal import print_rich

        print_rich(plan, Console(file=stream), extra)
        return
    print(render(plan, fmt, extra), file=stream)
