"""`[search]`: what `llmpar search` ranks layouts by, and which layouts it may try.

The spec's `[parallel.*]` tables pin what they state; `[search]` narrows the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NewType

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import Bytes, Seconds
from llmpar.spec.validators import FieldError
from llmpar.spec.workload import RECOMPUTE

OBJECTIVES = ("step_time", "tokens_per_second_per_gpu", "cost", "memory", "gpus")
"""step_time: seconds per optimizer step (lower is better); tokens_per_second_per_gpu
(higher); cost: dollars per million tokens at `[hardware] gpu_hour_cost`; memory:
bytes on the busiest GPU; gpus: the fewest GPUs (of `[search] num_gpus`), ties broken by
step time."""

PERCENTILES = ("mean", "p90", "p99")
"""Which time to first token `[search] ttft_seconds_max` limits (serving specs)."""

MAX_LAYOUTS = 5_000_000
"""Default `[search] max_layouts`: about 15 s of search in one process (the largest
benchmark space, DeepSeek-V3 on 2048 H800, holds 1.3 million layouts)."""
MAX_DEGREE_COMBINATIONS = 20_000
"""Default `[search] max_degree_combinations` (the largest benchmark space has 3,276;
a million GPUs, 2**20, split into 1,771 for a dense model)."""


GpuCounts = NewType("GpuCounts", tuple[int, ...])
"""Candidate GPU counts: a TOML array of integers, or a range table
`{ min = 8, max = 64, step = 8 }` (every count from min to max in steps of step,
default 1)."""

MAX_GPU_COUNTS = 1024
"""The most GPU counts `[search] num_gpus` may list: each is a search of its own."""
RANGE_KEYS = ("min", "max", "step")


def gpu_counts(value: Any, integer: Any) -> tuple[int, ...]:
    """The counts an array or a range table names, ascending and without repeats
    (`integer` structures one integer strictly); ValueError when it is neither."""
    if isinstance(value, Mapping):
        unknown = [key for key in value if key not in RANGE_KEYS]
        if unknown or "min" not in value or "max" not in value:
            raise ValueError(f"a range is {{ min = N, max = M, step = S }} (step optional), "
                             f"got {dict(value)!r}")
        low, high = integer(value["min"]), integer(value["max"])
        step = integer(value.get("step", 1))
        if low < 1 or high < low or step < 1:
            raise ValueError(f"a range needs 1 <= min <= max and step >= 1, got "
                             f"{dict(value)!r}")
        if (high - low) // step + 1 > MAX_GPU_COUNTS:
            raise ValueError(f"the range holds {(high - low) // step + 1:,} counts, over the "
                             f"limit of {MAX_GPU_COUNTS:,}; take a larger step")
        return tuple(range(low, high + 1, step))
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"expected an array of GPU counts or a range table "
                         f"{{ min = N, max = M, step = S }}, got {value!r}")
    return tuple(sorted({integer(item) for item in value}))


def sorted_counts(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(sorted(set(value)))


def _gpu_count_list(_instance: Any, attribute: Any, value: tuple[int, ...] | None) -> None:
    if value is None:
        return
    if not value or any(item < 1 for item in value):
        raise FieldError(attribute.name, f"must list GPU counts >= 1, got {list(value)!r}")
    if len(value) > MAX_GPU_COUNTS:
        raise FieldError(attribute.name, f"lists {len(value):,} counts, over the limit of "
                                         f"{MAX_GPU_COUNTS:,}")


def _positive_integers(_instance: Any, attribute: Any, value: tuple[int, ...]) -> None:
    if not value or any(item < 1 for item in value):
        raise FieldError(attribute.name, f"must list integers >= 1, got {list(value)!r}")


def _recompute_modes(_instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    bad = [item for item in value if item not in RECOMPUTE]
    if not value or bad:
        raise FieldError(attribute.name, f"must list modes among {list(RECOMPUTE)!r}, got "
                                         f"{list(value)!r}")


def _degree_limits(_instance: Any, attribute: Any, value: dict[str, int]) -> None:
    bad = {name: limit for name, limit in value.items() if limit < 1}
    if bad:
        raise FieldError(attribute.name, f"limits must be >= 1, got {bad!r}")


def _value_lists(_instance: Any, attribute: Any, value: dict[str, tuple[Any, ...]]) -> None:
    empty = [key for key, items in value.items() if not items]
    if empty:
        raise FieldError(attribute.name, f"each key needs at least one value; empty: {empty!r}")


def _distinct_names(_instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        raise FieldError(attribute.name, f"lists {repeated!r} more than once")


def _prices(_instance: Any, attribute: Any, value: dict[str, float]) -> None:
    for name, price in value.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price > 0:
            raise FieldError(f"{attribute.name}.{name}",
                             f"must be dollars per GPU-hour > 0, got {price!r}")


@attrs.frozen(kw_only=True)
class Search:
    """`[search]`: the objective, how many layouts to return, and limits on the space."""

    objective: str = attrs.field(default="step_time", validator=v.one_of(*OBJECTIVES))
    """What ranks layouts: step_time, tokens_per_second_per_gpu, cost, memory or gpus (the
    fewest GPUs of `num_gpus`, ties broken by step time; for serving, by TPOT)."""
    top: int = attrs.field(default=10, validator=v.positive)
    """How many ranked layouts to return."""
    tensor_within_node: bool = False
    """Keep each tensor group inside one node: the tensor degree divides gpus_per_node
    (Megatron-LM's practice, Narayanan et al. 2021, arXiv:2104.04473, Sec. 3.3)."""
    max_degrees: dict[str, int] = attrs.field(factory=dict, hash=False,
                                              validator=_degree_limits)
    """Upper limits by strategy whose degree the search varies, e.g. {pipeline = 16}."""
    micro_batch_sizes: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8),
                                                     validator=_positive_integers)
    """Micro-batch sizes to try (`[training] micro_batch_size` is not a pin)."""
    recompute: tuple[str, ...] = attrs.field(default=RECOMPUTE, validator=_recompute_modes)
    """Recomputation modes to try (`[training] recompute` is not a pin)."""
    values: dict[str, tuple[Any, ...]] = attrs.field(factory=dict, hash=False,
                                                     validator=_value_lists)
    """Allowed values by dimension, e.g. {"data.zero" = [1, 2], "sequence" = [true]};
    each key must name a dimension and each value be one its field takes;
    `llmpar search SPEC --dimensions` lists the keys and the values they take."""
    memory_limit_bytes: Bytes | None = attrs.field(default=None, validator=v.positive)
    """Layouts must fit under this per GPU: a training layout's device memory at its step's
    peak (`training.memory_peak.device_bytes`, as `fits` decides). Default: the GPU's
    memory (`capacity_bytes`)."""
    max_layouts: int = attrs.field(default=MAX_LAYOUTS, validator=v.positive)
    """The most layouts a search considers (5 million by default, about 15 s in one
    process); a larger space is a SpecError that gives its size and what narrows it."""
    max_degree_combinations: int = attrs.field(default=MAX_DEGREE_COMBINATIONS,
                                               validator=v.positive)
    """The most combinations of degrees a search lays out (20,000 by default); each
    holds one or more layouts. A larger split of the GPU count is a SpecError that gives
    the count and what narrows it."""
    ttft_seconds_max: Seconds | None = attrs.field(default=None, validator=v.positive)
    """Serving specs: layouts must reach the first token within this (the mean, or the
    `percentile`; continuous batching's TTFT when the spec has a concurrency or a rate)."""
    tpot_seconds_max: Seconds | None = attrs.field(default=None, validator=v.positive)
    """Serving specs: layouts must keep the time per output token within this."""
    percentile: str = attrs.field(default="mean", validator=v.one_of(*PERCENTILES))
    """Which TTFT ttft_seconds_max limits under a request rate: "mean", "p90" or "p99"."""
    num_gpus: GpuCounts | None = attrs.field(default=None, converter=sorted_counts,
                                             validator=_gpu_count_list)
    """Cluster sizes to try, as an array (`[8, 16, 32]`) or a range table (`{ min = 1,
    max = 16 }`, with an optional `step`); each count is searched as `[hardware]
    num_gpus` (the default: that count alone), at most 1,024 counts. With the `gpus`
    objective the answer is the fewest GPUs whose layout fits and meets the limits."""
    train_seconds_max: Seconds | None = attrs.field(default=None, validator=v.positive)
    """Training specs: a deadline. Layouts must finish the run (`[training] tokens` or
    `tokens_per_parameter`) within this, e.g. "14 d"."""
    tokens_per_second_min: float | None = attrs.field(default=None, validator=v.positive)
    """Training specs: layouts must train at least this many tokens per second over the
    whole cluster."""
    hardware: tuple[str, ...] = attrs.field(default=(), validator=_distinct_names)
    """Machines to compare, each searched as the spec would be on it: cluster presets
    ("dgx-h100") or GPU presets ("h100-sxm"); the result gives the best layout on each
    and the best overall (training or serving). A cluster replaces the spec's machine (GPU,
    nodes, links), keeping its `num_gpus`, `memory_headroom_bytes` and
    `collective_algorithms`; a GPU replaces the GPU alone, in the spec's nodes and
    network. Empty: the spec's own hardware only."""
    gpu_hour_costs: dict[str, float] = attrs.field(factory=dict, hash=False,
                                                   validator=_prices)
    """Dollars per GPU-hour by `hardware` entry, e.g. {"dgx-h100" = 2.5}: the cost of each
    entry's best layout, and what the `cost` objective needs for every entry. The spec's
    `[hardware] gpu_hour_cost` prices the entry that names the spec's own GPU or
    cluster."""
