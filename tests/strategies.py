"""Hypothesis strategies for valid specs: llmpar's public ones (`llmpar.testing`)."""

from llmpar.testing.specs import (
    GPUS,
    architectures,
    moe_architectures,
    parallel_training_specs,
    training_specs,
)

__all__ = ["GPUS", "architectures", "moe_architectures", "parallel_training_specs",
           "training_specs"]
