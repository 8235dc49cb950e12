"""`llmpar plugins`: loaded plugins, their distributions, versions and strategies."""

from __future__ import annotations

import argparse

from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plugins", help="list loaded plugins with versions",
                                 description="List plugins, their distributions and strategies.")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    print(f"{'plugin':<16}{'distribution':<24}{'version':<12}strategies")
    for info in session.plugins():
        strategies = ", ".join(info.strategies) or "-"
        print(f"{info.name:<16}{info.distribution:<24}{info.version:<12}{strategies}")
    return 0
