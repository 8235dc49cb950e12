"""`llmpar explain SPEC [FIELD]`: how the numbers of a plan were derived."""

from __future__ import annotations

import argparse
import sys

from llmpar.cli.common import add_spec_arguments, given_spec, overrides
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "explain", help="how each number of a plan was derived",
        description="Print the rule, inputs and source of plan numbers (all, or one field).")
    add_spec_arguments(parser)
    parser.add_argument("field", nargs="?", help="a plan field, e.g. activations_bytes")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.spec_text is not None and args.field is None:
        args.spec, args.field = None, args.spec  # `explain --spec-text TOML FIELD`
    plan = session.evaluate(given_spec(session, args), overrides(args.set))
    try:
        print(plan.explain(args.field))
    except KeyError:
        known = ", ".join(d.quantity for d in plan.derivations)
        print(f"llmpar: no derivation recorded for {args.field!r}; known: {known}",
              file=sys.stderr)
        return 2
    return 0
