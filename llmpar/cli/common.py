"""Arguments several subcommands share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.loading.presets import PresetNotFound, is_preset_name
from llmpar.loading.reader import (
    SpecSource,
    apply_overrides,
    existing_file,
    parse_override,
    parse_toml,
    read_source,
)
from llmpar.session import Session
from llmpar.spec.workload import RECOMPUTE


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC (or --spec-text) and repeatable --set KEY=VALUE."""
    parser.add_argument("spec", nargs="?",
                        help="a spec file (TOML), e.g. specs/examples/*.toml, the name of a "
                             "shipped example (llmpar presets examples), or - for stdin")
    add_spec_text_argument(parser)
    add_set_argument(parser)


def add_spec_text_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec-text", metavar="TOML",
                        help="the spec as TOML text instead of SPEC, e.g. --spec-text "
                             "\"$(cat my.toml)\"")


def given_spec(session: Session, args: argparse.Namespace) -> SpecSource:
    """The spec of a command with `add_spec_arguments`: SPEC or --spec-text, one of them."""
    text = getattr(args, "spec_text", None)
    if text is not None:
        if args.spec is not None:
            raise SpecError([Problem("$", "give SPEC or --spec-text, not both")])
        return parse_toml(text, "--spec-text")
    if args.spec is None:
        raise SpecError([Problem("$", "give a SPEC (a file, a shipped example's name, or - "
                                      "for stdin) or --spec-text; see --help")])
    return spec_source(session, args.spec)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec key, e.g. --set hardware.num_gpus=8 "
                             "(repeatable; values are TOML)")


def overrides(pairs: Sequence[str]) -> dict[str, object]:
    """--set pairs as a {dotted key: value} mapping."""
    return dict(parse_override(pair) for pair in pairs)


