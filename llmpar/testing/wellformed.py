"""What a well-formed transform and plan look like: the rules of the contract suite's
"well-formed-transform" check, usable on their own."""

from __future__ import annotations

import math
from typing import Any

from llmpar.plan import Plan
from llmpar.spec import Spec
from llmpar.strategy import Transform

PLAN_NUMBERS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                "buffers_bytes", "total_bytes", "host_bytes", "flops_per_step",
                "hardware_flops_per_step", "step_seconds", "communication_seconds",
                "exposed_communication_seconds", "bubble_fraction", "bubble_seconds",
                "optimizer_seconds", "offload_seconds", "exposed_offload_seconds")


def _bad(value: Any, *, at_least: float = 0.0) -> bool:
    return not isinstance(value, (int, float)) or not math.isfinite(value) or value < at_least


def transform_problems(transform: Any, name: str, spec: Spec) -> list[str]:
    """What is wrong with a strategy's transform, in words (empty when nothing)."""
    if not isinstance(transform, Transform):
        return [f"transform() returned {type(transform).__name__}, not Transform"]
    n = spec.hardware.num_gpus
    problems = []
    if transform.strategy != name:
        problems.append(f"Transform.strategy is {transform.strategy!r}, not {name!r}")
    problems += [f"shard {s.component} divisor {s.divisor!r} < 1" for s in transform.shards
                 if _bad(s.divisor, at_least=1)]
    problems += [f"activation split {s.tag} divisor {s.divisor!r} < 1"
                 for s in transform.activation_splits if _bad(s.divisor, at_least=1)]
    for c in transform.collectives:
        if c.strategy != name:
            problems.append(f"collective {c.name!r} says it is {c.strategy!r}'s")
        if _bad(c.buffer_bytes) or _bad(c.calls_per_step):
            problems.append(f"collective {c.name!r}: buffer_bytes {c.buffer_bytes!r}, "
                            f"calls_per_step {c.calls_per_step!r}")
        if not isinstance(c.group_size, int) or c.group_size < 1 or n % c.group_size:
            problems.append(f"collective {c.name!r}: group_size {c.group_size!r} does not "
                            f"divide num_gpus ({n})")
        elif c.group_stride < 1 or c.group_size * c.group_stride > n:
            problems.append(f"collective {c.name!r}: group_size x group_stride "
                            f"({c.group_size} x {c.group_stride}) exceeds num_gpus ({n})")
        if _bad(c.overlap) or c.overlap > 1:
            problems.append(f"collective {c.name!r}: overlap {c.overlap!r} outside [0, 1]")
    for label in ("extra_flops_per_step", "bubble_fraction", "buffer_bytes"):
        if _bad(getattr(transform, label)):
            problems.append(f"{label} {getattr(transform, label)!r} is not a finite number >= 0")
    m = transform.micro_batches_per_step
    if m is not None and (not isinstance(m, int) or m < 1):
        problems.append(f"micro_batches_per_step {m!r} < 1")
    problems += _stage_problems(transform, spec)
    problems += _offload_problems(transform, name)
    return problems


def _stage_problems(transform: Transform, spec: Spec) -> list[str]:
    if not transform.stages:
        return []
    stages = transform.stages
    problems = []
    if [s.index for s in stages] != list(range(len(stages))):
        problems.append(f"stage indices {[s.index for s in stages]} are not 0..{len(stages) - 1}")
    first = 0
    for stage in stages:
        if stage.first_layer != first or stage.num_layers < 1:
            problems.append(f"stage {stage.index} starts at layer {stage.first_layer} with "
                            f"{stage.num_layers} layers; expected to start at {first}")
        if _bad(stage.micro_batches_in_flight):
            problems.append(f"stage {stage.index}: micro_batches_in_flight "
                            f"{stage.micro_batches_in_flight!r}")
        first = stage.first_layer + stage.num_layers
    layers = spec.model.num_layers
    if layers and first != layers:
        problems.append(f"stages cover {first} layers, the model has {layers}")
    return problems


def _offload_problems(transform: Transform, name: str) -> list[str]:
    problems = []
    for work in transform.host_work:
        if work.strategy != name:
            problems.append(f"host work {work.name!r} says it is {work.strategy!r}'s")
        for label in ("seconds_per_parameter", "passes_per_step", "overlap"):
            if _bad(getattr(work, label)):
                problems.append(f"host work {work.name!r}: {label} "
                                f"{getattr(work, label)!r} is not a finite number >= 0")
        if work.overlap > 1:
            problems.append(f"host work {work.name!r}: overlap {work.overlap!r} > 1")
    return problems


def plan_problems(plan: Plan) -> list[str]:
    """Plan numbers that are negative or not finite."""
    problems = []
    for label in PLAN_NUMBERS:
        value = getattr(plan, label, None)
        if value is not None and _bad(value):
            problems.append(f"plan.{label} = {value!r}")
    return problems
