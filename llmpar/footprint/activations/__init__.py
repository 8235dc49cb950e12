"""Activation models: how many bytes each layer keeps for backward.

Each model builds an `ActivationInventory` for one micro-batch of one unsplit replica;
strategies and recomputation then transform it. Select one with
`[training] activation_model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llmpar.footprint.activations.coefficient import coefficient
from llmpar.footprint.activations.common import ActivationModel, ActivationUnavailable
from llmpar.footprint.activations.fused import fused
from llmpar.footprint.activations.hf import hf_eager, hf_sdpa
from llmpar.footprint.activations.korthikanti import korthikanti

ACTIVATION_MODELS: Mapping[str, ActivationModel] = MappingProxyType({
    "coefficient": coefficient,
    "korthikanti": korthikanti,
    "hf-eager": hf_eager,
    "hf-sdpa": hf_sdpa,
    "fused": fused,
})
"""Built-in activation models by `[training] activation_model` name."""

__all__ = ["ACTIVATION_MODELS", "ActivationModel", "ActivationUnavailable", "coefficient",
           "fused", "hf_eager", "hf_sdpa", "korthikanti"]
