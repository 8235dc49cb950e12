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
    python validation/launch_arguments.py megatron-bridge BRIDGE_SOURCE \
        --megatron-source MEGATRON_LM_SOURCE
    python validation/launch_arguments.py nemo NEMO_SOURCE --megatron-source MEGATRON_LM_SOURCE \
        --lightning-source LIGHTNING_SOURCE
    python validation/launch_arguments.py trt-llm TENSORRT_LLM_SOURCE
    python validation/launch_arguments.py nemo --check OVERRIDES...
    python validation/launch_arguments.py megatron-bridge --check OVERRIDES...

`--check` parses argument files (what `llmpar launch --for megatron -o DIR` writes as
`pretrain_gpt.args`; for vllm and sglang, the `serve.sh` lines; for nemo, the
`overrides.txt` files, applied with NeMo-Run's CLI parser to a recipe-shaped object with
the committed fields; for megatron-bridge, applied with Hydra's override parser to a
struct OmegaConf container of the committed sections, as Bridge applies them) with the
framework's own parser instead, and fails on any it rejects.

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
- megatron-bridge: the sections of Megatron-Bridge's `ConfigContainer`
  (src/megatron/bridge/training/config.py) and every field of each section's class,
  inherited ones included, read with `ast` from a checkout and from the Megatron-LM
  checkout it pins as 3rdparty/Megatron-LM (MEGATRON_LM_SOURCE; Megatron-Core's
  TransformerConfig, DistributedDataParallelConfig, OptimizerConfig and
  megatron.training's configs are its bases); the registered mixed-precision recipes and
  scripts/training/run_recipe.py's options. Bridge needs Transformer Engine and CUDA to
  import, so its sources are parsed rather than imported.
- nemo: the objects a NeMo 2 recipe (nemo/collections/llm/recipes) configures, read
  with `ast`: the `__init__` parameters of MegatronStrategy, MegatronMixedPrecision, the
  GPT data modules and lightning's Trainer (LIGHTNING_SOURCE: an unpacked
  pytorch_lightning wheel), and the fields of GPTConfig (Megatron-Core's
  TransformerConfig), DistributedDataParallelConfig and OptimizerConfig
  (MEGATRON_LM_SOURCE).
- trt-llm: `trtllm-serve serve`'s click options (tensorrt_llm/commands/serve.py) and the
  fields of the LLM-API classes its `--extra_llm_api_options` YAML sets
  (tensorrt_llm/llmapi/llm_args.py), read with `ast` from a checkout (the wheel needs
  CUDA to install).

The frameworks are for this script only, never a dependency of llmpar or its tests.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
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


