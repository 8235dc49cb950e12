"""Activation models (kept for imports): see llmpar.footprint.activations."""

from llmpar.footprint.activations import (
    ACTIVATION_MODELS,
    ActivationModel,
    ActivationUnavailable,
    coefficient,
    fused,
    hf_eager,
    hf_sdpa,
    korthikanti,
)
from llmpar.footprint.activations.common import LOSS_BYTES, MASK_BYTES, TOKEN_ID_BYTES

__all__ = ["ACTIVATION_MODELS", "LOSS_BYTES", "MASK_BYTES", "TOKEN_ID_BYTES", "ActivationModel",
           "ActivationUnavailable", "coefficient", "fused", "hf_eager", "hf_sdpa", "korthikanti"]
