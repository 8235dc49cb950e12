"""`llmpar schema`: the JSON Schema of a spec file."""

from __future__ import annotations

import argparse

from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "schema", help="the JSON Schema of a spec file",
        description="Print the JSON Schema (draft 2020-12) of a spec file as TOML writes it: "
                    "every table and key, its type, allowed values, default, unit (x-unit) "
                    "and meaning, with the [parallel.<name>] table of every installed "
                    "strategy plugin. It checks each table on its own; what llmpar checks "
                    "across tables (degrees that divide, a layout that fills the GPUs) is "
                    "left to llmpar evaluate. docs/reference/spec.schema.json is the schema "
                    "of llmpar's own strategies (--builtin).")
    parser.add_argument("--builtin", action="store_true",
                        help="only llmpar's own strategies, without installed plugins")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    from llmpar.loading.json_schema import schema_text

    if args.builtin:
        session = Session(load_entry_points=False)
    print(schema_text(session.strategies), end="")
    return 0
