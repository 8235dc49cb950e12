"""`llmpar explain SPEC [FIELD]`: how the numbers of a plan were derived."""

from __future__ import annotations

import argparse
import sys

import attrs

from llmpar.cli.common import add_spec_arguments, given_spec, overrides
from llmpar.cli.output import add_format_argument, print_text
from llmpar.errors import did_you_mean
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "explain", help="how each number of a plan was derived",
        description="Print the rule, inputs and source of plan numbers (all, or one field).")
    add_spec_arguments(parser)
    parser.add_argument("field", nargs="?",
                        help="a field of the plan's JSON by its path, e.g. activations_bytes, "
                             "training.mfu, stages[0].total_bytes, collectives[2].seconds, "
                             "serving[0].tpot_seconds")
    add_format_argument(parser, "; each Derivation's quantity, value, unit, rule, source "
                                "and inputs")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.spec_text is not None and args.field is None:
        args.spec, args.field = None, args.spec  # `explain --spec-text TOML FIELD`
    plan = session.evaluate(given_spec(session, args), overrides(args.set))
    try:
        text = plan.explain(args.field)
        items = [plan.explanation(args.field)] if args.field else list(plan.derivations)
    except KeyError:
        from llmpar.plan_explain import format_path, leaf_paths

        fields = [format_path(p) for p in leaf_paths(plan.to_dict())]
        print(f"llmpar: the plan has no field {args.field!r}"
              f"{did_you_mean(args.field, fields)}; a field is a path in the plan's JSON, "
              "e.g. training.mfu, stages[0].total_bytes, collectives[0].seconds",
              file=sys.stderr)
        return 2
    print_text(text, args.format, {"derivations": [attrs.asdict(d) for d in items]})
    return 0
