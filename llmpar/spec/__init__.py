"""Spec types: frozen attrs classes for everything a user varies."""

from llmpar.spec.finetune import Finetune
from llmpar.spec.hardware import Gpu, Hardware
from llmpar.spec.inference import Inference
from llmpar.spec.model import Model, MoE
from llmpar.spec.optimizer import Optimizer, OptimizerState
from llmpar.spec.spec import SCHEMA_VERSION, Spec
from llmpar.spec.workload import Precision, Training

__all__ = [
    "SCHEMA_VERSION",
    "Finetune",
    "Gpu",
    "Hardware",
    "Inference",
    "Model",
    "MoE",
    "Optimizer",
    "OptimizerState",
    "Precision",
    "Spec",
    "Training",
]
