"""What the fast estimate needs of one searched spec, from llmpar's own functions.

Everything here is computed once per search (or once per key: a micro-batch size,
a recomputation mode, a kind of pipeline stage) by the functions evaluation uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.memory import stage_inventory, stage_parameters
from llmpar.evaluation.timing import StepFlops, step_flops
from llmpar.footprint.baseline import Footprint, baseline_footprint
from llmpar.footprint.inventory import (
    SPLIT_CONTEXT,
    SPLIT_SEQUENCE,
    SPLIT_TENSOR,
    ActivationInventory,
)
from llmpar.strategies.tensor import attention_divisor
from llmpar.strategy import Stage

if TYPE_CHECKING:
    from llmpar.spec import Spec

TAGS = (SPLIT_TENSOR, SPLIT_SEQUENCE, SPLIT_CONTEXT)
TagBytes = tuple[tuple[frozenset[str], float], ...]
"""Bytes of an unsplit activation inventory, by the split tags its tensors carry."""


def tag_bytes(inventory: ActivationInventory) -> TagBytes:
    """Group an inventory's bytes by split tags (tensor, sequence, context)."""
    found: dict[frozenset[str], float] = {}
    for group in inventory.groups:
        for tensor in group.tensors:
            tags = tensor.splits & frozenset(TAGS)
            found[tags] = found.get(tags, 0.0) + group.count * tensor.bytes
    for tensor in inventory.fixed:
        tags = tensor.splits & frozenset(TAGS)
        found[tags] = found.get(tags, 0.0) + tensor.bytes
    return tuple(found.items())


def gradients_dtype(spec: Spec) -> str:
    """The gradients' format as evaluation stores them."""
    return str(getattr(spec, "gradients_dtype", spec.precision.gradients))


class Facts:
    """Constants and per-key caches of one searched spec."""

    def __init__(self, spec: Spec):
        self.spec = spec
        model, hardware, gpu = spec.model, spec.hardware, spec.hardware.gpu
        self.num_gpus = hardware.num_gpus
        self.gpus_per_node = hardware.gpus_per_node
        self.global_batch = spec.training.global_batch_size or 0
        self.sequence = spec.training.sequence_length
        self.layers = model.num_layers or 0
        self.hidden = model.hidden_size or 0
        self.act_bytes = bytes_per_element(spec.precision.activations)
        self.weight_bytes = bytes_per_element(spec.precision.weights)
        self.grad_bytes = bytes_per_element(gradients_dtype(spec))
        self.optimizer_bytes = spec.optimizer.bytes_per_parameter(spec.precision.weights)
        self.moe_layers = model.num_moe_layers
        self.peak = gpu.peak_flops_per_s(spec.precision.compute)
        self.modelled = bool(spec.training.mfu is None and gpu.matmul_efficiency
                             and gpu.memory_efficiency and gpu.hbm_bandwidth_bytes_per_s
                             and self.peak)
        self.hbm = ((gpu.hbm_bandwidth_bytes_per_s or 0.0) * (gpu.memory_efficiency or 0.0))
        self.sequence_enabled = bool(getattr(spec.parallel.get("sequence"), "enabled", True))
        self._footprints: dict[int, Footprint] = {}
        self._params: dict[tuple[object, ...], Mapping[str, float]] = {}
        self._stage_tags: dict[tuple[object, ...], TagBytes] = {}
        self._full_tags: dict[int, TagBytes] = {}
        self._flops: dict[tuple[str, float], StepFlops] = {}
        self._attention: dict[int, float] = {}
        self._memo: dict[tuple[object, ...], Any] = {}
        self.shared: dict[tuple[Any, ...], Any] = {}
        """Work on option groups that grids share (llmpar.search.grid)."""
        parameters = self.footprint(1).parameters
        self.by_group = dict(parameters.by_group) or {"all": parameters.total}

    def cached(self, key: tuple[object, ...], compute: Callable[[], Any]) -> Any:
        """`compute()`, once per `key` for this search."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def training(self, micro_batch_size: int, recompute: str) -> Spec:
        training = attrs.evolve(self.spec.training, micro_batch_size=micro_batch_size,
                                recompute=recompute)
        return attrs.evolve(self.spec, training=training, parallel={})

    def footprint(self, micro_batch_size: int) -> Footprint:
        found = self._footprints.get(micro_batch_size)
        if found is None:
            found = baseline_footprint(self.training(micro_batch_size, "none"))
            self._footprints[micro_batch_size] = found
        return found

    def stage_parameters(self, stage: Stage, kind: tuple[object, ...]) -> Mapping[str, float]:
        found = self._params.get(kind)
        if found is None:
            found = stage_parameters(self.spec, self.footprint(1), stage)
            self._params[kind] = found
        return found

    def stage_tags(self, stage: Stage, kind: tuple[object, ...], micro_batch_size: int,
                   recompute: str) -> TagBytes:
        """Activation bytes one stage keeps for one micro-batch, unsplit, by tags."""
        key = (kind, micro_batch_size, recompute)
        found = self._stage_tags.get(key)
        if found is None:
            spec = self.training(micro_batch_size, recompute)
            footprint = self.footprint(micro_batch_size)
            found = () if footprint.activations is None else tag_bytes(
                stage_inventory(spec, footprint, stage))
            self._stage_tags[key] = found
        return found

    def full_tags(self, micro_batch_size: int) -> TagBytes:
        """The whole unsplit inventory (as the elementwise traffic counts it), by tags."""
        found = self._full_tags.get(micro_batch_size)
        if found is None:
            activations = self.footprint(micro_batch_size).activations
            found = () if activations is None else tag_bytes(activations)
            self._full_tags[micro_batch_size] = found
        return found

    def hardware_flops(self, recompute: str, fraction: float) -> float:
        """Hardware FLOPs of one step, all GPUs (`step_flops`)."""
        return self._step_flops(recompute, fraction).hardware_flops_per_step

    def attention_hardware_flops(self, recompute: str, fraction: float) -> float:
        """The attention products' part of `hardware_flops`."""
        return self._step_flops(recompute, fraction).attention_hardware_flops_per_step

    def _step_flops(self, recompute: str, fraction: float) -> StepFlops:
        key = (recompute, fraction)
        found = self._flops.get(key)
        if found is None:
            spec = self.training(1, recompute)
            found = step_flops(spec, self.footprint(1), 1, 0.0, fraction)
            self._flops[key] = found
        return found

    def attention_divisor(self, t: int) -> float:
        found = self._attention.get(t)
        if found is None:
            found = self._attention[t] = attention_divisor(self.spec, t)
        return found