def gpu_counts(text: str) -> int | list[int]:
    """--gpus: one count, or a comma-separated list of counts (`64,128,256`)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a GPU count or a comma-separated list "
                                         f"of counts (64,128), got {text!r}") from None
    if not counts:
        raise argparse.ArgumentTypeError(f"expected a GPU count, got {text!r}")
    return counts[0] if len(counts) == 1 and "," not in text else counts


@attrs.frozen
class Flag:
    """A command-line shorthand for one spec key."""

    name: str
    key: str
    help: str
    kind: Callable[[str], Any] = int
    choices: tuple[str, ...] | None = None


QUESTION_FLAGS = (
    Flag("--model", "model", "a model preset (llmpar presets models)", str),
    Flag("--cluster", "hardware.cluster", "a cluster preset, e.g. dgx-h100", str),
    Flag("--gpu", "hardware.gpu", "a GPU preset, e.g. h100-sxm (without --cluster)", str),
    Flag("--gpus", "hardware.num_gpus", "how many GPUs; for llmpar search a comma-separated "
         "list searches each count ([search] num_gpus), e.g. 64,128,256", gpu_counts),
    Flag("--seq", "training.sequence_length", "tokens per sequence"),
    Flag("--global-batch", "training.global_batch_size", "sequences per optimizer step"),
    Flag("--micro-batch", "training.micro_batch_size", "sequences per micro-batch"),
    Flag("--recompute", "training.recompute", "activation recomputation", str, RECOMPUTE),
    Flag("--tokens", "training.tokens", "tokens of the whole run, e.g. 1.4e12", float),
    Flag("--tp", "parallel.tensor.degree", "tensor-parallel degree"),
    Flag("--pp", "parallel.pipeline.degree", "pipeline-parallel degree"),
    Flag("--cp", "parallel.context.degree", "context-parallel degree"),
    Flag("--ep", "parallel.expert.degree", "expert-parallel degree"),
    Flag("--dp", "parallel.data.degree", "data-parallel degree (default: what is left)"),
    Flag("--zero", "parallel.data.zero", "ZeRO stage, 0 to 3"),
)
"""Flags that build a spec without a file: `llmpar evaluate --model llama-3-70b --cluster
dgx-h100 --gpus 64 --seq 8192 --tp 8`. Each sets one key; given beside a SPEC they
override it, and --set overrides them."""


def add_question_arguments(parser: argparse.ArgumentParser) -> None:
    """An optional SPEC (a file, a shipped example's name, or - for stdin), the flags
    that build or change one, --set, and --print-spec."""
    parser.add_argument("spec", nargs="?", help=(
        "a spec file (TOML), the name of a shipped example (llmpar presets examples), or - "
        "to read one from stdin; omit it to build the spec from the flags below"))
    add_spec_text_argument(parser)
    group = parser.add_argument_group("a spec from flags")
    for flag in QUESTION_FLAGS:
        group.add_argument(flag.name, dest=_dest(flag), type=flag.kind, choices=flag.choices,
                           metavar=None if flag.choices else flag.name[2:].upper(),
                           help=f"{flag.help} ({flag.key})")
    group.add_argument("--sp", action="store_true",
                       help="sequence parallelism on the tensor ranks ([parallel.sequence])")
    group.add_argument("--fsdp", action="store_true",
                       help="shard every state over the data ranks (parallel.data.fsdp)")
    add_set_argument(parser)
    parser.add_argument("--print-spec", action="store_true",
                        help="print the spec (TOML) that SPEC, the flags and --set make, "
                             "and stop: a file to start from")


def _dest(flag: Flag) -> str:
    return "flag_" + flag.name[2:].replace("-", "_")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The keys the question flags set, in dotted form."""
    found: dict[str, Any] = {flag.key: getattr(args, _dest(flag)) for flag in QUESTION_FLAGS
                             if getattr(args, _dest(flag), None) is not None}
    counts = found.pop("hardware.num_gpus", None)
    if isinstance(counts, list):
        found["search.num_gpus"] = counts  # a search over GPU counts (llmpar search)
    elif counts is not None:
        found["hardware.num_gpus"] = counts
    if getattr(args, "sp", False):
        found["parallel.sequence"] = {}
    if getattr(args, "fsdp", False):
        found["parallel.data.fsdp"] = True
    return found


def question(session: Session, args: argparse.Namespace) -> tuple[SpecSource, dict[str, Any]]:
    """The spec source and the overrides of a command with `add_question_arguments`: the
    SPEC (or an empty table), then the flags, then --set."""
    flags = flag_overrides(args)
    if args.spec is not None or getattr(args, "spec_text", None) is not None:
        source: SpecSource = given_spec(session, args)
    else:
        if "model" not in flags or not {"hardware.cluster", "hardware.gpu"} & set(flags):
            raise SpecError([Problem("$", "give a SPEC (a file or a shipped example's name), "
                                          "or build one with at least --model and --cluster "
                                          "(or --gpu); see --help")])
        source = {}
    return source, {**flags, **overrides(args.set)}


def spec_source(session: Session, text: str) -> SpecSource:
    """A SPEC argument: `-` is TOML on stdin; an existing file is that file; otherwise the
    name of a shipped example; otherwise the text as the loader takes it (a file name it
    reports as missing, or, kept for callers that relied on it, TOML text: --spec-text is
    the form to use)."""
    if text == "-":
        return parse_toml(sys.stdin.read(), "<stdin>")
    if existing_file(text) is not None or not is_preset_name(text):
        return text
    try:
        return session.presets.path("examples", text)
    except PresetNotFound:
        return text


def print_spec(session: Session, source: SpecSource, changes: dict[str, Any]) -> None:
    """The spec the arguments make, as TOML with its presets by name: the SPEC's own table
    (or an empty one) with the flags and --set applied, once it loads."""
    from llmpar.loading.dump import toml_text

    session.load_spec(source, changes)  # a spec that does not load is reported, not printed
    table, _label = read_source(source)
    print(toml_text(apply_overrides(table, changes)), end="")
