"""`[search]`: what `llmpar search` ranks layouts by, and which layouts it may try.

The spec's `[parallel.*]` tables pin what they state; `[search]` narrows the rest.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import Bytes
from llmpar.spec.validators import FieldError
from llmpar.spec.workload import RECOMPUTE

OBJECTIVES = ("step_time", "tokens_per_second_per_gpu", "cost", "memory")
"""step_time: seconds per optimizer step (lower is better); tokens_per_second_per_gpu
(higher); cost: dollars per million tokens at `[hardware] gpu_hour_cost`; memory:
bytes on the busiest GPU."""


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


@attrs.frozen(kw_only=True)
class Search:
    """`[search]`: the objective, how many layouts to return, and limits on the space."""

    objective: str = attrs.field(default="step_time", validator=v.one_of(*OBJECTIVES))
    """What ranks layouts: step_time, tokens_per_second_per_gpu, cost or memory."""
    top: int = attrs.field(default=10, validator=v.positive)
    """How many ranked layouts to return."""
    tensor_within_node: bool = False
    """Keep each tensor group inside one node: the tensor degree divides gpus_per_node
    (Megatron-LM's practice, Narayanan et al. 2021, arXiv:2104.04473, Sec. 3.3)."""
    max_degrees: dict[str, int] = attrs.field(factory=dict, hash=False,
                                              validator=_degree_limits)
    """Upper limits by strategy, e.g. {pipeline = 16}."""
    micro_batch_sizes: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8),
                                                     validator=_positive_integers)
    """Micro-batch sizes to try (`[training] micro_batch_size` is not a pin)."""
    recompute: tuple[str, ...] = attrs.field(default=RECOMPUTE, validator=_recompute_modes)
    """Recomputation modes to try (`[training] recompute` is not a pin)."""
    values: dict[str, tuple[Any, ...]] = attrs.field(factory=dict, hash=False,
                                                     validator=_value_lists)
    """Allowed values by dimension, e.g. {"data.zero" = [1, 2], "sequence" = [true]};
    `llmpar search --dimensions` lists the keys."""
    memory_limit_bytes: Bytes | None = attrs.field(default=None, validator=v.positive)
    """Layouts must fit under this per GPU. Default: the GPU's memory."""
