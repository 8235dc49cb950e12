"""`llmpar import-hf CONFIG.json`: a model table (TOML) from a Hugging Face config.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmpar.footprint.parameters import count_parameters
from llmpar.hf import SUPPORTED_MODEL_TYPES, model_from_hf, model_table_from_hf, model_toml
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "import-hf", help="a model table from a Hugging Face config.json",
        description="Read a local Hugging Face config.json (nothing is downloaded) and print "
                    "the model as TOML, for a spec's [model] table or specs/models/. "
                    f"model_type: {', '.join(SUPPORTED_MODEL_TYPES)}.")
    parser.add_argument("config", help="a config.json")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the TOML to FILE instead of printing it")
    parser.set_defaults(run=run)


def run(_session: Session, args: argparse.Namespace) -> int:
    model = model_from_hf(args.config)  # checks that the table structures
    text = model_toml(model_table_from_hf(args.config))
    if args.output is None:
        print(text, end="")
        return 0
    Path(args.output).write_text(text, encoding="utf-8")
    total = count_parameters(model).total
    print(f"wrote {args.output}: {model.name}, {total:,.0f} parameters", file=sys.stderr)
    return 0
