"""Entry point of the `llmpar` command. Spec errors exit with status 2, plugin errors
with 3, both without a traceback (`llmpar.cli.output.EXIT_STATUS`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from llmpar.cli.output import EXIT_STATUS
from llmpar.errors import PluginError, SpecError
from llmpar.report.json_format import llmpar_version
from llmpar.session import Session

EXIT_SPEC_ERROR = 2
EXIT_PLUGIN_ERROR = 3
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a command whose reader went away."""

COMMAND_MODULES = ("evaluate", "explain", "presets", "plugins", "import_hf", "diff", "plot",
                   "search", "calibrate", "launch", "import_config", "ui", "schema",
                   "completion")
"""Subcommands, each a module of this package with `add_parser(commands)`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmpar",
        description="Plan parallelism for large language models: memory per GPU, FLOPs, "
                    "step and run time, from a TOML spec.")
    parser.add_argument("--version", action="version", version=f"llmpar {llmpar_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"llmpar.cli.{name}").add_parser(commands)
    for command in commands.choices.values():
        command.epilog = EXIT_STATUS
        command.add_argument("--no-plugin", action="append", default=[], metavar="NAME",
                             dest="no_plugin",
                             help="do not load plugin NAME (repeatable; as "
                                  "LLMPAR_BLOCK_PLUGINS=NAME,...)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(Session(blocked=args.no_plugin), args)
        return status
    except SpecError as error:
        print(error, file=sys.stderr)
        return EXIT_SPEC_ERROR
    except PluginError as error:
        print(f"llmpar: plugin error: {error}", file=sys.stderr)
        return EXIT_PLUGIN_ERROR
    except BrokenPipeError:
        # The reader (`| head`) has gone: nothing more can be said to it. Point stdout at
        # nothing so that the interpreter's own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
