"""`llmpar schema`: the JSON Schema of a spec file, of a plan's JSON or of a search's."""

from __future__ import annotations

import argparse

from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "schema", help="the JSON Schema of a spec file (or of a plan's or a search's JSON)",
        description="Print the JSON Schema (draft 2020-12) of a spec file as TOML writes it: "
                    "every table and key, its type, allowed values, default, unit (x-unit) "
                    "and meaning, with the [parallel.<name>] table of every installed "
                    "strategy plugin. It checks each table on its own; what llmpar checks "
                    "across tables (degrees that divide, a layout that fills the GPUs) is "
                    "left to llmpar evaluate. docs/reference/spec.schema.json is the schema "
                    "of llmpar's own strategies (--builtin). --plan and --search print the "
                    "schema of llmpar evaluate's and llmpar search's --format json instead "
                    "(docs/reference/plan.schema.json and search.schema.json, also in the "
                    "package: llmpar/schemas/).")
    parser.add_argument("--builtin", action="store_true",
                        help="only llmpar's own strategies, without installed plugins")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--plan", action="store_true",
                       help="the schema of a plan's JSON (llmpar evaluate --format json, "
                            "Plan.to_dict())")
    which.add_argument("--search", action="store_true",
                       help="the schema of a search result's JSON (llmpar search --format "
                            "json, to_dict() of its result)")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.plan or args.search:
        from llmpar.output_schema import schema_text as output_schema_text

        print(output_schema_text("plan" if args.plan else "search"), end="")
        return 0
    from llmpar.loading.json_schema import schema_text

    if args.builtin:
        session = Session(load_entry_points=False)
    print(schema_text(session.strategies, session.workloads), end="")
    return 0
