"""Goodput of a long run: the share of wall-clock time that advances training when the
job writes checkpoints and restarts from the last one after each interruption.

First-order model of Young (1974, "A first order approximation to the optimum
checkpoint interval", CACM 17(9), doi:10.1145/361147.361115): with a checkpoint that
stops training for d seconds every tau seconds of training, and interruptions M seconds
apart on average, each interruption costs the restart R, reading the checkpoint back r,
and on average half a cycle of lost work (tau + d) / 2; the optimum interval is
tau = sqrt(2 d M). Accurate while tau + d is small against M (Daly 2006,
doi:10.1016/j.future.2004.11.016, gives the higher-order terms).
"""

from __future__ import annotations

import math

from llmpar.evaluation.memory import bytes_per_parameter
from llmpar.footprint.baseline import Footprint
from llmpar.plan import Derivation
from llmpar.plan_records import RunGoodput, StageMemory
from llmpar.spec import Spec
from llmpar.spec.workload import Goodput

SECONDS_PER_DAY = 86_400.0
YOUNG_SOURCE = "Young 1974 (CACM 17(9), doi:10.1145/361147.361115), first order"


def checkpoint_bytes(spec: Spec, footprint: Footprint) -> float:
    """Every weight in its storage format plus the optimizer's states of every trainable
    parameter: what a run needs to resume (gradients are recomputed)."""
    per_parameter = bytes_per_parameter(spec)
    trainable = sum(footprint.trainable_by_group.values())
    return (footprint.parameters.total * per_parameter["weights"]
            + trainable * per_parameter["optimizer"])


def blocking_seconds(spec: Spec, goodput: Goodput, write_seconds: float,
                     peak: StageMemory) -> float:
    """How long training stops per checkpoint: the whole write, or for an asynchronous
    checkpoint the copy of one GPU's weights and optimizer states to host memory (the
    peak stage's, the slowest to copy), after which storage is written in the
    background."""
    host = spec.hardware.host_bandwidth_bytes_per_s
    if not goodput.asynchronous or host is None:  # the loader requires host for async
        return write_seconds
    return (peak.weights_bytes + peak.optimizer_bytes) / host


def run_goodput(spec: Spec, footprint: Footprint, peak: StageMemory,
                train_seconds: float | None) -> tuple[RunGoodput | None, tuple[Derivation, ...]]:
    """The run's goodput under `[training.goodput]` (None without that table)."""
    goodput = spec.training.goodput
    if goodput is None:
        return None, ()
    size = checkpoint_bytes(spec, footprint)
    write = size / goodput.storage_bandwidth_bytes_per_s
    stop = blocking_seconds(spec, goodput, write, peak)
    rate_per_second = goodput.interruptions_per_gpu_day * spec.hardware.num_gpus / SECONDS_PER_DAY
    between = 1.0 / rate_per_second if rate_per_second > 0 else None
    interval: float | None = goodput.checkpoint_interval_seconds
    if interval is None and between is not None:
        interval = math.sqrt(2.0 * stop * between)
    if interval is not None and goodput.asynchronous:
        interval = max(interval, write)  # a background write must end before the next
    cycle = 0.0 if interval is None else interval + stop
    lost = goodput.restart_seconds + write + cycle / 2.0
    checkpointing = 1.0 if interval is None else interval / cycle
    fraction = max(0.0, checkpointing * (1.0 - (0.0 if between is None else lost / between)))
    wall = None if train_seconds is None or fraction == 0.0 else train_seconds / fraction
    record = RunGoodput(
        checkpoint_bytes=size, checkpoint_write_seconds=write, checkpoint_blocking_seconds=stop,
        checkpoint_interval_seconds=interval, seconds_between_interruptions=between,
        lost_seconds_per_interruption=lost, goodput_fraction=fraction,
        interruptions=None if wall is None or between is None else wall / between,
        wall_seconds=wall)
    return record, _derivations(spec, goodput, record)


def _derivations(spec: Spec, goodput: Goodput, record: RunGoodput) -> tuple[Derivation, ...]:
    interval_rule = ("[training.goodput] checkpoint_interval_seconds"
                     if goodput.checkpoint_interval_seconds is not None
                     else "sqrt(2 * d * M), Young's optimum")
    found = [
        Derivation(quantity="checkpoint_bytes", value=record.checkpoint_bytes, unit="B",
                   rule="N * weight bytes + N_trainable * optimizer bytes per parameter",
                   source="what a run needs to resume; gradients are not saved",
                   inputs={"storage_bandwidth_bytes_per_s":
                           goodput.storage_bandwidth_bytes_per_s}),
        Derivation(quantity="goodput_fraction", value=record.goodput_fraction, unit="",
                   rule="tau / (tau + d) * (1 - (R + r + (tau + d) / 2) / M)",
                   source=YOUNG_SOURCE + f"; tau from {interval_rule}; M = 1 / "
                   "(interruptions_per_gpu_day * num_gpus)",
                   inputs={"tau": record.checkpoint_interval_seconds or 0.0,
                           "d": record.checkpoint_blocking_seconds,
                           "r": record.checkpoint_write_seconds,
                           "R": goodput.restart_seconds,
                           "M": record.seconds_between_interruptions or "none expected",
                           "interruptions_per_gpu_day": goodput.interruptions_per_gpu_day,
                           "num_gpus": spec.hardware.num_gpus})]
    if record.wall_seconds is not None:
        found.append(Derivation(
            quantity="wall_seconds", value=record.wall_seconds, unit="s",
            rule="train_seconds / goodput_fraction",
            source="the run's steps with its checkpoints and restarts",
            inputs={"goodput_fraction": record.goodput_fraction}))
    return tuple(found)
