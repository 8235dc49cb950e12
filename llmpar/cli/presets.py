"""`llmpar presets [KIND]`: the presets shipped with llmpar and plugins, one table per
kind with a key number each; `llmpar presets show NAME`: a preset's TOML."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from llmpar.cli.output import add_format_argument, print_json, print_tables
from llmpar.errors import SpecError, did_you_mean
from llmpar.footprint.parameters import count_parameters
from llmpar.loading.converter import structure
from llmpar.loading.presets import (
    ALIASED_KINDS,
    PRESET_KINDS,
    alias_candidates,
    candidates_message,
)
from llmpar.report.fields import format_gb_gib
from llmpar.report.tables import Table
from llmpar.session import Session
from llmpar.spec import Model, Optimizer
from llmpar.spec.framework import Framework
from llmpar.spec.hardware import Gpu
from llmpar.units import format_count, parse_byte_rate

SOURCE_WIDTH = 60
"""Characters of a preset's `source` shown in the table."""

EXIT_UNKNOWN_PRESET = 2


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "presets", help="list the presets by kind, or show one",
        description="List presets shipped with llmpar and plugins (name, kind, a key number, "
                    "source), or print one preset's TOML: `llmpar presets show NAME`.")
    parser.add_argument("kind", nargs="?", choices=(*PRESET_KINDS, "show"),
                        help="a kind to list, or `show` to print a preset")
    parser.add_argument("name", nargs="?", help="with `show` (or a kind): the preset to print")
    add_format_argument(parser, "; a listing's tables, or the presets shown as tables")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.kind == "show" or args.name:
        if not args.name:
            print("llmpar: presets show needs a NAME", file=sys.stderr)
            return EXIT_UNKNOWN_PRESET
        kinds = PRESET_KINDS if args.kind == "show" else (args.kind,)
        return show(session, args.name, kinds, args.format)
    tables = [kind_table(session, kind) for kind in ([args.kind] if args.kind else PRESET_KINDS)]
    print_tables(tables, args.format)
    return 0


def show(session: Session, name: str, kinds: tuple[str, ...], fmt: str = "text") -> int:
    """Print every preset called `name` among `kinds`, each labelled with its kind."""
    hits = [(kind, path) for kind, path in session.presets.find(name) if kind in kinds]
    if not hits:
        known = {n for kind in kinds for n in session.presets.names(kind)}
        aliased = {n for kind in kinds if kind in ALIASED_KINDS
                   for n in session.presets.names(kind)}
        candidates = alias_candidates(name, aliased)
        hint = (f": {candidates_message(name, candidates, 'llmpar presets')}" if candidates
                else did_you_mean(name, known))
        print(f"llmpar: no preset named {name!r}{hint}", file=sys.stderr)
        return EXIT_UNKNOWN_PRESET
    if fmt == "json":
        print_json({"presets": [{"kind": kind[:-1], "name": path.stem, "path": str(path),
                                 "table": tomllib.loads(path.read_text(encoding="utf-8"))}
                                for kind, path in hits]})
        return 0
    blocks = [f"# {kind[:-1]} preset {path.stem!r}: {path}\n{path.read_text().rstrip()}"
              for kind, path in hits]
    text = "\n\n".join(blocks)
    print(f"```toml\n{text}\n```" if fmt == "markdown" else text)
    return 0


def kind_table(session: Session, kind: str) -> Table:
    names = session.presets.names(kind)
    rows = tuple(_row(session, kind, name) for name in names)
    return Table(title=f"{kind}: {len(names)} presets" if names else f"{kind}: (none)",
                 columns=("name", "kind", _KEY_LABELS.get(kind, "key number"), "source"),
                 rows=rows, text_columns=(0, 1, 3))


def _row(session: Session, kind: str, name: str) -> tuple[str, str, str, str]:
    path = session.presets.path(kind, name)
    try:
        table = session.presets.read(kind, name)
        key = _KEY_NUMBERS[kind](session, table, path) if kind in _KEY_NUMBERS else "-"
    except (OSError, ValueError, TypeError, SpecError):
        table, key = {}, "(does not load)"
    return name, kind[:-1], key, _source_start(table, path)


def _source_start(table: dict[str, Any], path: Path) -> str:
    """The start of `source`, or of an example's leading comment."""
    text = str(table.get("source", ""))
    if not text:
        comments = [line.lstrip("# ").strip() for line in path.read_text().splitlines()
                    if line.startswith("#")]
        text = " ".join(comments)
    return text if len(text) <= SOURCE_WIDTH else text[: SOURCE_WIDTH - 3] + "..."


def _structured(session: Session, table: dict[str, Any], cls: type) -> Any:
    value, problems = structure(session.converter, table, cls, "$")
    if value is None:
        raise SpecError(problems)
    return value


def _model_key(session: Session, table: dict[str, Any], _path: Path) -> str:
    count = count_parameters(_structured(session, table, Model))
    active = f" ({format_count(count.active)} active)" if count.active != count.total else ""
    return f"{format_count(count.total)}{active}"


def _gpu_key(session: Session, table: dict[str, Any], _path: Path) -> str:
    gpu = _structured(session, table, Gpu)
    peak = gpu.peak_flops_per_s("bf16")
    shown = f", {peak / 1e12:,.0f} TFLOP/s bf16" if peak else ""
    reported = ("" if gpu.usable_memory_bytes is None
                else f" ({format_gb_gib(gpu.usable_memory_bytes)} reported)")
    return f"{format_gb_gib(gpu.memory_bytes)}{reported}{shown}"


def _optimizer_key(session: Session, table: dict[str, Any], _path: Path) -> str:
    optimizer = _structured(session, table, Optimizer)
    gradients = f", {optimizer.gradients} gradients" if optimizer.gradients else ""
    return f"{optimizer.bytes_per_parameter('bf16'):.4g} B/param{gradients}"


def _rate(value: Any) -> str:
    if value is None:
        return "?"
    rate = parse_byte_rate(value) if isinstance(value, str) else float(value)
    return f"{rate / 1e9:,.0f} GB/s"


def _cluster_key(_session: Session, table: dict[str, Any], _path: Path) -> str:
    gpu = table.get("gpu", "?")
    name = gpu.get("preset", "custom GPU") if isinstance(gpu, dict) else gpu
    return (f"{table.get('gpus_per_node', '?')} x {name} per node; "
            f"{_rate(table.get('intra_node_bandwidth_bytes_per_s'))} in, "
            f"{_rate(table.get('inter_node_bandwidth_bytes_per_s'))} across")


def _framework_key(session: Session, table: dict[str, Any], _path: Path) -> str:
    framework = _structured(session, table, Framework)
    return f"{framework.attention_kernel} ({framework.default_activation_model} activations)"


def _example_key(session: Session, _table: dict[str, Any], path: Path) -> str:
    plan = session.evaluate(path)
    return f"{format_gb_gib(plan.total_bytes)} per GPU"


_KEY_NUMBERS = {"models": _model_key, "gpus": _gpu_key, "clusters": _cluster_key,
                "optimizers": _optimizer_key, "frameworks": _framework_key,
                "examples": _example_key}
_KEY_LABELS = {"models": "parameters", "gpus": "memory, peak",
               "clusters": "node; per-GPU bandwidth, one way",
               "optimizers": "state with bf16 weights",
               "frameworks": "attention kernel (activation model)", "examples": "total memory"}
