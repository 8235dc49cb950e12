"""`llmpar evaluate SPEC`: the plan of one spec, as text, Markdown or JSON."""

from __future__ import annotations

import argparse

from llmpar.cli.common import add_question_arguments, print_spec, question
from llmpar.report import FORMATS, print_report
from llmpar.session import Session

EXIT_DOES_NOT_FIT = 1
"""`llmpar evaluate --check` of a plan that does not fit (as `llmpar search` finding none)."""


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    """--format text|markdown|json, with --json as an alias of --format json."""
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (rich in a terminal when installed), markdown, or json "
                             "(fields: docs/json-schema.md)")
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help="same as --format json")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "evaluate", help="memory, compute and time of one spec",
        description="Evaluate a spec and print its plan: memory per GPU (GB = 10^9 bytes, "
                    "GiB = 2^30 bytes), FLOPs, step and run time. The spec is a file, a "
                    "shipped example's name, or built from flags: llmpar evaluate --model "
                    "llama-3-70b --cluster dgx-h100 --gpus 64 --seq 8192 --tp 8 --pp 2")
    add_question_arguments(parser)
    add_format_argument(parser)
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when the plan does not fit (0 when it does)")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    source, changes = question(session, args)
    if args.print_spec:
        print_spec(session, source, changes)
        return 0
    plan = session.evaluate(source, changes)
    print_report(plan, args.format, extra=session.report_sections(plan))
    return EXIT_DOES_NOT_FIT if args.check and not plan.fits else 0
