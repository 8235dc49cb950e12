"""Read the arguments each framework accepts from the framework itself, and commit them
as data (validation/data/launch/<framework>.json) for the launch tests, so that CI needs
none of the frameworks.

    python validation/launch_arguments.py megatron MEGATRON_LM_SOURCE
    python validation/launch_arguments.py torchtitan TORCHTITAN_SOURCE
    python validation/launch_arguments.py deepspeed
    python validation/launch_arguments.py fsdp2
    python validation/launch_arguments.py vllm VLLM_SOURCE
    python validation/launch_arguments.py sglang SGLANG_PYTHON_SOURCE
    python validation/launch_arguments.py hf-trainer
    python validation/launch_arguments.py megatron MEGATRON_LM_SOURCE --check ARGS...

`--check` parses argument files (what `llmpar launch --for megatron -o DIR` writes as
`pretrain_gpt.args`; for vllm and sglang, the `serve.sh` lines) with the framework's own
parser instead, and fails on any it rejects.

- megatron: Megatron-LM's own parser. Its `megatron/training/arguments.py` is not in the
  megatron-core wheel, so it is imported from a checkout of NVIDIA/Megatron-LM
  (MEGATRON_LM_SOURCE, with `torch` installed; no GPU is needed to build the parser):
  `add_megatron_arguments(argparse.ArgumentParser())`, then every option string of the
  parser with its type, nargs and choices.
- torchtitan: the `JobConfig` dataclasses of `torchtitan/config/job_config.py` of a
  checkout (the TOML job configuration, before torchtitan 0.2.2 replaced it with Python
  config registries), read with `ast` (no torch needed): each section and its fields with
  their annotated types.
- deepspeed: the installed `deepspeed` package's config classes (pydantic models:
  `DeepSpeedZeroConfig`, offload configs, activation checkpointing), and the top-level
  keys `deepspeed/runtime/constants.py` names.
- fsdp2: the installed `torch` package's FSDP2 API: the keyword parameters of
  `fully_shard`, `MixedPrecisionPolicy`, `init_device_mesh`, and `FSDPModule`'s methods;
  and torchrun's options (`torch.distributed.run.get_args_parser`), which every torchrun
  line llmpar writes uses. The deepspeed data also lists the `deepspeed` launcher's options
  (`deepspeed.launcher.runner.parse_args`).
- vllm: vLLM's own parser of `vllm serve`'s engine arguments
  (`AsyncEngineArgs.add_cli_args`), imported from the sources of a vLLM wheel or checkout
  (VLLM_SOURCE, with torch and vLLM's Python dependencies installed; the script sets
  VLLM_TARGET_DEVICE=cpu, so no GPU is needed to build it).
- sglang: SGLang's own parser of `python -m sglang.launch_server`'s arguments
  (`ServerArgs.add_cli_args`), from a wheel's or checkout's `python/` folder.
- hf-trainer: the installed transformers' `TrainingArguments` fields and `FSDPOption`
  values, and the installed accelerate's config-file keys and `accelerate launch` options.

The frameworks are for this script only, never a dependency of llmpar or its tests.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "launch"


def _git_commit(folder: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _type_name(kind: Any) -> str | None:
    if kind is None:
        return None
    return getattr(kind, "__name__", type(kind).__name__)


def _parser_arguments(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Every `--` option string of an argparse parser with its dest, whether it is a
    switch (takes no value), its type's name, nargs and choices: the parser's own record
    of its arguments."""
    found: dict[str, Any] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if not option.startswith("--"):
                continue
            switch = action.nargs == 0
            found[option] = {
                "dest": action.dest,
                "switch": switch,
                "type": None if switch else (_type_name(action.type) or "str"),
                "nargs": action.nargs if isinstance(action.nargs, (str, int)) else None,
                "choices": ([str(c) for c in action.choices if c is not None]
                            if action.choices is not None else None),
            }
    return dict(sorted(found.items()))


