"""`llmpar launch SPEC [--for NAME] [-o DIR]`: what a framework needs to run the plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmpar.cli.common import add_spec_arguments, overrides, spec_source
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "launch", help="the framework arguments and launcher line that run a spec's plan",
        description="Write what a framework needs to run the spec's layout: Megatron-LM "
                    "pretrain_gpt.py arguments, NeMo 2 or Megatron-Bridge recipe "
                    "overrides, a torchtitan job TOML, a DeepSpeed config JSON, a PyTorch "
                    "FSDP2 + DeviceMesh script, Hugging Face TrainingArguments with an "
                    "accelerate config, each with its launcher line; for a serving spec, "
                    "the vllm serve, sglang.launch_server or trtllm-serve command line "
                    "(with TensorRT-LLM's LLM-API YAML). Every setting of the spec the "
                    "framework cannot express is listed, never dropped. Targets come from "
                    "plugins (llmpar_launch_targets); `llmpar plugins` lists them.")
    add_spec_arguments(parser)
    parser.add_argument("--for", dest="target", metavar="NAME",
                        help="the framework (a launch target's name or alias, e.g. "
                             "megatron, nemo, megatron-bridge, torchtitan, deepspeed, fsdp2, "
                             "hf-trainer, vllm, sglang, trt-llm); default: the "
                             "spec's [training] framework, else megatron-core; a serving "
                             "spec's [inference] engine, else vllm")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="write the files into DIR (made if missing) instead of "
                             "printing them")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    launch = session.launch(spec_source(session, args.spec), args.target,
                            overrides(args.set))
    if args.output is None:
        print(launch.text(), end="")
        return 0
    folder = Path(args.output)
    folder.mkdir(parents=True, exist_ok=True)
    for file in launch.files:
        (folder / file.name).write_text(file.text, encoding="utf-8")
    report = "".join(f"{u.path} = {u.value}: {u.reason}\n" for u in launch.unmapped)
    notes = "".join(f"{note}\n" for note in launch.notes)
    (folder / "UNMAPPED.txt").write_text(
        f"# Settings of the spec {launch.target} ({launch.framework_version}) cannot "
        f"express\n{report}# Notes\n{notes}", encoding="utf-8")
    names = ", ".join(file.name for file in launch.files)
    print(f"wrote {folder}: {names}, UNMAPPED.txt ({len(launch.unmapped)} not mapped)",
          file=sys.stderr)
    return 0
