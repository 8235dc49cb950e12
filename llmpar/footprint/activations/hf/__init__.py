"""Hugging Face transformers' saved tensors, mechanism by mechanism."""

from llmpar.footprint.activations.hf.family import FAMILIES, Family, family_of
from llmpar.footprint.activations.hf.model import hf_eager, hf_inventory, hf_sdpa
from llmpar.footprint.activations.hf.run import Dropout, HfRun, dropout_from_hf_config

__all__ = ["FAMILIES", "Dropout", "Family", "HfRun", "dropout_from_hf_config", "family_of",
           "hf_eager", "hf_inventory", "hf_sdpa"]