def vllm(source: Path) -> dict[str, Any]:
    """`vllm serve`'s engine arguments: `AsyncEngineArgs.add_cli_args` on vLLM's own
    parser, from a wheel's or checkout's sources (VLLM_TARGET_DEVICE=cpu builds it
    without a GPU; torch and vLLM's Python dependencies installed)."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, str(source))
    import vllm as package  # type: ignore[import-not-found]
    from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = FlexibleArgumentParser()
    AsyncEngineArgs.add_cli_args(parser)
    return {"framework": "vLLM", "version": package.__version__, "commit": "",
            "how": "vllm/engine/arg_utils.py AsyncEngineArgs.add_cli_args("
                   "FlexibleArgumentParser()), every option string",
            "arguments": _parser_arguments(parser)}


def sglang(source: Path) -> dict[str, Any]:
    """`python -m sglang.launch_server`'s arguments: `ServerArgs.add_cli_args` on an
    argparse parser, from a wheel's or checkout's `python/` sources (no GPU needed; torch
    and SGLang's Python dependencies installed)."""
    sys.path.insert(0, str(source))
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    from sglang.version import __version__  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {"framework": "SGLang", "version": __version__, "commit": "",
            "how": "sglang/srt/server_args.py ServerArgs.add_cli_args("
                   "argparse.ArgumentParser()), every option string",
            "arguments": _parser_arguments(parser)}


def hf_trainer() -> dict[str, Any]:
    """The installed transformers' `TrainingArguments` fields (a dataclass: each name and
    its annotated type) and `FSDPOption` values, and the installed accelerate's config
    file keys (`ClusterConfig`'s fields) and `accelerate launch` options, whose names the
    config's fsdp_config / deepspeed_config keys are (accelerate/commands/launch.py)."""
    import dataclasses

    import accelerate  # type: ignore[import-not-found]
    import transformers  # type: ignore[import-not-found]
    from accelerate.commands.config.config_args import ClusterConfig  # type: ignore[import-not-found]
    from accelerate.commands.launch import launch_command_parser  # type: ignore[import-not-found]
    from transformers import TrainingArguments  # type: ignore[import-not-found]
    from transformers.trainer_utils import FSDPOption  # type: ignore[import-not-found]

    def annotation(kind: Any) -> str:
        return kind.__name__ if isinstance(kind, type) else str(kind)

    options = sorted({option.lstrip("-") for action in launch_command_parser()._actions
                      for option in action.option_strings
                      if option.startswith("--") and "_" in option})
    return {"framework": "Hugging Face Trainer + accelerate",
            "version": f"transformers {transformers.__version__}, accelerate "
                       f"{accelerate.__version__}", "commit": "",
            "how": "the installed packages: dataclasses.fields(TrainingArguments), "
                   "FSDPOption, dataclasses.fields(ClusterConfig) and the option strings "
                   "of accelerate's launch_command_parser()",
            "training_arguments": {f.name: annotation(f.type)
                                   for f in dataclasses.fields(TrainingArguments)},
            "fsdp_options": [option.value for option in FSDPOption],
            "accelerate_config_keys": sorted(f.name for f in dataclasses.fields(ClusterConfig)),
            "accelerate_launch_options": options}


def megatron(source: Path, commit: str) -> dict[str, Any]:
    sys.path.insert(0, str(source))
    from megatron.core import package_info  # type: ignore[import-not-found]
    from megatron.training.arguments import add_megatron_arguments  # type: ignore[import-not-found]

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    found = _parser_arguments(parser)
    return {"framework": "Megatron-LM", "version": package_info.__version__,
            "commit": commit, "how": "megatron/training/arguments.py "
            "add_megatron_arguments(argparse.ArgumentParser()), every option string",
            "arguments": dict(sorted(found.items()))}


def torchtitan(source: Path, commit: str) -> dict[str, Any]:
    path = source / "torchtitan" / "config" / "job_config.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    job = classes["JobConfig"]
    sections: dict[str, Any] = {}
    for item in job.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        section_class = ast.unparse(item.annotation)
        node = classes.get(section_class)
        if node is None:
            continue
        fields = {}
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                fields[field.target.id] = ast.unparse(field.annotation)
        sections[item.target.id] = dict(sorted(fields.items()))
    version = (source / "assets" / "version.txt").read_text(encoding="utf-8").strip()
    return {"framework": "torchtitan", "version": version, "commit": commit,
            "how": "torchtitan/config/job_config.py: the JobConfig dataclass's sections and "
                   "their fields, read with ast", "sections": sections}


def _pydantic_fields(model: Any) -> dict[str, Any]:
    found = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        annotation = field.annotation
        found[key] = getattr(annotation, "__name__", str(annotation))
    return dict(sorted(found.items()))


def deepspeed() -> dict[str, Any]:
    import deepspeed as ds  # type: ignore[import-not-found]
    from deepspeed.runtime import constants  # type: ignore[import-not-found]
    from deepspeed.runtime.activation_checkpointing.config import (  # type: ignore[import-not-found]
        ACT_CHKPT,
        DeepSpeedActivationCheckpointingConfig,
    )
    from deepspeed.runtime.zero.config import (  # type: ignore[import-not-found]
        ZERO_OPTIMIZATION,
        DeepSpeedZeroConfig,
    )
    from deepspeed.runtime.zero.offload_config import (  # type: ignore[import-not-found]
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    top = sorted({value for name, value in vars(constants).items()
                  if name.isupper() and isinstance(value, str) and value.islower()
                  and " " not in value and not name.endswith("_DEFAULT")}
                 | {ZERO_OPTIMIZATION, ACT_CHKPT})
    checkpointing = sorted(k for k in vars(DeepSpeedActivationCheckpointingConfig({}))
                           if not k.startswith("_"))
    import inspect
    import re

    from deepspeed.launcher import runner  # type: ignore[import-not-found]

    launcher = sorted(set(re.findall(r'add_argument\(\s*(?:"-\w+",\s*)?"(--[\w-]+)"',
                                     inspect.getsource(runner.parse_args))))
    return {"framework": "DeepSpeed", "version": ds.__version__, "commit": "",
            "launcher": launcher,
            "how": "the installed package: deepspeed/runtime/constants.py's key names, and "
                   "the fields of DeepSpeedZeroConfig and its offload configs (pydantic)",
            "top_level_keys": top,
            "zero_optimization": _pydantic_fields(DeepSpeedZeroConfig),
            "offload_optimizer": _pydantic_fields(DeepSpeedZeroOffloadOptimizerConfig),
            "offload_param": _pydantic_fields(DeepSpeedZeroOffloadParamConfig),
            "activation_checkpointing": checkpointing}


def fsdp2() -> dict[str, Any]:
    import inspect

    import torch  # type: ignore[import-not-found]
    from torch.distributed.device_mesh import init_device_mesh  # type: ignore[import-not-found]
    from torch.distributed.fsdp import (  # type: ignore[import-not-found]
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
    )
    from torch.distributed.run import get_args_parser  # type: ignore[import-not-found]

    def parameters(function: Any) -> list[str]:
        return sorted(inspect.signature(function).parameters)

    torchrun = sorted(option for action in get_args_parser()._actions
                      for option in action.option_strings if option.startswith("--"))

    return {"framework": "PyTorch FSDP2", "version": torch.__version__, "commit": "",
            "how": "the installed torch: inspect.signature of the FSDP2 API",
            "fully_shard": parameters(fully_shard),
            "MixedPrecisionPolicy": parameters(MixedPrecisionPolicy),
            "init_device_mesh": parameters(init_device_mesh),
            "FSDPModule": sorted(m for m in dir(FSDPModule) if not m.startswith("_")),
            "torchrun": torchrun}


def check_megatron(source: Path, files: list[Path]) -> int:
    """Parse each argument file with Megatron-LM's parser (argparse's own checks: names,
    types, choices, counts; not `validate_args`, which needs the distributed world)."""
    import shlex

    sys.path.insert(0, str(source))
    from megatron.training.arguments import add_megatron_arguments  # type: ignore[import-not-found]

    failed = 0
    for path in files:
        parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False,
                                                                exit_on_error=False))
        try:
            parser.parse_args(shlex.split(path.read_text(encoding="utf-8")))
            print(f"{path}: accepted")
        except (argparse.ArgumentError, SystemExit) as exc:
            failed += 1
            print(f"{path}: rejected: {exc}")
    return 1 if failed else 0


