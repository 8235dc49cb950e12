"""What every activation model shares: the error, the split tags, the sizes of a run.

Each model builds an `ActivationInventory` for one micro-batch of one unsplit
replica; strategies and recomputation then transform it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.inventory import (
    SPLIT_CONTEXT,
    SPLIT_SEQUENCE,
    SPLIT_TENSOR,
    ActivationInventory,
    SavedTensor,
)
from llmpar.spec.model import ARCHITECTURE_FIELDS

if TYPE_CHECKING:
    from llmpar.spec import Spec

MASK_BYTES = 1.0
"""A dropout mask keeps one byte per element (Korthikanti et al. 2022, Sec. 4.1)."""
TOKEN_ID_BYTES = 8.0
"""Input token ids are int64, as Megatron-LM and PyTorch embeddings take them."""
FP32_BYTES = bytes_per_element("fp32")
LOSS_BYTES = FP32_BYTES
"""Logits are upcast to fp32 for the cross-entropy loss (Megatron-LM)."""

OUTSIDE_TP = frozenset({SPLIT_SEQUENCE, SPLIT_CONTEXT})
"""Tensors of the residual stream, replicated across the tensor group unless sequence
parallelism splits them (Korthikanti et al. 2022, Sec. 4.2.2)."""
INSIDE_TP = frozenset({SPLIT_TENSOR, SPLIT_CONTEXT})
"""Tensors between a column- and a row-parallel projection: split over heads, the MLP's
inner width or the vocabulary (Shoeybi et al. 2019, Sec. 3)."""
TOKENS_ONLY = frozenset({SPLIT_CONTEXT})
"""Per-token tensors that tensor parallelism leaves whole (token ids, labels, RoPE)."""


class ActivationUnavailable(Exception):
    """The model lacks what this activation model needs; the message says what."""


ActivationModel = Callable[["Spec"], ActivationInventory]


def require(spec: Spec, fields: tuple[str, ...], model_name: str,
            recurrent_inventory: bool = False) -> None:
    """Raise ActivationUnavailable naming the model fields `model_name` needs and lacks;
    `recurrent_inventory`: the model lists the model's recurrent and single-module layers
    (else they are refused)."""
    needed = set(spec.model.architecture_fields) | (set(fields) - set(ARCHITECTURE_FIELDS))
    missing = [name for name in fields if name in needed and getattr(spec.model, name) is None]
    recurrent = spec.model.recurrent_mixer
    listed = recurrent_inventory or model_name in ("coefficient", "fused")
    if recurrent is not None and not listed:
        raise ActivationUnavailable(
            f"activation model {model_name!r} has no inventory of the tensors the model's "
            f"{recurrent} layers keep for backward (their chunked scan's inputs and "
            "per-chunk states); activation_model = 'fused' lists them as the fused "
            "kernels keep them, 'coefficient' estimates them by size")
    if spec.model.single_module_layers and not listed:
        raise ActivationUnavailable(
            f"activation model {model_name!r} has no inventory of layers of one module (a "
            "token mixer or an MLP alone, mixer_pattern's lower-case letters and '-'); "
            "activation_model = 'fused' lists them, 'coefficient' estimates them by size")
    if not missing:
        return
    hint = ""
    if spec.model.parameters is not None and model_name != "coefficient":
        hint = ("; a model given by its size can use activation_model = 'coefficient' "
                "with num_layers and hidden_size")
    raise ActivationUnavailable(
        f"activation model {model_name!r} needs model fields {', '.join(missing)}{hint}")


ARCHITECTURE = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                "ffn_hidden_size")
"""The model fields the per-tensor models need."""


def saved(name: str, reason: str, shape: tuple[tuple[str, int], ...], size: float,
          splits: frozenset[str],
          attention_score: bool = False, placement: str = "",
          module: str = "", weights: frozenset[str] = frozenset(),
          weights_only: bool = False) -> SavedTensor:
    """A SavedTensor, positionally: name, reason, shape, bytes per element, splits."""
    return SavedTensor(name=name, reason=reason, shape=shape, bytes_per_element=size,
                       splits=splits, attention_score=attention_score, placement=placement,
                       module=module, weights=weights, weights_only=weights_only)



@attrs.frozen(kw_only=True)
class Sizes:
    """The symbols of one micro-batch of one model, as (symbol, size) dimensions."""

    b: tuple[str, int]
    s: tuple[str, int]
    h: tuple[str, int]
    a: tuple[str, int]
    vocab: tuple[str, int]
    d: float
    """Bytes per element of the activations (`[precision] activations`)."""

    @property
    def tokens(self) -> tuple[tuple[str, int], ...]:
        return (self.b, self.s)

    @property
    def scores(self) -> tuple[tuple[str, int], ...]:
        """b x a x s x s: one attention score per head, query and key."""
        return (self.b, self.a, self.s, ("s", self.s[1]))

    def per_token(self, symbol: str, width: int) -> tuple[tuple[str, int], ...]:
        """b x s x `symbol`."""
        return (self.b, self.s, (symbol, width))


def sizes_of(spec: Spec) -> Sizes:
    model, training = spec.model, spec.training
    assert model.hidden_size is not None and model.vocab_size is not None
    return Sizes(b=("b", training.micro_batch_size), s=("s", training.sequence_length),
                 h=("h", model.hidden_size), a=("a", model.num_attention_heads or 0),
                 vocab=("V", model.vocab_size),
                 d=bytes_per_element(spec.precision.activations))
