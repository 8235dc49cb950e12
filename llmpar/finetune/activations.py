"""What LoRA adds to the tensors each block keeps for backward.

PEFT's LoRA forward (`peft/tuners/lora/layer.py`, `Linear.forward`) is
`result = base(x) + lora_B(lora_A(dropout(x))) * scaling`. For its weight gradient,
lora_B keeps its input, the r-wide x A; lora_A keeps its input, which is x itself
(already kept by the block: the base layer's input) unless dropout is on (PEFT uses
`nn.Identity` for lora_dropout = 0): then dropout(x) is a new tensor, and the dropout
keeps its mask (one byte per element, PyTorch's `native_dropout`). The scaling and the
sum keep nothing.

Frozen weights (`without_frozen_inputs`): a product x W saves x only for W's gradient
(PyTorch's generated autograd code saves an operand only where the other operand
requires a gradient: the `should_compute_output` guards of
tools/autograd/gen_variable_type.py), so a tensor kept only as the input of frozen
weights (`SavedTensor.weights_only`) is not kept, unless an adapter's A reads it: lora_A
saves its input for its own weight's gradient. The frozen layers still keep what their
input gradients need (an activation's input, attention's operands). QLoRA's dequantized
weights are temporaries of each product, never saved (bitsandbytes' MatMul4Bit saves the
quantized weight and its state).

Where no gradient reaches a block's input (the embedding frozen, and every block before
frozen), autograd builds no graph for the block's operations before its first trainable
weight (`without_backward`): they keep nothing.

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
from llmpar.finetune.footprint import FinetuneFootprint, frozen_base_groups
from llmpar.finetune.targets import Linear, targeted
from llmpar.footprint.activations.common import INSIDE_TP, OUTSIDE_TP, TOKENS_ONLY
from llmpar.footprint.inventory import ActivationInventory, LayerGroup, SavedTensor
from llmpar.footprint.parameters import parameter_groups
from llmpar.spec import Spec
from llmpar.spec.model import NO_MLP, mixer_parts
from llmpar.strategy import Stage

MASK_BYTES = 1.0
"""A dropout mask: one bool per element (PyTorch's `native_dropout` keeps a bool mask)."""
ROW_PARALLEL = ("o_proj", "down_proj")
"""Targets whose input is split over the tensor ranks (row-parallel layers)."""


@attrs.frozen(kw_only=True)
class TrainedWeights:
    """Which weights of a fine-tuning run get gradients, by `SavedTensor.weights` names
    ("<group>" or "<group>.<PEFT module name>")."""

    groups: frozenset[str]
    """Base parameter groups that train (method "frozen": all but the frozen ones; an
    adapter method: its `modules_to_save`)."""
    adapted: frozenset[str] = frozenset()
    """"<group>.<module>" of the linear layers with adapters."""
    dropout: bool = False
    """LoRA dropout is on: lora_A reads dropout(x), a tensor of its own."""
    head_group: str = "head"
    """The group of the output layer's weight ("embedding" where it is tied)."""

    def trains(self, weight: str) -> bool:
        group = weight.split(".", 1)[0]
        return (self.head_group if group == "head" else group) in self.groups

    def keeps(self, weight: str) -> bool:
        """Whether the input of `weight`'s product is kept: the weight trains, or its
        adapter's A saves that same tensor."""
        return self.trains(weight) or (weight in self.adapted and not self.dropout)

    def reads(self, weight: str) -> bool:
        """Whether a gradient starts at `weight`'s product (its weight or its adapter's)."""
        return self.trains(weight) or weight in self.adapted


def trained_weights(spec: Spec) -> TrainedWeights | None:
    """`spec`'s trained weights; None without `[finetune]` (everything trains)."""
    finetune = spec.tuning
    if finetune is None:
        return None
    groups = parameter_groups(spec.model)
    head = "head" if groups.get("head") else "embedding"
    if finetune.adapters:
        adapted = frozenset(f"{linear.group}.{linear.name}" for linear in targeted(
            spec.model, finetune.targets, finetune.all_linear))
        return TrainedWeights(groups=frozenset(g for g in finetune.saved_groups if g in groups),
                              adapted=adapted, dropout=finetune.dropout_on, head_group=head)
    return TrainedWeights(groups=frozenset(groups) - frozen_base_groups(finetune, groups),
                          head_group=head)


def _kept(tensor: SavedTensor, trained: TrainedWeights) -> bool:
    return not (tensor.weights_only and tensor.weights) or any(
        trained.keeps(weight) for weight in tensor.weights)


def without_frozen_inputs(spec: Spec, inventory: ActivationInventory) -> ActivationInventory:
    """`inventory` without the tensors kept only as inputs of frozen weights' products
    (see the module docstring); a weight frozen in some blocks only (a layer range) is
    counted as trained."""
    trained = trained_weights(spec)
    if trained is None:
        return inventory
    kept = inventory.map_layers(lambda group: group.replace(
        tuple(t for t in group.tensors if _kept(t, trained))))
    return attrs.evolve(kept, fixed=tuple(t for t in inventory.fixed if _kept(t, trained)))


def _first_trained_block(spec: Spec, tuned: FinetuneFootprint, stage: Stage,
                         inventory: ActivationInventory,
                         trained: TrainedWeights) -> ActivationInventory:
    """The stage's inventory with its first block that a gradient reaches keeping nothing
    before its first trained (or adapted) product, where no gradient reaches that block's
    input: the embedding does not train and the blocks before it run no backward (PyTorch
    records no operation none of whose inputs requires a gradient). Unchanged where that
    block is not on the stage, where it keeps only a checkpoint (no tensor there is a
    trained weight's input) or where no such tensor is found."""
    first = tuned.backward_free_layers
    if trained.trains("embedding") or not (
            stage.first_layer <= first < stage.first_layer + stage.num_layers):
        return inventory
    model = spec.model
    kinds = {"layer", "moe" if model.is_moe_layer(first) else "dense"}
    if model.layer_kinds_vary:
        kinds |= set(model.hybrid_kinds_in(first, 1))
    position = next((i for i, group in enumerate(inventory.groups)
                     if group.count and group.kind in kinds), None)
    if position is None:
        return inventory
    group = inventory.groups[position]
    start = next((i for i, t in enumerate(group.tensors)
                  if any(trained.reads(weight) for weight in t.weights)), None)
    if not start:
        return inventory
    own = attrs.evolve(group, count=1, tensors=group.tensors[start:])
    rest = (attrs.evolve(group, count=group.count - 1),) if group.count > 1 else ()
    groups = inventory.groups[:position] + (own,) + rest + inventory.groups[position + 1:]
    return attrs.evolve(inventory, groups=groups)


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
    """A stage's inventory without what no backward pass needs: under method "frozen"
    the leading blocks before the first trainable parameter keep nothing (their groups
    come first in the inventory: the checkpointed layers of partial recomputation are the
    stage's first), and a frozen embedding keeps no token ids (`nn.Embedding` saves its
    indices only for its weight's gradient); under any method, the first block a
    gradient reaches keeps nothing before its first trained product
    (`_first_trained_block`)."""
    trained = trained_weights(spec)
    if tuned.method != "frozen":
        if trained is None:
            return inventory
        return _first_trained_block(spec, tuned, stage, inventory, trained)
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
    found = attrs.evolve(inventory, groups=tuple(groups), fixed=fixed)
    return found if trained is None else _first_trained_block(spec, tuned, stage, found,
                                                              trained)
