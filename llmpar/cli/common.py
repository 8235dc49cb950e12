"""Arguments several subcommands share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from llmpar.loading.reader import parse_override


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC and repeatable --set KEY=VALUE."""
    parser.add_argument("spec", help="a spec file (TOML), e.g. specs/examples/*.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec key, e.g. --set hardware.num_gpus=8 "
                             "(repeatable; values are TOML)")


def overrides(pairs: Sequence[str]) -> dict[str, object]:
    """--set pairs as a {dotted key: value} mapping."""
    return dict(parse_override(pair) for pair in pairs)
