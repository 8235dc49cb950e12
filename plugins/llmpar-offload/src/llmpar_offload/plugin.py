"""The plugin module the `llmpar` entry point names: it hands over the strategy and the
settings the layout search may vary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmpar import Point, SearchDimension, Strategy, hookimpl

from llmpar_offload.strategy import OffloadStrategy


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(OffloadStrategy())


def _optimizer(point: Point) -> tuple[bool, ...]:
    """Offloading is searched when the spec has a `[parallel.offload]` table (its keys
    pin what they say); without one, nothing is offloaded."""
    return (False, True) if "offload" in point.spec.parallel else (False,)


def _gradients(point: Point) -> tuple[bool, ...]:
    """ZeRO-Offload moves the gradients with the optimizer states (Sec. 4.1)."""
    return (bool(point.fields.get("optimizer")),)


def _weights(point: Point) -> tuple[bool, ...]:
    """Weights on the host (ZeRO-Infinity) only beside the optimizer states, and under
    ZeRO-3 (DeepSpeed's offload_param): the search sees the ZeRO stage it chose."""
    data = point.spec.parallel.get("data")
    zero3 = point.choices.get("data.zero", getattr(data, "zero", 0)) == 3 or bool(
        getattr(data, "fsdp", False))
    return (False, True) if point.fields.get("optimizer") and zero3 else (False,)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="offload", field="optimizer", values=_optimizer,
                             description="optimizer states in host memory (ZeRO-Offload), "
                                         "when the spec has a [parallel.offload] table"))
    register(SearchDimension(strategy="offload", field="gradients", values=_gradients,
                             description="gradients go with the optimizer states"))
    register(SearchDimension(strategy="offload", field="weights", values=_weights,
                             sees=("data.zero",),
                             description="weights streamed from host memory too "
                                         "(ZeRO-Infinity), under ZeRO-3"))