class _Sources:
    """Python modules of source checkouts, found by dotted name and parsed with `ast`
    (nothing is imported, so none of the frameworks' dependencies is needed)."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.trees: dict[str, tuple[ast.Module, bool] | None] = {}

    def module(self, name: str) -> tuple[ast.Module, bool] | None:
        """The parsed module and whether it is a package (an `__init__.py`)."""
        if name not in self.trees:
            self.trees[name] = None
            for root in self.roots:
                stem = root / name.replace(".", "/")
                for path, package in ((stem.with_suffix(".py"), False),
                                      (stem / "__init__.py", True)):
                    if path.exists():
                        self.trees[name] = (ast.parse(path.read_text(encoding="utf-8")),
                                            package)
                        break
                if self.trees[name] is not None:
                    break
        return self.trees[name]

    @staticmethod
    def _top(tree: ast.Module) -> list[ast.stmt]:
        """Top-level statements, those under `if`/`try` included (guarded imports)."""
        found: list[ast.stmt] = []
        for node in tree.body:
            found.append(node)
            if isinstance(node, ast.If | ast.Try):
                found += [*node.body, *getattr(node, "orelse", []),
                          *[s for h in getattr(node, "handlers", []) for s in h.body]]
        return found

    def _imported(self, module: str, package: bool, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        base = parts if package else parts[:-1]
        base = base[:len(base) - node.level + 1]
        return ".".join([*base, *([node.module] if node.module else [])])

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class `name` as seen from `module`: defined there or imported into it."""
        parsed = self.module(module)
        if parsed is None or depth > 8:
            return None
        tree, package = parsed
        for node in self._top(tree):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in self._top(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._imported(module, package, node)
                        found = self.find(source, alias.name, depth + 1)
                        if found is None:  # `from package import submodule`
                            found = self.find(f"{source}.{alias.name}", name, depth + 1)
                        return found
        return None

    def _base(self, module: str, base: ast.expr) -> tuple[str, str] | None:
        if isinstance(base, ast.Name):
            return module, base.id
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            parsed = self.module(module)
            assert parsed is not None
            tree, package = parsed
            for node in self._top(tree):
                if isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        if (alias.asname or alias.name) == base.value.id:
                            source = self._imported(module, package, node)
                            return f"{source}.{alias.name}", base.attr
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if (alias.asname or alias.name) == base.value.id:
                            return alias.name, base.attr
        return None

    def fields(self, module: str, name: str, init: bool = False) -> dict[str, str]:
        """The fields of a dataclass (or pydantic model): its annotated class attributes,
        its bases' first; with `init`, the parameters of `__init__` instead (a plain
        class). Each with its annotation as written."""
        found = self.find(module, name)
        if found is None:
            raise LookupError(f"class {name} not found from {module}")
        where, node = found
        result: dict[str, str] = {}
        if not init:
            for base in node.bases:
                resolved = self._base(where, base)
                if resolved is not None and self.find(*resolved) is not None:
                    result.update(self.fields(*resolved))
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    annotation = ast.unparse(item.annotation)
                    if not annotation.startswith("ClassVar") and not item.target.id.startswith("_"):
                        result[item.target.id] = annotation
            return result
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                arguments = [*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs]
                return {a.arg: ast.unparse(a.annotation) if a.annotation else ""
                        for a in arguments if a.arg != "self"}
        raise LookupError(f"{name} from {module} has no __init__")


def _option_strings(path: Path) -> list[str]:
    """The `--` option strings of every `add_argument(...)` call in a script (ast)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted({arg.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                   for arg in node.args if isinstance(arg, ast.Constant)
                   and isinstance(arg.value, str) and arg.value.startswith("--")})


def _registered(path: Path, decorator: str) -> list[str]:
    """The names of the functions of a module carrying `@decorator` (ast)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                  and any(isinstance(d, ast.Name) and d.id == decorator
                          for d in node.decorator_list))


def megatron_bridge(source: Path, megatron_source: Path, commit: str,
                    megatron_commit: str) -> dict[str, Any]:
    """Megatron-Bridge's ConfigContainer sections (src/megatron/bridge/training/config.py)
    and each section class's fields, its Megatron-Core / megatron.training bases' included
    (MEGATRON_LM_SOURCE: the checkout Bridge pins as 3rdparty/Megatron-LM), read with ast;
    the mixed-precision recipe names (training/mixed_precision.py, `@register`); and the
    options of scripts/training/run_recipe.py."""
    code = _Sources([source / "src", megatron_source])
    config = "megatron.bridge.training.config"
    sections = {
        "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
        "train": (config, "TrainingConfig"), "optimizer": (config, "OptimizerConfig"),
        "ddp": (config, "DistributedDataParallelConfig"), "dataset": (config, "GPTDatasetConfig"),
        "dist": (config, "DistributedInitConfig"), "checkpoint": (config, "CheckpointConfig"),
        "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig")}
    found = {name: dict(sorted(code.fields(*where).items()))
             for name, where in sections.items()}
    mla = code.fields("megatron.core.transformer.transformer_config", "MLATransformerConfig")
    found["model"].update(sorted((k, v) for k, v in mla.items() if k not in found["model"]))
    version = code.module("megatron.bridge.package_info")
    assert version is not None
    numbers = {node.targets[0].id: ast.literal_eval(node.value) for node in version[0].body
               if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
               and node.targets[0].id in ("MAJOR", "MINOR", "PATCH")}
    return {"framework": "Megatron-Bridge",
            "version": f"{numbers['MAJOR']}.{numbers['MINOR']}.{numbers['PATCH']}",
            "commit": commit, "megatron_lm_commit": megatron_commit,
            "how": "src/megatron/bridge/training/config.py: ConfigContainer's fields and each "
                   "section class's fields with their bases' (Megatron-Core, megatron.training), "
                   "read with ast from the sources (model: GPTModelProvider plus the fields "
                   "MLATransformerConfig adds); mixed_precision: the @register recipes of "
                   "training/mixed_precision.py; run_recipe: scripts/training/run_recipe.py's "
                   "add_argument option strings",
            "container": sorted(code.fields(config, "ConfigContainer")),
            "sections": found,
            "mixed_precision": _registered(
                source / "src/megatron/bridge/training/mixed_precision.py", "register"),
            "run_recipe": _option_strings(source / "scripts/training/run_recipe.py")}


