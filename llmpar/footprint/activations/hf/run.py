"""How a Hugging Face training forward is run: attention and experts implementations,
dropout. None of these is a model field, so they come with the activation model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
"""transformers' attn_implementation values modelled here."""
EXPERTS_IMPLEMENTATIONS = ("grouped_mm", "eager")
"""transformers' experts_implementation values modelled here (grouped_mm is its default)."""


def _probability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class Dropout:
    """Dropout probabilities of a training run (0 turns a dropout into the identity,
    which keeps nothing: ATen's dropout returns its input when p = 0)."""

    attention: float = attrs.field(default=0.0, validator=_probability)
    """On the attention probabilities (attn_pdrop, attention_probs_dropout_prob,
    attention_dropout)."""
    hidden: float = attrs.field(default=0.0, validator=_probability)
    """On each residual branch (GPT-2 and Phi-3 resid_pdrop, BERT hidden_dropout_prob)."""
    embedding: float = attrs.field(default=0.0, validator=_probability)
    """After the embeddings (GPT-2 embd_pdrop, BERT hidden_dropout_prob)."""

    @property
    def any(self) -> bool:
        return bool(self.attention or self.hidden or self.embedding)


@attrs.frozen(kw_only=True)
class HfRun:
    """One way of running a transformers model in training."""

    attention: str = attrs.field(default="eager",
                                 validator=attrs.validators.in_(ATTENTION_IMPLEMENTATIONS))
    experts: str = attrs.field(default="grouped_mm",
                               validator=attrs.validators.in_(EXPERTS_IMPLEMENTATIONS))
    dropout: Dropout = attrs.field(factory=Dropout)


_DROPOUT_KEYS = {
    "attention": ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"),
    "hidden": ("resid_pdrop", "hidden_dropout_prob"),
    "embedding": ("embd_pdrop",),
}
"""config.json keys by the dropout they set (GPT2Config, BertConfig, LlamaConfig and
Phi3Config of transformers 5.24). BERT's embedding dropout is hidden_dropout_prob."""


def dropout_from_hf_config(values: Mapping[str, Any]) -> Dropout:
    """The dropout probabilities a config.json sets (missing keys: 0)."""

    def first(keys: tuple[str, ...]) -> float:
        found = [values[k] for k in keys if isinstance(values.get(k), int | float)]
        return float(found[0]) if found else 0.0

    found = {name: first(keys) for name, keys in _DROPOUT_KEYS.items()}
    if values.get("model_type") == "bert":
        found["embedding"] = found["hidden"]
    return Dropout(**found)
