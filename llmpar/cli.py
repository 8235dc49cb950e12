"""The `llmpar` command. Errors in specs exit with status 2 and no traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from llmpar.errors import PluginError, SpecError
from llmpar.loading.presets import PRESET_KINDS
from llmpar.loading.reader import parse_override
from llmpar.report import text_report
from llmpar.session import Session

EXIT_SPEC_ERROR = 2
EXIT_PLUGIN_ERROR = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmpar",
        description="Plan parallelism for large language models: memory per GPU, FLOPs, "
                    "step and run time, from a TOML spec.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    evaluate = commands.add_parser(
        "evaluate", help="memory, compute and time of one spec",
        description="Evaluate a spec and print its plan: memory per GPU (GB = 10^9 bytes, "
                    "GiB = 2^30 bytes), FLOPs, step and run time.")
    evaluate.add_argument("spec", help="a spec file (TOML), e.g. specs/examples/*.toml")
    evaluate.add_argument("--json", action="store_true", help="print the plan as JSON")
    evaluate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="override a spec key, e.g. --set hardware.num_gpus=8 "
                               "(repeatable; values are TOML)")

    explain = commands.add_parser("explain", help="how each number of a plan was derived",
                                  description="Print the rule, inputs and source of plan "
                                              "numbers (all, or one field).")
    explain.add_argument("spec")
    explain.add_argument("field", nargs="?", help="a plan field, e.g. activations_bytes")
    explain.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")

    presets = commands.add_parser("presets", help="list the presets by kind",
                                  description="List presets shipped with llmpar and plugins.")
    presets.add_argument("kind", nargs="?", choices=PRESET_KINDS)

    commands.add_parser("plugins", help="list loaded plugins with versions",
                        description="List plugins, their distributions and strategies.")
    return parser


def _overrides(pairs: Sequence[str]) -> dict[str, object]:
    return dict(parse_override(pair) for pair in pairs)


def _evaluate(session: Session, args: argparse.Namespace) -> int:
    plan = session.evaluate(args.spec, _overrides(args.set))
    print(json.dumps(plan.to_dict(), indent=2) if args.json else text_report(plan))
    return 0


def _explain(session: Session, args: argparse.Namespace) -> int:
    plan = session.evaluate(args.spec, _overrides(args.set))
    try:
        print(plan.explain(args.field))
    except KeyError:
        known = ", ".join(d.quantity for d in plan.derivations)
        print(f"llmpar: no derivation recorded for {args.field!r}; known: {known}",
              file=sys.stderr)
        return EXIT_SPEC_ERROR
    return 0


def _presets(session: Session, args: argparse.Namespace) -> int:
    for kind in [args.kind] if args.kind else PRESET_KINDS:
        names = session.presets.names(kind)
        print(f"{kind}: {', '.join(names) if names else '(none)'}")
    return 0


def _plugins(session: Session, args: argparse.Namespace) -> int:
    print(f"{'plugin':<16}{'distribution':<24}{'version':<12}strategies")
    for info in session.plugins():
        strategies = ", ".join(info.strategies) or "-"
        print(f"{info.name:<16}{info.distribution:<24}{info.version:<12}{strategies}")
    return 0


COMMANDS = {"evaluate": _evaluate, "explain": _explain, "presets": _presets,
            "plugins": _plugins}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        session = Session()
        return COMMANDS[args.command](session, args)
    except SpecError as error:
        print(error, file=sys.stderr)
        return EXIT_SPEC_ERROR
    except PluginError as error:
        print(f"llmpar: plugin error: {error}", file=sys.stderr)
        return EXIT_PLUGIN_ERROR


if __name__ == "__main__":
    sys.exit(main())
