"""`llmpar presets [KIND]`: the presets shipped with llmpar and plugins."""

from __future__ import annotations

import argparse

from llmpar.loading.presets import PRESET_KINDS
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("presets", help="list the presets by kind",
                                 description="List presets shipped with llmpar and plugins.")
    parser.add_argument("kind", nargs="?", choices=PRESET_KINDS)
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    for kind in [args.kind] if args.kind else PRESET_KINDS:
        names = session.presets.names(kind)
        print(f"{kind}: {', '.join(names) if names else '(none)'}")
    return 0
