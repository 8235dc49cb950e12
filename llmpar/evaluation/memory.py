"""Per-GPU memory: model states and activations under the strategies' transforms."""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.inventory import (
    ActivationInventory,
    SavedTensor,
    drop_attention_scores,
    keep_layer_inputs,
)
from llmpar.plan import Derivation, SavedTensorRow
from llmpar.spec import Spec
from llmpar.strategy import Transform

MODEL_STATE_SOURCE = (
    "ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1): weights and gradients in "
    "their formats, plus the optimizer's states per parameter"
)


@attrs.frozen(kw_only=True)
class Memory:
    """Bytes on one GPU, with their derivations."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    buffers_bytes: int
    activation_tensors: tuple[SavedTensorRow, ...]
    derivations: tuple[Derivation, ...]

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + (self.activations_bytes or 0) + self.buffers_bytes)


def divisor(transforms: Iterable[Transform], component: str) -> int:
    """Product of every strategy's shard divisor for `component`."""
    return math.prod(s.divisor for t in transforms for s in t.shards if s.component == component)


def recomputed(inventory: ActivationInventory, spec: Spec) -> ActivationInventory:
    """The inventory under `[training] recompute` (Korthikanti et al. 2022, Sec. 5)."""
    mode = spec.training.recompute
    if mode == "selective":
        return drop_attention_scores(inventory)
    if mode == "full":
        assert spec.model.hidden_size is not None
        return keep_layer_inputs(inventory, spec.training.micro_batch_size,
                                 spec.training.sequence_length, spec.model.hidden_size,
                                 bytes_per_element(spec.precision.activations))
    return inventory


def split_inventory(inventory: ActivationInventory,
                    transforms: Iterable[Transform]) -> ActivationInventory:
    """Apply every strategy's activation splits."""
    for transform in transforms:
        for split in transform.activation_splits:
            inventory = inventory.split(split.tag, split.divisor)
    return inventory


def _state(name: str, parameters: float, per_parameter: float, shards: int,
           rule: str) -> tuple[int, Derivation]:
    value = round(parameters * per_parameter / shards)
    return value, Derivation(
        quantity=name, value=value, unit="bytes", rule=rule, source=MODEL_STATE_SOURCE,
        inputs={"N": parameters, "bytes_per_parameter": per_parameter, "shards": shards})


def per_gpu_memory(spec: Spec, footprint: Footprint, transforms: list[Transform]) -> Memory:
    """Weights, gradients, optimizer states and activations on one GPU."""
    n = footprint.parameters.total
    precision = spec.precision
    weights, d_weights = _state("weights_bytes", n, bytes_per_element(precision.weights),
                                divisor(transforms, "weights"),
                                f"N * bytes({precision.weights}) / shards")
    gradients, d_gradients = _state("gradients_bytes", n,
                                    bytes_per_element(precision.gradients),
                                    divisor(transforms, "gradients"),
                                    f"N * bytes({precision.gradients}) / shards")
    states = spec.optimizer.kept_states(precision.weights)
    listed = " + ".join(f"{s.name} ({s.dtype})" for s in states) or "no states"
    optimizer, d_optimizer = _state("optimizer_bytes", n,
                                    spec.optimizer.bytes_per_parameter(precision.weights),
                                    divisor(transforms, "optimizer"),
                                    f"N * ({listed}) / shards")
    derivations = [d_weights, d_gradients, d_optimizer]
    activations, rows = None, ()
    if footprint.activations is not None:
        inventory = split_inventory(recomputed(footprint.activations, spec), transforms)
        in_flight = max((t.micro_batches_in_flight for t in transforms), default=1.0)
        shards = divisor(transforms, "activations")
        activations = round(inventory.total_bytes * in_flight / shards)
        rows = _rows(inventory)
        derivations.append(Derivation(
            quantity="activations_bytes", value=activations, unit="bytes",
            rule=("(layers + outside_layers) * micro_batches_in_flight / shards, "
                  f"recompute = {spec.training.recompute}"),
            source=_activation_source(inventory),
            inputs={"L": inventory.num_layers, "layers_bytes": inventory.layers_bytes,
                    "outside_layers_bytes": inventory.fixed_bytes,
                    "micro_batches_in_flight": in_flight, "shards": shards}))
    buffers = sum(t.buffer_bytes for t in transforms)
    return Memory(weights_bytes=weights, gradients_bytes=gradients, optimizer_bytes=optimizer,
                  activations_bytes=activations, buffers_bytes=buffers,
                  activation_tensors=rows, derivations=tuple(derivations))


def _activation_source(inventory: ActivationInventory) -> str:
    if inventory.model == "coefficient":
        return "the founding document's M = k * b * s * L * h * d"
    return "Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 4.1 and 4.3, per tensor"


def _rows(inventory: ActivationInventory) -> tuple[SavedTensorRow, ...]:
    def row(tensor: SavedTensor, kind: str, layers: int) -> SavedTensorRow:
        return SavedTensorRow(name=tensor.name, reason=tensor.reason, shape=tensor.shape_text,
                              bytes_per_element=tensor.bytes_per_element, bytes=tensor.bytes,
                              layer_kind=kind, layers=layers)

    rows = [row(t, group.kind, group.count) for group in inventory.groups for t in group.tensors]
    return tuple(rows) + tuple(row(t, "", 1) for t in inventory.fixed)