def nemo(source: Path, megatron_source: Path, lightning_source: Path, commit: str,
         megatron_commit: str) -> dict[str, Any]:
    """NeMo 2's recipe objects (nemo/collections/llm/recipes: a run.Partial of `pretrain`
    with trainer, model, data, optim): the parameters of the classes they configure
    (MegatronStrategy, MegatronMixedPrecision, PreTrainingDataModule and MockDataModule,
    lightning's Trainer from LIGHTNING_SOURCE) and the fields of the Megatron-Core
    dataclasses (GPTConfig's TransformerConfig, DistributedDataParallelConfig,
    OptimizerConfig) from MEGATRON_LM_SOURCE, read with ast."""
    code = _Sources([source, megatron_source, lightning_source])
    data = {**code.fields("nemo.collections.llm.gpt.data.pre_training",
                          "PreTrainingDataModule", init=True),
            **code.fields("nemo.collections.llm.gpt.data.mock", "MockDataModule", init=True)}
    model = code.fields("nemo.collections.llm.gpt.model.base", "GPTConfig")
    mla = code.fields("megatron.core.transformer.transformer_config", "MLATransformerConfig")
    model.update((k, v) for k, v in mla.items() if k not in model)
    sections = {
        "trainer": code.fields("pytorch_lightning.trainer.trainer", "Trainer", init=True),
        "trainer.strategy": code.fields("nemo.lightning.pytorch.strategies.megatron_strategy",
                                        "MegatronStrategy", init=True),
        "trainer.strategy.ddp": code.fields("megatron.core.distributed",
                                            "DistributedDataParallelConfig"),
        "trainer.plugins": code.fields("nemo.lightning.pytorch.plugins.mixed_precision",
                                       "MegatronMixedPrecision", init=True),
        "model.config": model, "data": data,
        "optim.config": code.fields("megatron.core.optimizer", "OptimizerConfig")}
    version = code.module("nemo.package_info")
    assert version is not None
    numbers = {node.targets[0].id: ast.literal_eval(node.value) for node in version[0].body
               if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
               and node.targets[0].id in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE")}
    return {"framework": "NeMo 2",
            "version": f"{numbers['MAJOR']}.{numbers['MINOR']}.{numbers['PATCH']}"
                       f"{numbers['PRE_RELEASE']}",
            "commit": commit, "megatron_lm_commit": megatron_commit,
            "how": "read with ast from the sources: the __init__ parameters of lightning's "
                   "Trainer, MegatronStrategy, MegatronMixedPrecision and the GPT data modules, "
                   "and the fields of GPTConfig (with MLATransformerConfig's), "
                   "DistributedDataParallelConfig and OptimizerConfig, the objects a "
                   "nemo.collections.llm recipe configures; the Megatron-Core classes from "
                   "the Megatron-LM commit given (megatron_lm_commit), which may be newer "
                   "than the megatron-core a NeMo 2 container ships",
            "lightning": lightning_source.name,
            "sections": {name: dict(sorted(fields.items())) for name, fields in sections.items()}}


TRT_LLM_CLASSES = ("TorchLlmArgs", "KvCacheConfig", "MTPDecodingConfig", "Eagle3DecodingConfig")
"""The classes of tensorrt_llm/llmapi/llm_args.py whose fields the YAML of
`--extra_llm_api_options` sets: the PyTorch backend's LLM arguments (TorchLlmArgs, with
BaseLlmArgs's) and the nested configs llmpar writes."""


def _click_options(path: Path, command: str) -> dict[str, Any]:
    """The options of a click command (the `@click.option(...)` decorators of the function
    registered as `@click.command(command)`): every `--` name with its parameter name,
    whether it is a flag, and its type as written."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
        if not any(ast.unparse(d.func) == "click.command" and d.args
                   and ast.literal_eval(d.args[0]) == command for d in calls):
            continue
        found: dict[str, Any] = {}
        for call in calls:
            if ast.unparse(call.func) != "click.option":
                continue
            names = [a.value for a in call.args if isinstance(a, ast.Constant)]
            keywords = {k.arg: k.value for k in call.keywords}
            flag = "is_flag" in keywords and ast.literal_eval(keywords["is_flag"]) is True
            options = [n for n in names if n.startswith("--")]
            dest = next((n for n in names if not n.startswith("-")),
                        options[0].lstrip("-").replace("-", "_"))
            kind = ast.unparse(keywords["type"]) if "type" in keywords else None
            for option in options:
                found[option] = {"dest": dest, "switch": flag, "type": kind}
        return dict(sorted(found.items()))
    raise LookupError(f"no click command {command!r} in {path}")


def trt_llm(source: Path, commit: str) -> dict[str, Any]:
    """`trtllm-serve serve`'s options (tensorrt_llm/commands/serve.py, click) and the
    fields of the LLM-API classes its `--extra_llm_api_options` YAML sets
    (tensorrt_llm/llmapi/llm_args.py, pydantic), read with ast from a checkout (the wheel
    needs CUDA to install)."""
    code = _Sources([source])
    module = "tensorrt_llm.llmapi.llm_args"
    version_file = source / "tensorrt_llm" / "version.py"
    version = version_file.read_text(encoding="utf-8") if version_file.exists() else ""
    number = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", version)
    return {"framework": "TensorRT-LLM",
            "version": number.group(1) if number else "unknown (no tensorrt_llm/version.py)",
            "commit": commit,
            "how": "read with ast: the click options of `serve` in "
                   "tensorrt_llm/commands/serve.py, and the annotated fields (bases' "
                   "included) of the llm_args.py classes the --extra_llm_api_options YAML "
                   "sets",
            "serve": _click_options(source / "tensorrt_llm" / "commands" / "serve.py",
                                    "serve"),
            "llm_args": {name: dict(sorted(code.fields(module, name).items()))
                         for name in TRT_LLM_CLASSES}}


def check_nemo(files: list[Path]) -> int:
    """Apply each overrides file (what `llmpar launch --for nemo -o DIR` writes as
    `overrides.txt`) with NeMo-Run's own CLI parser (`nemo_run.cli.cli_parser.
    parse_cli_args`, the parser `nemo llm pretrain` uses) to a recipe-shaped
    `run.Partial(pretrain, model, trainer, data, optim)` whose objects have the fields
    committed in validation/data/launch/nemo.json (bool, int, float or text as annotated,
    each Optional): NeMo-Run must accept every path and read every value as its field's
    type. Needs only the nemo_run package, not NeMo."""
    import dataclasses
    from typing import Optional, Union

    import nemo_run as run  # type: ignore[import-not-found]
    from nemo_run.cli.cli_parser import parse_cli_args  # type: ignore[import-not-found]

    sections = json.loads((OUT / "nemo.json").read_text(encoding="utf-8"))["sections"]

    def scalar(annotation: str) -> Any:
        for word, found in (("bool", bool), ("float", float), ("int", int)):
            if re.search(rf"\b{word}\b|{word.capitalize()}", annotation):
                return found
        return str

    def kind(annotation: str) -> Any:
        """The field's type as NeMo-Run parses it: a scalar, a list, or either."""
        inner = re.search(r"[Ll]ist\[([^\]]+)\]", annotation)
        if inner is None:
            return scalar(annotation)
        rest = annotation.replace(inner.group(0), "")
        element = list[scalar(inner.group(1))]  # type: ignore[misc]
        return element if scalar(rest) is str and "str" not in rest else \
            Union[scalar(rest), element]  # noqa: UP007

    made: dict[str, Any] = {}

    def cls(section: str, nested: dict[str, str]) -> Any:
        fields = [(name, Optional[made[nested[name]]] if name in nested  # noqa: UP045
                   else Optional[kind(annotation)], None)  # noqa: UP045
                  for name, annotation in sections[section].items()]
        fields += [(name, Optional[made[target]], None) for name, target in nested.items()  # noqa: UP045
                   if name not in sections[section]]
        made[section] = dataclasses.make_dataclass(section.replace(".", "_"), fields)
        return made[section]

    cls("trainer.strategy.ddp", {})
    cls("trainer.strategy", {"ddp": "trainer.strategy.ddp"})
    cls("trainer.plugins", {})
    cls("trainer", {"strategy": "trainer.strategy", "plugins": "trainer.plugins"})
    cls("model.config", {})
    cls("optim.config", {})
    cls("data", {})
    made["model"] = dataclasses.make_dataclass("model", [("config", made["model.config"])])
    made["optim"] = dataclasses.make_dataclass("optim", [("config", made["optim.config"])])

    def pretrain(model: Any, trainer: Any, data: Any, optim: Any) -> None:
        """The recipe's function (nemo.collections.llm.api.pretrain's arguments)."""

    failed = 0
    for path in files:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        recipe = run.Partial(
            pretrain, model=run.Config(made["model"], config=run.Config(made["model.config"])),
            trainer=run.Config(made["trainer"],
                               strategy=run.Config(made["trainer.strategy"],
                                                   ddp=run.Config(made["trainer.strategy.ddp"])),
                               plugins=run.Config(made["trainer.plugins"])),
            data=run.Config(made["data"]),
            optim=run.Config(made["optim"], config=run.Config(made["optim.config"])))
        try:
            parsed = parse_cli_args(recipe, lines)
        except Exception as exc:  # NeMo-Run's CLIException and what it wraps
            failed += 1
            print(f"{path}: rejected: {exc}")
            continue
        wrong = []
        for line in lines:
            key, _, _ = line.partition("=")
            *parents, name = key.split(".")
            node = parsed
            for parent in parents:
                node = getattr(node, parent)
            value = getattr(node, name)
            section = ".".join(parents)
            expected = kind(sections[section][name]) if name in sections.get(section, {}) \
                else None
            if isinstance(expected, type) and value is not None and not (
                    isinstance(value, expected) and (expected is not int
                                                     or not isinstance(value, bool))):
                wrong.append(f"{key} read as {value!r}")
        if wrong:
            failed += 1
            print(f"{path}: values of the wrong type: {', '.join(wrong)}")
        else:
            print(f"{path}: accepted ({len(lines)} overrides)")
    return 1 if failed else 0


def check_bridge(files: list[Path]) -> int:
    """Apply each overrides file (`llmpar launch --for megatron-bridge -o DIR` writes
    `overrides.txt`) the way Megatron-Bridge does (training/utils/omegaconf_utils.py
    `parse_hydra_overrides`: Hydra's OverridesParser on the ConfigContainer as an OmegaConf
    struct config, so an unknown key is an error) to a container with the committed
    sections and fields, then check each value against its field's annotation. Needs
    hydra-core and omegaconf, not Bridge."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl  # type: ignore[import-not-found]
    from hydra.core.override_parser.overrides_parser import OverridesParser  # type: ignore[import-not-found]
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    data = json.loads((OUT / "megatron-bridge.json").read_text(encoding="utf-8"))
    sections = data["sections"]

    def accepts(annotation: str, value: Any) -> bool:
        if value is None:
            return "Optional" in annotation or "None" in annotation
        if isinstance(value, bool):
            return "bool" in annotation
        if isinstance(value, int):
            return bool(re.search(r"\bint\b|Int\b|float", annotation))
        if isinstance(value, float):
            return "float" in annotation
        if isinstance(value, list):
            return "list" in annotation.lower() or "tuple" in annotation.lower()
        return "str" in annotation or "Literal" in annotation

    failed = 0
    for path in files:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        container = {name: dict.fromkeys(fields) for name, fields in sections.items()}
        container["mixed_precision"] = "bf16_mixed"
        config = OmegaConf.create(container)
        try:
            OmegaConf.set_struct(config, True)
            parsed = OverridesParser.create().parse_overrides(overrides=lines)
            ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=config)
        except Exception as exc:  # Hydra's and OmegaConf's errors
            failed += 1
            print(f"{path}: rejected: {exc}")
            continue
        wrong = []
        for line in lines:
            key = line.partition("=")[0]
            section, _, name = key.partition(".")
            value = OmegaConf.select(config, key)
            if not name:
                good = value in data["mixed_precision"] or value is None
            else:
                good = accepts(sections[section][name], OmegaConf.to_object(value)
                               if OmegaConf.is_config(value) else value)
            if not good:
                wrong.append(f"{key} read as {value!r}")
        if wrong:
            failed += 1
            print(f"{path}: values of the wrong type: {', '.join(wrong)}")
        else:
            print(f"{path}: accepted ({len(lines)} overrides)")
    return 1 if failed else 0


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


def _write(name: str, data: dict[str, Any]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _write_config_data(args: argparse.Namespace, parser: argparse.ArgumentParser,
                       commit: str) -> int:
    if args.source is None:
        parser.error(f"{args.framework} needs the path of its source checkout")
    if args.framework == "trt-llm":
        return _write("trt-llm", trt_llm(args.source, commit))
    if args.megatron_source is None:
        parser.error(f"{args.framework} needs --megatron-source")
    megatron_commit = args.megatron_commit or _git_commit(args.megatron_source)
    if args.framework == "megatron-bridge":
        return _write("megatron-bridge", megatron_bridge(args.source, args.megatron_source,
                                                         commit, megatron_commit))
    if args.lightning_source is None:
        parser.error("nemo needs --lightning-source")
    return _write("nemo", nemo(args.source, args.megatron_source, args.lightning_source,
                               commit, megatron_commit))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=("megatron", "torchtitan", "deepspeed",
                                              "fsdp2", "vllm", "sglang", "hf-trainer",
                                              "nemo", "megatron-bridge", "trt-llm"))
    parser.add_argument("source", nargs="?", type=Path,
                        help="a checkout of the framework (megatron, torchtitan)")
    parser.add_argument("--commit", help="the checkout's commit, where it has no .git")
    parser.add_argument("--check", nargs="+", type=Path, metavar="ARGS",
                        help="megatron, vllm, sglang, nemo, megatron-bridge: parse these "
                             "argument files, serve.sh lines or overrides with the "
                             "framework's parser instead of writing the data")
    parser.add_argument("--megatron-source", type=Path, metavar="MEGATRON_LM_SOURCE",
                        help="nemo, megatron-bridge: the Megatron-LM checkout whose "
                             "Megatron-Core dataclasses the configs extend")
    parser.add_argument("--megatron-commit", help="that checkout's commit, where it has no .git")
    parser.add_argument("--lightning-source", type=Path, metavar="LIGHTNING_SOURCE",
                        help="nemo: an unpacked pytorch_lightning wheel (its Trainer)")
    args = parser.parse_args()
    if args.check and args.framework == "nemo":
        return check_nemo(args.check)
    if args.check and args.framework == "megatron-bridge":
        return check_bridge(args.check)
    if args.check and args.framework in ("vllm", "sglang"):
        return check_server(args.framework, args.source, args.check)
    if args.check:
        return check_megatron(args.source, args.check)
    if args.framework in ("megatron", "torchtitan", "vllm", "sglang") and args.source is None:
        parser.error(f"{args.framework} needs the path of its source checkout")
    commit = args.commit or (_git_commit(args.source) if args.source else "")
    if args.framework in ("nemo", "megatron-bridge", "trt-llm"):
        return _write_config_data(args, parser, commit)
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
