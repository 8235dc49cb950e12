"""Models from Hugging Face config.json files (read locally; nothing is downloaded).

    import llmpar
    model = llmpar.model_from_hf("config.json")
"""

from llmpar.hf.families import SUPPORTED_MODEL_TYPES
from llmpar.hf.importer import model_from_hf, model_table_from_hf
from llmpar.hf.output import model_toml

__all__ = ["SUPPORTED_MODEL_TYPES", "model_from_hf", "model_table_from_hf", "model_toml"]
