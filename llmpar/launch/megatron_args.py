"""The `args` a Megatron-LM checkpoint stores, read from a JSON or YAML dump of them.

A Megatron checkpoint (`model_optim_rng.pt`, `common.pt`) keeps the run's parsed
arguments as an `argparse.Namespace` under "args" (megatron/training/checkpointing.py).
llmpar never unpickles a checkpoint: dump the namespace yourself from a file you trust
(`json.dumps(vars(state["args"]), default=str)`) and import the dump. Each stored value
sits under its argument's dest, which is the flag's name with underscores
(megatron/training/arguments.py), except for the store_false switches llmpar reads
(`DESTS`); the dump is turned back into the flags and read as an argument list.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import Argument, argument_lines
from llmpar.launch.hf_trainer import load_mapping
from llmpar.launch.megatron import SWITCHES, VALUED, read_arguments
from llmpar.launch.target import ReadSettings
from llmpar.spec import Spec

DESTS = {"add_bias_linear": ("--disable-bias-linear", False),
         "overlap_p2p_comm": ("--no-overlap-p2p-communication", False)}
"""Stored dests whose flag is a store_false switch: the flag, and the value it stores."""
MAPPING = re.compile(r"\s*(\{|[A-Za-z_]\w*:(\s|$))")
"""The start of a JSON object or a YAML mapping (an argument list starts with a flag or
the launcher)."""


def is_namespace(text: str) -> bool:
    """Whether `text` is a dump of stored arguments rather than an argument list."""
    lines = [line for line in text.splitlines() if line.strip()
             and not line.lstrip().startswith("#")]
    return bool(lines) and MAPPING.match(lines[0]) is not None


def _value_words(value: Any) -> str | tuple[str, ...]:
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, int) and not isinstance(v, bool) and v in (0, 1)
                         for v in value) and len(value) > 2:
            return json.dumps(list(value)).replace(" ", "")  # a --moe-layer-freq pattern
        return tuple(str(v) for v in value)
    return str(value)


def namespace_arguments(table: dict[str, Any]) -> tuple[list[Argument], list[str]]:
    """The flags the stored values say (for the arguments llmpar reads), and the stored
    keys left out because llmpar does not model them."""
    arguments: list[Argument] = []
    left: list[str] = []
    virtual = table.get("num_layers_per_virtual_pipeline_stage")
    for key, value in table.items():
        if key in DESTS:
            flag, stored = DESTS[key]
            if value is stored:
                arguments.append((flag, None))
            continue
        if key in ("num_virtual_stages_per_pipeline_rank",
                   "virtual_pipeline_model_parallel_size"):
            if virtual is None and value is not None and not any(
                    f == "--num-virtual-stages-per-pipeline-rank" for f, _ in arguments):
                arguments.append(("--num-virtual-stages-per-pipeline-rank", str(value)))
            continue
        flag = "--" + key.replace("_", "-")
        if flag in SWITCHES:
            if value is True:
                arguments.append((flag, None))
        elif flag in VALUED:
            if value is not None:
                arguments.append((flag, _value_words(value)))
        else:
            left.append(key)
    return arguments, left


def _stored_path(path: str, keys: dict[str, str]) -> str:
    flag = path.removeprefix("$.")
    if not flag.startswith("--"):
        return path
    return "$." + keys.get(flag, flag[2:].replace("-", "_"))


def read_namespace(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from a dump of a checkpoint's stored arguments, read as the flags
    they came from; `world_size` gives the GPUs."""
    table = load_mapping(text, source)
    arguments, left = namespace_arguments(table)
    try:
        read = read_arguments(argument_lines(arguments), source, base)
    except SpecError as error:  # name the stored key, not the flag it stands for
        keys = {flag: key for key, (flag, _) in DESTS.items()}
        raise SpecError([Problem(_stored_path(problem.path, keys), problem.message)
                         for problem in error.problems], source) from None
    settings = dict(read.settings)
    world = table.get("world_size")
    if world is not None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise SpecError([Problem("$.world_size", f"expected an integer >= 1, got "
                                                     f"{world!r}")], source)
        settings["hardware.num_gpus"] = world
        left.remove("world_size")
    notes = [*read.notes]
    if left:
        notes.append(f"{len(left)} stored arguments llmpar does not model were ignored "
                     f"(such as {', '.join(left[:5])})")
    return ReadSettings(settings=settings, owned=read.owned, notes=tuple(notes))
