"""From a Hugging Face config.json to a model table and a `Model`. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.hf.common import mtp_note, mtp_table, rotary_fraction
from llmpar.hf.config import HfConfig, HfSource, missing_problems, read_config
from llmpar.hf.families import (
    FAMILIES,
    MULTIMODAL,
    SUPPORTED_MODEL_TYPES,
    TEXT_MODELS,
    UNSUPPORTED_MECHANISMS,
    VISION,
    Family,
)
from llmpar.loading.converter import make_converter, structure
from llmpar.spec import Model
from llmpar.spec.model import MLA, LinearAttention, Mamba, MoE, SparseAttention

KEPT_FLAGS = ("tie_embeddings",)
"""Flags a table states even at their default; the others only when they differ."""
NESTED = {"moe": MoE, "mla": MLA, "linear_attention": LinearAttention, "mamba": Mamba,
          "sparse_attention": SparseAttention}


def _language_model(config: HfConfig) -> tuple[HfConfig, str]:
    """The config of the language model, and a note for the source when it is nested."""
    text_type = MULTIMODAL.get(config.model_type)
    if text_type is None:
        return config, ""
    given = config.get("text_config")
    named = given.get("model_type") if isinstance(given, dict) else None
    allowed = TEXT_MODELS.get(config.model_type, (text_type,))
    if isinstance(named, str) and named in allowed:
        text_type = named  # Mistral 3: a mistral or a ministral3 language model
    elif named is not None:
        raise SpecError([Problem(f"{config.path('text_config')}.model_type",
                                 f"expected {' or '.join(repr(a) for a in allowed)} for "
                                 f"model_type {config.model_type!r}, got {named!r}")],
                        config.label)
    return (config.nested("text_config", text_type),
            "; its language model only (text_config), without the vision tower and its "
            "projector: multimodal towers are out of scope")


def _family(config: HfConfig) -> Family:
    family = FAMILIES.get(config.model_type)
    mechanism = UNSUPPORTED_MECHANISMS.get(config.model_type)
    if family is None and mechanism is None and isinstance(config.get("vision_config"), dict):
        mechanism = VISION
    if family is None and mechanism is not None:
        raise SpecError([Problem("$.model_type", f"model_type {config.model_type!r} is not "
                                 f"supported: llmpar does not model {mechanism}")],
                        config.label)
    if family is None:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise SpecError([Problem("$.model_type", f"unsupported model_type "
                                 f"{config.model_type!r}; supported: {supported}")],
                        config.label)
    return family


def _source(config: HfConfig, family: Family, note: str) -> str:
    where = f"config.json of {config.repo}" if config.repo else "a config.json"
    return (f"{where} (Hugging Face), counted as transformers' {family.hf_class}"
            f"{family.note}{note}")


def _clean(table: dict[str, Any], cls: type = Model) -> dict[str, Any]:
    """Without None values, and without flags at `cls`'s default (but KEPT_FLAGS)."""
    defaults = {field.name: field.default for field in attrs.fields(cls)}
    clean = {}
    for key, value in table.items():
        if isinstance(value, dict):
            value = _clean(value, NESTED[key])
        at_default = isinstance(value, bool) and defaults.get(key) is value
        if value is None or (at_default and key not in KEPT_FLAGS):
            continue
        clean[key] = value
    return clean


def model_table_from_hf(source: HfSource) -> dict[str, Any]:
    """The `[model]` table of a config.json (a path or its parsed contents).

    An unsupported model_type or a missing key is a SpecError naming the key.
    """
    return _table(read_config(source))


def _table(config: HfConfig) -> dict[str, Any]:
    config, note = _language_model(config)
    family = _family(config)
    problems = missing_problems(config, family.required)
    if problems:
        raise SpecError(problems, config.label)
    table = _with_rotary_fraction(config, {**family.read(config),
                                           **mtp_table(config, family.mtp_table_copies)})
    if table.get("mtp_layers"):
        note += mtp_note(config, table)
    return {"source": _source(config, family, note), **_clean(table)}


def _with_rotary_fraction(config: HfConfig, table: dict[str, Any]) -> dict[str, Any]:
    """`table` with the share of each head RoPE rotates after position_embedding, where
    it is not the whole head (RoPE on standard heads only: MLA's is qk_rope_head_dim)."""
    if table.get("position_embedding", "rope") != "rope" or "mla" in table:
        return table
    fraction = rotary_fraction(config, table.get("head_dim"))
    if fraction is None:
        return table
    keys = list(table)
    at = keys.index("position_embedding") + 1 if "position_embedding" in keys else len(keys)
    return {**dict(list(table.items())[:at]), "rotary_fraction": fraction,
            **dict(list(table.items())[at:])}


def model_from_hf(source: HfSource) -> Model:
    """The `Model` of a config.json, named after its repository when the file says."""
    config = read_config(source)
    model, problems = structure(make_converter(), _table(config), Model, "$")
    if model is None:
        raise SpecError(problems, config.label)
    named: Model = attrs.evolve(model, name=config.repo or model.name)
    return named
