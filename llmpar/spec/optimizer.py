"""Optimizers, described by the per-parameter state they keep.

A state is a tensor the optimizer keeps for every trainable parameter. Three
refinements cover the optimizers that do not keep one full element per parameter:

- `block_size`: block-wise quantized states (8-bit Adam) also keep one scale per block;
- `factored`: Adafactor's factored second moment keeps r + c values per r x c matrix;
- `master`: the fp32 copy of 16-bit weights, absent when the weights are fp32 already.

An optimizer may also fix the format its gradients are accumulated in (`gradients`,
Megatron's fp32 main gradients), which then replaces `[precision] gradients`.
"""

from __future__ import annotations

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.spec import validators as v

FACTORED_NEGLIGIBLE_WIDTH = 2048
"""Matrix width at and above which a factored state is under 0.1% of a full one:
(r + c) / (r * c) = 2 / 2048 = 0.098% for a square 2048 x 2048 matrix."""


@attrs.frozen(kw_only=True)
class WeightShapes:
    """Trainable parameters as matrices and vectors, for factored states.

    `matrices` holds (rows, columns, how many) per kind of weight matrix;
    `vector_elements` counts biases, norm weights and other 1-D parameters.
    """

    matrices: tuple[tuple[int, int, int], ...] = ()
    vector_elements: int = 0

    @property
    def parameters(self) -> int:
        return sum(r * c * n for r, c, n in self.matrices) + self.vector_elements

    @property
    def factored_elements(self) -> int:
        """Elements of a factored state: r + c per matrix (Shazeer and Stern 2018,
        arXiv:1804.04235, Sec. 3: row sums R and column sums C of the second
        moment), and one per vector element (vectors are not factored)."""
        return sum((r + c) * n for r, c, n in self.matrices) + self.vector_elements

    def factored_fraction(self) -> float:
        """Elements of a factored state per parameter."""
        return self.factored_elements / self.parameters if self.parameters else 0.0


@attrs.frozen(kw_only=True)
class OptimizerState:
    """One tensor the optimizer keeps per parameter."""

    name: str
    """What it holds, e.g. "momentum"."""
    dtype: str = attrs.field(default="fp32", validator=v.dtype)
    """Format the state is kept in."""
    master: bool = False
    """A high-precision copy of the weights: kept only when the weights are
    stored in a narrower format than this state (mixed-precision training)."""
    block_size: int | None = attrs.field(default=None, validator=v.positive)
    """Block-wise quantization (Dettmers et al. 2022, arXiv:2110.02861, Sec. 2.1): every
    `block_size` elements share one absmax scale of `scale_dtype`. None: no blocks."""
    scale_dtype: str = attrs.field(default="fp32", validator=v.dtype)
    """Format of the per-block scale (used only with `block_size`)."""
    factored: bool = False
    """A factored second moment (Adafactor): r + c values per r x c weight matrix
    instead of r * c (Shazeer and Stern 2018, arXiv:1804.04235, Sec. 3)."""

    def bytes_per_element(self) -> float:
        """Bytes per element kept, with the block scales spread over their blocks."""
        size = bytes_per_element(self.dtype)
        if self.block_size is not None:
            size += bytes_per_element(self.scale_dtype) / self.block_size
        return size

    def bytes_per_parameter(self, shapes: WeightShapes | None = None) -> float:
        """Bytes per trainable parameter.

        A factored state keeps `shapes.factored_fraction()` elements per parameter;
        without `shapes` it counts as 0, an approximation that is under 0.1% of a full
        state when every matrix is at least FACTORED_NEGLIGIBLE_WIDTH wide.
        """
        if not self.factored:
            return self.bytes_per_element()
        fraction = shapes.factored_fraction() if shapes is not None else 0.0
        return self.bytes_per_element() * fraction


@attrs.frozen(kw_only=True, cache_hash=True)
class Optimizer:
    """An optimizer's memory: the states it keeps for every trainable parameter."""

    name: str = "custom"
    """Preset name or a label."""
    source: str = ""
    """Where its memory accounting comes from (paper, implementation)."""
    states: tuple[OptimizerState, ...] = ()
    """The tensors it keeps per trainable parameter."""
    gradients: str | None = attrs.field(default=None,
                                        validator=attrs.validators.optional(v.dtype))
    """The format gradients are accumulated in, when the optimizer fixes it (Megatron's
    fp32 main gradients); it replaces `[precision] gradients`. None: that format."""

    def kept_states(self, weights_dtype: str) -> tuple[OptimizerState, ...]:
        """States present when weights are stored as `weights_dtype`."""
        weight_size = bytes_per_element(weights_dtype)
        return tuple([
            state
            for state in self.states
            if not (state.master and bytes_per_element(state.dtype) <= weight_size)
        ])

    def bytes_per_parameter(self, weights_dtype: str,
                            shapes: WeightShapes | None = None) -> float:
        """Optimizer-state bytes per parameter (mixed-precision Adam: 4 + 4 + 4 = 12).

        `shapes` makes factored states exact (see `OptimizerState.bytes_per_parameter`).
        """
        return sum([s.bytes_per_parameter(shapes) for s in self.kept_states(weights_dtype)])

    def gradients_dtype(self, precision_gradients: str) -> str:
        """The gradients' format: this optimizer's own, else `[precision] gradients`."""
        return self.gradients if self.gradients is not None else precision_gradients

    def model_state_bytes_per_parameter(self, weights_dtype: str, precision_gradients: str,
                                        shapes: WeightShapes | None = None) -> float:
        """Weights + gradients + optimizer states per parameter (ZeRO, Rajbhandari et al.
        2020, arXiv:1910.02054, Sec. 3.1: 2 + 2 + K with K = 12 for mixed-precision Adam)."""
        return (bytes_per_element(weights_dtype)
                + bytes_per_element(self.gradients_dtype(precision_gradients))
                + self.bytes_per_parameter(weights_dtype, shapes))
