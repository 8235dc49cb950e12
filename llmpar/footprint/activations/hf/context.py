"""The sizes, implementation and family one Hugging Face inventory is built for."""

from __future__ import annotations

import attrs

from llmpar.footprint.activations.common import FP32_BYTES, Sizes, saved
from llmpar.footprint.activations.hf.family import Family
from llmpar.footprint.activations.hf.run import HfRun
from llmpar.footprint.inventory import SavedTensor
from llmpar.spec.model import Model

MEASURED = ("measured with torch 2.13.0 (CPU) and transformers 5.24.0, "
            "validation/data/*.json")
"""The source of every mechanism this package models: the modeling code of transformers
5.24.0 as autograd saves it under torch 2.13.0 on the CPU, checked tensor by tensor
against the inventories in validation/data."""


@attrs.frozen(kw_only=True)
class Context:
    """Everything a part of the model needs to list what it keeps."""

    sizes: Sizes
    model: Model
    run: HfRun
    family: Family

    @property
    def d(self) -> float:
        """Bytes per element of the activations."""
        return self.sizes.d

    @property
    def batch(self) -> int:
        return self.sizes.b[1]

    @property
    def sequence(self) -> int:
        return self.sizes.s[1]

    @property
    def upcast(self) -> bool:
        """Whether .float() / .to(float32) copies (False when activations are fp32)."""
        return self.d != FP32_BYTES

    def per_token(self, name: str, reason: str, symbol: str, width: int, size: float,
                  splits: frozenset[str], weights: frozenset[str] = frozenset(),
                  weights_only: bool = False) -> SavedTensor:
        """A b x s x `symbol` tensor of `size` bytes per element (`weights`: the weights
        whose products take it as input, `SavedTensor.weights`)."""
        return saved(name, reason, self.sizes.per_token(symbol, width), size, splits,
                     weights=weights, weights_only=weights_only)
