"""The founding document's rule of thumb, M = k * b * s * L * h * d."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.activations.common import require
from llmpar.footprint.inventory import (
    SPLIT_CONTEXT,
    SPLIT_TENSOR,
    ActivationInventory,
    LayerGroup,
    SavedTensor,
)

if TYPE_CHECKING:
    from llmpar.spec import Spec


def coefficient(spec: Spec) -> ActivationInventory:
    """The founding document's estimate M = k * b * s * L * h * d.

    k is `[training] activation_coefficient` (the document measured about 30);
    d is the activations' bytes per element. Needs only L and h.
    """
    require(spec, ("num_layers", "hidden_size"), "coefficient")
    model, training = spec.model, spec.training
    assert model.num_layers is not None and model.hidden_size is not None
    k = training.activation_coefficient
    d = bytes_per_element(spec.precision.activations)
    tensor = SavedTensor(
        name=f"all activations (k = {k:g})",
        reason="k * b * s * h * d per layer, the founding document's rule of thumb",
        shape=(("b", training.micro_batch_size), ("s", training.sequence_length),
               ("h", model.hidden_size)),
        bytes_per_element=k * d,
        splits=frozenset({SPLIT_TENSOR, SPLIT_CONTEXT}),
    )
    group = LayerGroup(kind="layer", count=model.num_layers, tensors=(tensor,))
    return ActivationInventory(model="coefficient", groups=(group,),
                               source="the founding document's M = k * b * s * L * h * d")
