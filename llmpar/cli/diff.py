"""`llmpar diff A B`: two plans side by side, every field that differs, with B/A."""

from __future__ import annotations

import argparse

from llmpar.cli.common import overrides, spec_source
from llmpar.cli.output import add_format_argument, print_tables
from llmpar.report.diff import diff_table, plan_differences
from llmpar.report.json_format import strict_json
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "diff", help="compare the plans of two specs",
        description="Evaluate two specs and print every plan field that differs, in human "
                    "units (GB = 10^9 bytes, GiB = 2^30 bytes), with the ratio B/A.")
    parser.add_argument("spec_a", metavar="A", help="the first spec (TOML)")
    parser.add_argument("spec_b", metavar="B", help="the second spec (TOML); may be A again "
                                                    "with --set-b")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of both specs (repeatable; values are TOML)")
    parser.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of A only")
    parser.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of B only")
    add_format_argument(parser, "; a list of {field, a, b, ratio}")
    parser.set_defaults(run=run)


def _label(spec: str, pairs: list[str]) -> str:
    return f"{spec} with {', '.join(pairs)}" if pairs else spec


def run(session: Session, args: argparse.Namespace) -> int:
    pairs_a, pairs_b = args.set + args.set_a, args.set + args.set_b
    plan_a = session.evaluate(spec_source(session, args.spec_a), overrides(pairs_a))
    plan_b = session.evaluate(spec_source(session, args.spec_b), overrides(pairs_b))
    if args.format == "json":
        rows = [{"field": d.field, "a": d.a, "b": d.b, "ratio": d.ratio}
                for d in plan_differences(plan_a, plan_b)]
        print(strict_json(rows))
        return 0
    table = diff_table(plan_a, plan_b, _label(args.spec_a, pairs_a), _label(args.spec_b, pairs_b))
    print_tables([table], args.format)
    return 0
