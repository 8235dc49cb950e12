"""One output convention for every command that prints a result.

`--format text|markdown|json|rich` (`--json` as an alias of `--format json`): text is
plain (rich in a terminal where a command has a rich rendering and rich is installed);
rich asks for it and needs the rich extra; every JSON output is an object that carries
`schema_version` (the version of its field names) and `llmpar_version`. `NO_COLOR` (any
non-empty value, no-color.org) turns colour off in rich output.

Exit status, the same for every command: 0 an answer; 1 nothing fits (`search` found no
layout, `evaluate --check` of a plan that does not fit); 2 a bad spec or bad usage; 3 a
plugin failed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import IO, Any

from llmpar.errors import Problem, SpecError
from llmpar.report.json_format import llmpar_version, strict_json
from llmpar.report.tables import Table, render_markdown, render_text

FORMATS = ("text", "markdown", "json", "rich")

OUTPUT_SCHEMA_VERSION = 1
"""Version of the field names of the JSON outputs that are not a plan (search results,
listings); a plan's JSON carries the plan's own `schema_version`."""

EXIT_STATUS = ("exit status: 0 an answer; 1 nothing fits (search found no layout, "
               "evaluate --check of a plan that does not fit); 2 a bad spec or bad usage; "
               "3 a plugin failed")
"""The exit codes, documented the same under every command."""


def add_format_argument(parser: argparse.ArgumentParser, json_help: str = "") -> None:
    """--format text|markdown|json|rich, with --json as an alias of --format json."""
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (rich in a terminal when installed), markdown, json "
                             f"(with schema_version and llmpar_version{json_help}), or rich "
                             "(needs the rich extra); NO_COLOR turns colour off")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help="same as --format json")


def with_versions(data: Mapping[str, Any], schema_version: int = OUTPUT_SCHEMA_VERSION
                  ) -> dict[str, Any]:
    """`data` with `schema_version` (its own, if it has one) and `llmpar_version` first."""
    return {"schema_version": data.get("schema_version", schema_version),
            "llmpar_version": llmpar_version(),
            **{k: v for k, v in data.items() if k != "schema_version"}}


def print_json(data: Mapping[str, Any]) -> None:
    print(strict_json(with_versions(data)))


def no_color() -> bool:
    """Whether NO_COLOR asks for output without colour (any non-empty value)."""
    return bool(os.environ.get("NO_COLOR"))


def rich_console(stream: IO[str] | None = None) -> Any:
    """A rich Console on `stream` that honours NO_COLOR; a usage error without rich."""
    from llmpar.report import rich_available

    if not rich_available():
        raise SpecError([Problem("$", "--format rich needs the rich extra: "
                                      "pip install 'llmpar[rich]'")])
    from rich.console import Console

    return Console(file=stream, no_color=no_color())


def table_data(table: Table) -> dict[str, Any]:
    """A table as JSON: its title, rows as objects keyed by column, and notes."""
    columns = [c or f"column {i}" for i, c in enumerate(table.columns)]
    return {"title": table.title,
            "rows": [dict(zip(columns, row, strict=False)) for row in table.rows],
            "notes": list(table.notes)}


def print_tables(tables: Sequence[Table], fmt: str,
                 data: Mapping[str, Any] | None = None) -> None:
    """Tables as text, Markdown or rich; as JSON, `data` (or the tables' cells)."""
    if fmt == "json":
        print_json(data if data is not None else {"tables": [table_data(t) for t in tables]})
    elif fmt == "rich":
        console = rich_console()  # a SpecError without rich, before importing it
        from llmpar.report.terminal import rich_table

        for table in tables:
            console.print(rich_table(table))
    elif fmt == "markdown":
        print("\n\n".join(render_markdown(t) for t in tables))
    else:
        print("\n\n".join(render_text(t) for t in tables))


def print_text(text: str, fmt: str, data: Mapping[str, Any]) -> None:
    """A command's text report (markdown: fenced as is; rich: printed through rich), or
    `data` as JSON."""
    if fmt == "json":
        print_json(data)
    elif fmt == "markdown":
        print(f"```text\n{text}\n```")
    elif fmt == "rich":
        rich_console().print(text, markup=False, highlight=False)
    else:
        print(text)
