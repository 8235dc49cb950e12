"""`llmpar import FILE --from NAME [--base SPEC] [-o OUT]`: a framework configuration
back into a v1 spec."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llmpar.cli.common import spec_source
from llmpar.errors import Problem, SpecError
from llmpar.launch.importing import imported_spec, read_file, spec_table
from llmpar.loading.dump import dump_spec, toml_text
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "import", help="a spec from a framework configuration (Megatron-LM arguments, a "
                       "torchtitan TOML, a DeepSpeed JSON, a vLLM or SGLang command line)",
        description="Read a framework configuration (a Megatron-LM argument list: a file of "
                    "arguments or a launcher line; a torchtitan job TOML; a DeepSpeed config "
                    "JSON; a vllm serve or sglang.launch_server command line) into a v1 "
                    "spec. A configuration carries "
                    "no cluster or run length: they come from --base SPEC (whose other "
                    "settings are kept where the configuration does not state them), or "
                    "from --cluster and --num-gpus. --from hf is `llmpar import-hf`.")
    parser.add_argument("file", help="the configuration file (- for stdin)")
    parser.add_argument("--from", dest="source_format", required=True, metavar="NAME",
                        help="its framework: a launch target that reads (megatron, torchtitan, "
                             "deepspeed, trainer, accelerate, vllm, sglang), or hf "
                             "for a Hugging Face config.json")
    parser.add_argument("--base", metavar="SPEC",
                        help="a spec whose hardware, run length and other settings fill "
                             "what the configuration leaves open")
    parser.add_argument("--cluster", help="a cluster preset (without --base)")
    parser.add_argument("--num-gpus", type=int, metavar="N", help="GPUs of the job "
                        "(without --base: default, the product of the parallel degrees)")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="write the spec (TOML) to OUT instead of printing it")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    if args.source_format == "hf":
        from llmpar.cli import import_hf

        return import_hf.run(session, argparse.Namespace(config=args.file,
                                                         output=args.output))
    target = session.launch_targets.find(args.source_format, "$.--from")
    text = sys.stdin.read() if args.file == "-" else _read(args.file)
    label = "<stdin>" if args.file == "-" else args.file
    base = None if args.base is None else session.load_spec(spec_source(session, args.base))
    bare: dict[str, Any] = {}
    if base is None and args.cluster is None:
        raise SpecError([Problem("$.--cluster", "a configuration has no hardware: give "
                                                "--base SPEC or --cluster (and --num-gpus)")],
                        label)
    if args.cluster is not None:
        bare["hardware.cluster"] = args.cluster
    if args.num_gpus is not None:
        bare["hardware.num_gpus"] = args.num_gpus
    read = read_file(target, args.source_format, text, label, base)
    table = spec_table(read, base, bare)
    if base is None and args.num_gpus is None:
        table.setdefault("hardware", {})["num_gpus"] = _layout_gpus(table)
    # what does not load is reported, not written
    table, spec = imported_spec(read, table, session.load_spec, session.evaluate)
    out = dump_spec(spec, session.axes) if base is not None else toml_text(table)
    for note in read.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output is None:
        print(out, end="")
    else:
        Path(args.output).write_text(out, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([Problem("$", f"cannot read {path}: {exc.strerror}")], path) from None


def _layout_gpus(table: dict[str, Any]) -> int:
    """The GPUs the configuration's own degrees multiply to (one data replica)."""
    parallel = table.get("parallel", {})
    product = 1
    for name in ("tensor", "pipeline", "context"):
        product *= int(parallel.get(name, {}).get("degree", 1))
    return product
