"""`llmpar evaluate SPEC`: the plan of one spec."""

from __future__ import annotations

import argparse
import json

from llmpar.cli.common import add_spec_arguments, overrides
from llmpar.report import text_report
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate", help="memory, compute and time of one spec",
        description="Evaluate a spec and print its plan: memory per GPU (GB = 10^9 bytes, "
                    "GiB = 2^30 bytes), FLOPs, step and run time.")
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    plan = session.evaluate(args.spec, overrides(args.set))
    print(json.dumps(plan.to_dict(), indent=2) if args.json else text_report(plan))
    return 0
