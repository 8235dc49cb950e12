"""What several launch targets compute the same way: the batch, the run length, the
launcher line, and arguments written one per line."""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.footprint.parameters import count_parameters
from llmpar.spec import Spec
from llmpar.strategy import Layout

Argument = tuple[str, str | tuple[str, ...] | None]
"""A command-line flag and its value: None for a switch, a tuple for several values
(`nargs='+'`), each its own word."""


def _words(flag: str, value: str | tuple[str, ...] | None) -> str:
    if value is None:
        return flag
    values = (value,) if isinstance(value, str) else value
    return " ".join([flag, *(shlex.quote(v) for v in values)])


def training_only(spec: Spec, target: str) -> None:
    """A training target given a serving spec is an error, not a training launch."""
    if spec.inference is not None:
        raise SpecError([Problem("$.inference", f"{target} launches training runs; this "
                                                "spec is a serving workload")], spec.source)


def global_batch(spec: Spec, layout: Layout) -> int:
    """Sequences per optimizer step: the spec's, or one micro-batch per data replica
    (`Training.global_batch_size`'s default)."""
    training = spec.training
    if training.global_batch_size is not None:
        return training.global_batch_size
    return training.micro_batch_size * layout.degree("data")


def accumulation_steps(spec: Spec, layout: Layout) -> int:
    """Micro-batches per step on each replica (`strategies.common.micro_batches_per_step`)."""
    return max(1, global_batch(spec, layout) // (spec.training.micro_batch_size
                                                 * layout.degree("data")))


def run_tokens(spec: Spec) -> float | None:
    """Tokens of the whole run: `tokens`, or `tokens_per_parameter` x parameters."""
    training = spec.training
    if training.tokens is not None:
        return float(training.tokens)
    if training.tokens_per_parameter is not None:
        return training.tokens_per_parameter * count_parameters(spec.model).total
    return None


def steps_of(spec: Spec, layout: Layout) -> int | None:
    """Optimizer steps of the run: its tokens over the tokens per step, rounded up (the
    last step is a whole one)."""
    tokens = run_tokens(spec)
    if tokens is None:
        return None
    return math.ceil(tokens / (global_batch(spec, layout) * spec.training.sequence_length))


def torchrun(spec: Spec, script: str) -> str:
    """`torchrun` for the spec's GPUs: a process per GPU of a node, one launch per node
    (each node gives its own --node-rank; --rdzv-endpoint is the cluster's)."""
    hardware = spec.hardware
    per_node = min(hardware.gpus_per_node, hardware.num_gpus)
    nodes = hardware.num_nodes
    words = ["torchrun", f"--nproc-per-node={per_node}", f"--nnodes={nodes}"]
    if nodes > 1:
        words += ["--node-rank=$NODE_RANK", "--rdzv-backend=c10d",
                  "--rdzv-endpoint=$MASTER_ADDR:29500"]
    return " ".join(words) + f" {script}"


def argument_lines(arguments: Sequence[Argument]) -> str:
    """One flag (and its value) per line, the form `llmpar import` reads back."""
    return "".join(f"{_words(flag, value)}\n" for flag, value in arguments)


def command_line(launcher: str, arguments: Sequence[Argument]) -> str:
    """The launcher with the arguments, one per continued line."""
    lines = [launcher] + [_words(flag, value) for flag, value in arguments]
    return " \\\n    ".join(lines)


def number_or_text(text: str) -> Any:
    """A configuration value as text: an integer, else a float, where it reads as one;
    else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
