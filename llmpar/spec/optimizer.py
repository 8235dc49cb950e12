"""Optimizers, described by the per-parameter state they keep."""

from __future__ import annotations

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.spec import validators as v


@attrs.frozen(kw_only=True)
class OptimizerState:
    """One tensor the optimizer keeps per parameter."""

    name: str
    """What it holds, e.g. "momentum"."""
    dtype: str = attrs.field(default="fp32", validator=v.dtype)
    master: bool = False
    """A high-precision copy of the weights: kept only when the weights are
    stored in a narrower format than this state (mixed-precision training)."""


@attrs.frozen(kw_only=True)
class Optimizer:
    """An optimizer's memory: the states it keeps for every trainable parameter."""

    name: str = "custom"
    source: str = ""
    states: tuple[OptimizerState, ...] = ()

    def kept_states(self, weights_dtype: str) -> tuple[OptimizerState, ...]:
        """States present when weights are stored as `weights_dtype`."""
        weight_size = bytes_per_element(weights_dtype)
        return tuple(
            state
            for state in self.states
            if not (state.master and bytes_per_element(state.dtype) <= weight_size)
        )

    def bytes_per_parameter(self, weights_dtype: str) -> float:
        """Optimizer-state bytes per parameter (mixed-precision Adam: 4 + 4 + 4 = 12)."""
        return sum(bytes_per_element(s.dtype) for s in self.kept_states(weights_dtype))