def check_server(framework: str, source: Path, files: list[Path]) -> int:
    """Parse each `serve.sh` (what `llmpar launch --for vllm|sglang -o DIR` writes) with the
    engine's own parser (argparse's checks: names, types, choices, counts), the shell's
    variables given sample values as the shell would expand them."""
    import os
    import shlex

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, str(source))
    failed = 0
    for path in files:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for name, value in (("$MODEL", "model"), ("$NODE_RANK", "0"),
                            ("$MASTER_ADDR", "127.0.0.1")):
            text = text.replace(name, value)
        words = [w for w in shlex.split(text, comments=True) if w != "#!/bin/sh"]
        first = next(i for i, word in enumerate(words) if word.startswith("--"))
        words = words[first:]
        if framework == "vllm":
            from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]
            from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

            parser: argparse.ArgumentParser = FlexibleArgumentParser(exit_on_error=False)
            AsyncEngineArgs.add_cli_args(parser)
            words = ["--model", "model", *words]
        else:
            from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

            parser = argparse.ArgumentParser(exit_on_error=False)
            ServerArgs.add_cli_args(parser)
        try:
            parser.parse_args(words)
            print(f"{path}: accepted")
        except (argparse.ArgumentError, SystemExit) as exc:
            failed += 1
            print(f"{path}: rejected: {exc}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=("megatron", "torchtitan", "deepspeed",
                                              "fsdp2", "vllm", "sglang", "hf-trainer"))
    parser.add_argument("source", nargs="?", type=Path,
                        help="a checkout of the framework (megatron, torchtitan)")
    parser.add_argument("--commit", help="the checkout's commit, where it has no .git")
    parser.add_argument("--check", nargs="+", type=Path, metavar="ARGS",
                        help="megatron, vllm, sglang: parse these argument files or serve.sh "
                             "lines with the framework's parser instead of writing the data")
    args = parser.parse_args()
    if args.check and args.framework in ("vllm", "sglang"):
        return check_server(args.framework, args.source, args.check)
    if args.check:
        return check_megatron(args.source, args.check)
    if args.framework in ("megatron", "torchtitan", "vllm", "sglang") and args.source is None:
        parser.error(f"{args.framework} needs the path of its source checkout")
    commit = args.commit or (_git_commit(args.source) if args.source else "")
    data = (megatron(args.source, commit) if args.framework == "megatron"
            else torchtitan(args.source, commit) if args.framework == "torchtitan"
            else vllm(args.source) if args.framework == "vllm"
            else sglang(args.source) if args.framework == "sglang"
            else hf_trainer() if args.framework == "hf-trainer"
            else deepspeed() if args.framework == "deepspeed" else fsdp2())
    if args.framework in ("vllm", "sglang") and not data["commit"]:
        data["commit"] = commit
    name = {"megatron": "megatron-lm", "torchtitan": "torchtitan",
            "deepspeed": "deepspeed", "fsdp2": "pytorch-fsdp2", "vllm": "vllm",
            "sglang": "sglang", "hf-trainer": "hf-trainer"}[args.framework]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
