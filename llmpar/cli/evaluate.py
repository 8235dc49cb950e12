"""`llmpar evaluate SPEC`: the plan of one spec, as text, Markdown or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmpar.cli.common import add_question_arguments, print_spec, question
from llmpar.cli.output import add_format_argument, print_json
from llmpar.errors import Problem, SpecError
from llmpar.report import print_report
from llmpar.session import Session

EXIT_DOES_NOT_FIT = 1
"""`llmpar evaluate --check` of a plan that does not fit (as `llmpar search` finding none)."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "evaluate", help="memory, compute and time of one spec",
        description="Evaluate a spec and print its plan: memory per GPU (GB = 10^9 bytes, "
                    "GiB = 2^30 bytes), FLOPs, step and run time. The spec is a file, a "
                    "shipped example's name, or built from flags: llmpar evaluate --model "
                    "llama-3-70b --cluster dgx-h100 --gpus 64 --seq 8192 --tp 8 --pp 2")
    add_question_arguments(parser)
    add_format_argument(parser, "; fields: docs/json-schema.md")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when the plan does not fit (0 when it does)")
    parser.add_argument("--emit", metavar="FILE",
                        help="also write the spec evaluated (SPEC with the flags and --set "
                             "applied) to FILE: presets by name, with only the keys that "
                             "differ from them, so a later --set of a preset brings its "
                             "numbers")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if isinstance(getattr(args, "flag_gpus", None), list):
        raise SpecError([Problem("$.hardware.num_gpus", "llmpar evaluate takes one GPU count; "
                                 "a list (--gpus 64,128) is for llmpar search, which "
                                 "searches each count")])
    source, changes = question(session, args)
    if args.print_spec:
        print_spec(session, source, changes)
        return 0
    spec = session.load_spec(source, changes)
    plan = session.evaluate(spec)
    if args.emit:
        Path(args.emit).write_text(session.emit_spec(spec), encoding="utf-8")
    if args.format == "json":
        print_json(plan.to_dict())  # the plan's schema_version, and llmpar's version
    else:
        print_report(plan, args.format, extra=session.report_sections(plan))
    return EXIT_DOES_NOT_FIT if args.check and not plan.fits else 0
