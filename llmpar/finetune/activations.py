"""What LoRA adds to the tensors each block keeps for backward.

PEFT's LoRA forward (`peft/tuners/lora/layer.py`, `Linear.forward`) is
`result = base(x) + lora_B(lora_A(dropout(x))) * scaling`. For its weight gradient,
lora_B keeps its input, the r-wide x A; lora_A keeps its input, which is x itself
(already kept by the block: the base layer's input) unless dropout is on (PEFT uses
`nn.Identity` for lora_dropout = 0): then dropout(x) is a new tensor, and the dropout
keeps its mask (one byte per element, PyTorch's `native_dropout`). The scaling and the
sum keep nothing. The frozen base layers still keep what their input gradients need,
so the block's own inventory stays as in full training.

Splits: the r-wide intermediate is per token (context parallelism splits it) and whole
on every tensor rank (under a column-parallel layer A is whole; under a row-parallel one
A's partial products are summed over the tensor ranks: PEFT's LoraParallelLinear,
`llmpar.finetune.footprint`); a dropped-out input is split as the layer's
input is: the residual width h of q/k/v/gate/up as the residual stream, the inner width
of o_proj and down_proj over the tensor ranks (Shoeybi et al. 2019, Sec. 3).
"""

from __future__ import annotations

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.finetune.footprint import FinetuneFootprint
from llmpar.finetune.targets import Linear, targeted
from llmpar.footprint.activations.common import INSIDE_TP, OUTSIDE_TP, TOKENS_ONLY
from llmpar.footprint.inventory import ActivationInventory, LayerGroup, SavedTensor
from llmpar.spec import Spec
from llmpar.spec.model import NO_MLP, mixer_parts
from llmpar.strategy import Stage

MASK_BYTES = 1.0
"""A dropout mask: one bool per element (PyTorch's `native_dropout` keeps a bool mask)."""
ROW_PARALLEL = ("o_proj", "down_proj")
"""Targets whose input is split over the tensor ranks (row-parallel layers)."""


def _adapter_tensors(spec: Spec, linear: Linear) -> tuple[SavedTensor, ...]:
    finetune = spec.finetune
    assert finetune is not None
    training = spec.training
    d = bytes_per_element(spec.precision.activations)
    tokens: tuple[tuple[str, int], ...] = (("b", training.micro_batch_size),
                                           ("s", training.sequence_length))
    copies = linear.copies
    if linear.group == "experts":
        assert spec.model.moe is not None
        tokens += (("k", spec.model.moe.experts_per_token),)
        copies = 1  # each routed token passes through its k experts' adapters
    elif copies > 1:
        tokens += (("n_s", copies),)
    found = [SavedTensor(name=f"{linear.name} LoRA x A", reason="lora_B's input, for its "
                         "weight gradient", shape=(*tokens, ("r", finetune.rank)),
                         bytes_per_element=d, splits=TOKENS_ONLY)]
    if finetune.dropout_on:
        splits = INSIDE_TP if linear.name in ROW_PARALLEL else OUTSIDE_TP
        shape = (*tokens, ("in", linear.in_features))
        found += [SavedTensor(name=f"{linear.name} LoRA dropout(x)", reason="lora_A's input, "
                              "for its weight gradient", shape=shape, bytes_per_element=d,
                              splits=splits),
                  SavedTensor(name=f"{linear.name} LoRA dropout mask (bool)",
                              reason="kept by the dropout", shape=shape,
                              bytes_per_element=MASK_BYTES, splits=splits)]
    return tuple(found)


def with_adapters(spec: Spec, inventory: ActivationInventory) -> ActivationInventory:
    """`inventory` with every block's adapter tensors."""
    finetune = spec.tuning
    if finetune is None or not finetune.adapters:
        return inventory
    linears = targeted(spec.model, finetune.targets, finetune.all_linear)
    attention = tuple(t for linear in linears if linear.group == "attention"
                      for t in _adapter_tensors(spec, linear))
    dense = tuple(t for linear in linears if linear.group == "mlp"
                  for t in _adapter_tensors(spec, linear))
    moe = tuple(t for linear in linears if linear.group in ("experts", "shared_experts")
                for t in _adapter_tensors(spec, linear))
    added = {"dense": attention + dense, "layer": attention + dense, "moe": attention + moe}

    def add(group: LayerGroup) -> LayerGroup:
        if " " in group.kind:  # a hybrid model's kind: attention adapters on attention only
            block, mixer = group.kind.split(" ", 1)
            own = (attention if "attention" in mixer_parts(mixer) else ()) + (
                moe if block == "moe" else () if block == NO_MLP else dense)
            return attrs.evolve(group, tensors=group.tensors + own)
        return attrs.evolve(group, tensors=group.tensors + added.get(group.kind, attention))

    return inventory.map_layers(add)


def without_backward(spec: Spec, tuned: FinetuneFootprint, stage: Stage,
                     inventory: ActivationInventory) -> ActivationInventory:
    """A stage's inventory without what no backward pass needs (method "frozen"): the
    leading blocks before the first trainable parameter keep nothing (their groups come
    first in the inventory: the checkpointed layers of partial recomputation are the
    stage's first), and a frozen embedding keeps no token ids (`nn.Embedding` saves its
    indices only for its weight's gradient)."""
    model = spec.model
    free = [i for i in range(stage.first_layer, stage.first_layer + stage.num_layers)
            if i < tuned.backward_free_layers]
    moe = sum(1 for i in free if model.is_moe_layer(i))
    left = {"dense": len(free) - moe, "moe": moe, "layer": len(free)}
    if model.layer_kinds_vary and free:
        left.update(model.hybrid_kinds_in(free[0], len(free)))
    groups = []
    for group in inventory.groups:
        dropped = min(group.count, left.get(group.kind, 0))
        left[group.kind] = left.get(group.kind, 0) - dropped
        if group.kind == "layer":
            left["dense"] = left["moe"] = 0
        elif group.kind in ("dense", "moe"):
            left["layer"] = 0
        groups.append(attrs.evolve(group, count=group.count - dropped))
    fixed = inventory.fixed
    if "embedding" in tuned.frozen_groups:
        fixed = tuple(t for t in fixed if t.placement != "embedding")
    return attrs.evolve(inventory, groups=tuple(groups), fixed=fixed)
