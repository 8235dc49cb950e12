"""What a well-formed transform looks like: checked on every transform before the
evaluator composes it, so that a plugin's mistake is named instead of planned."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmpar.loading.limits import MAX_STAGES
from llmpar.spec import Spec
from llmpar.strategy import Transform

PLAIN = frozenset((int, float))
"""The types of a plain number (not bool, not numpy's)."""


def bad_number(value: Any, *, at_least: float = 0.0, at_most: float | None = None) -> bool:
    """Not a finite number (or array of them) within [at_least, at_most]."""
    if isinstance(value, (int, float)):  # bool too: 0 or 1
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer beyond any float
            return True
        return not (finite and value >= at_least and (at_most is None or value <= at_most))
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biuf":
        array = np.asarray(value, dtype=float)
        return not bool(np.all(np.isfinite(array)) and np.all(array >= at_least)
                        and (at_most is None or np.all(array <= at_most)))
    return True


def _plainly_fine(transform: Transform, name: str) -> bool:
    """The common case, quickly: every number plain, >= 0 (divisors >= 1, overlaps <= 1)
    and finite (a sum of non-negative numbers is finite only when each is)."""
    sizes = [transform.extra_flops_per_step, transform.skipped_flops_per_step,
             transform.bubble_fraction, transform.buffer_bytes, transform.added_activation_bytes,
             transform.busiest_rank_extra_work, transform.model_flops_per_step]
    sizes += [w.bytes_per_parameter for w in transform.frozen_weights]
    ones = [s.divisor for s in transform.shards] + [c.copies for c in transform.copies]
    ones += [s.divisor for s in transform.activation_splits]
    shares: list[Any] = []
    for c in transform.collectives:
        if c.strategy != name or c.bytes_per_parameter is not None and c.component is None:
            return False
        sizes += (c.buffer_bytes, c.calls_per_step, c.serial_seconds_per_call)
        shares += (c.overlap, c.compute_share)
        if c.bytes_per_parameter is not None:
            sizes.append(c.bytes_per_parameter)
    for w in transform.host_work:
        if w.strategy != name:
            return False
        sizes += (w.seconds_per_parameter, w.passes_per_step)
        shares.append(w.overlap)
    numbers = sizes + ones + shares
    if not PLAIN.issuperset(map(type, numbers)):
        return False
    try:
        return (min(sizes, default=0) >= 0 and min(ones, default=1) >= 1
                and min(shares, default=0) >= 0 and max(shares, default=0) <= 1
                and math.isfinite(math.fsum(numbers)))
    except OverflowError:
        return False


def transform_problems(transform: Any, name: str, spec: Spec) -> list[str]:
    """What is wrong with a strategy's transform, in words (empty when nothing)."""
    if not isinstance(transform, Transform):
        return [f"transform() returned {type(transform).__name__}, not Transform"]
    if transform.strategy == name and _plainly_fine(transform, name):
        return _collective_groups(transform, spec.hardware.num_gpus) + _stage_problems(
            transform, spec) + _micro_batch_problems(transform)
    problems = []
    if transform.strategy != name:
        problems.append(f"Transform.strategy is {transform.strategy!r}, not {name!r}")
    problems += [f"shard {s.component} divisor {s.divisor!r} is not a finite number >= 1"
                 for s in transform.shards if bad_number(s.divisor, at_least=1)]
    problems += [f"copies of {c.component} {c.copies!r} is not a finite number >= 1"
                 for c in transform.copies if bad_number(c.copies, at_least=1)]
    problems += [f"activation split {s.tag} divisor {s.divisor!r} is not a finite number >= 1"
                 for s in transform.activation_splits if bad_number(s.divisor, at_least=1)]
    problems += _collective_problems(transform, name, spec.hardware.num_gpus)
    for label in ("extra_flops_per_step", "skipped_flops_per_step", "bubble_fraction",
                  "buffer_bytes", "added_activation_bytes", "busiest_rank_extra_work",
                  "model_flops_per_step"):
        if bad_number(getattr(transform, label)):
            problems.append(f"{label} {getattr(transform, label)!r} is not a finite number >= 0")
    problems += [f"frozen weights {w.name!r}: bytes_per_parameter {w.bytes_per_parameter!r} "
                 "is not a finite number >= 0" for w in transform.frozen_weights
                 if bad_number(w.bytes_per_parameter)]
    problems += _micro_batch_problems(transform)
    problems += _stage_problems(transform, spec)
    problems += _host_problems(transform, name)
    return problems


def _micro_batch_problems(transform: Transform) -> list[str]:
    m = transform.micro_batches_per_step
    if m is not None and bad_number(m, at_least=1):
        return [f"micro_batches_per_step {m!r} is not a number >= 1"]
    return []


def _collective_groups(transform: Transform, n: int) -> list[str]:
    problems = []
    for c in transform.collectives:
        # The ranks split into groups, except for a send-recv: a pair of neighbours
        # (two of a pipeline's three stages) need not tile the GPUs.
        tiles = c.operation == "send-recv" or (isinstance(c.group_size, int)
                                                and c.group_size >= 1 and n % c.group_size == 0)
        if not isinstance(c.group_size, int) or c.group_size < 1 or not tiles:
            problems.append(f"collective {c.name!r}: group_size {c.group_size!r} does not "
                            f"divide num_gpus ({n})")
        elif not isinstance(c.group_stride, int) or c.group_stride < 1 or (
                c.group_size * c.group_stride > n):
            problems.append(f"collective {c.name!r}: group_size x group_stride "
                            f"({c.group_size} x {c.group_stride}) exceeds num_gpus ({n})")
    return problems


def _collective_problems(transform: Transform, name: str, n: int) -> list[str]:
    problems = []
    for c in transform.collectives:
        if c.strategy != name:
            problems.append(f"collective {c.name!r} says it is {c.strategy!r}'s")
        if bad_number(c.buffer_bytes) or bad_number(c.calls_per_step):
            problems.append(f"collective {c.name!r}: buffer_bytes {c.buffer_bytes!r}, "
                            f"calls_per_step {c.calls_per_step!r}")
        if c.bytes_per_parameter is not None and (bad_number(c.bytes_per_parameter)
                                                  or c.component is None):
            problems.append(f"collective {c.name!r}: bytes_per_parameter "
                            f"{c.bytes_per_parameter!r} needs a component and a number >= 0")
        if bad_number(c.serial_seconds_per_call):
            problems.append(f"collective {c.name!r}: serial_seconds_per_call "
                            f"{c.serial_seconds_per_call!r} is not a finite number >= 0")
        if bad_number(c.overlap, at_most=1):
            problems.append(f"collective {c.name!r}: overlap {c.overlap!r} outside [0, 1]")
    return problems + _collective_groups(transform, n)


def _stage_problems(transform: Transform, spec: Spec) -> list[str]:
    if not transform.stages:
        return []
    stages = transform.stages
    if len(stages) > MAX_STAGES:
        return [f"{len(stages):,} stages; a plan lists at most {MAX_STAGES:,}"]
    problems = []
    if [s.index for s in stages] != list(range(len(stages))):
        problems.append(f"stage indices {[s.index for s in stages]} are not 0..{len(stages) - 1}")
    held = [stage.micro_batches_in_flight for stage in stages]
    try:  # plain, >= 0 and finite each (a sum of non-negative numbers is finite only then)
        plain = (PLAIN.issuperset(map(type, held)) and min(held) >= 0
                 and math.isfinite(math.fsum(held)))
    except OverflowError:  # an integer beyond any float: each one is checked below
        plain = False
    first = 0
    for stage in stages:
        if stage.first_layer != first or stage.num_layers < 1:
            problems.append(f"stage {stage.index} starts at layer {stage.first_layer} with "
                            f"{stage.num_layers} layers; expected to start at {first}")
        if not plain and bad_number(stage.micro_batches_in_flight):
            problems.append(f"stage {stage.index}: micro_batches_in_flight "
                            f"{stage.micro_batches_in_flight!r}")
        first = stage.first_layer + stage.num_layers
    layers = spec.model.num_layers
    if layers and first != layers:
        problems.append(f"stages cover {first} layers, the model has {layers}")
    return problems


def _host_problems(transform: Transform, name: str) -> list[str]:
    problems = []
    for work in transform.host_work:
        if work.strategy != name:
            problems.append(f"host work {work.name!r} says it is {work.strategy!r}'s")
        for label in ("seconds_per_parameter", "passes_per_step"):
            if bad_number(getattr(work, label)):
                problems.append(f"host work {work.name!r}: {label} "
                                f"{getattr(work, label)!r} is not a finite number >= 0")
        if bad_number(work.overlap, at_most=1):
            problems.append(f"host work {work.name!r}: overlap {work.overlap!r} outside [0, 1]")
    return problems
