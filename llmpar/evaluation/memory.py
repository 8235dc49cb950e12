"""Per-GPU memory of each pipeline stage: model states and activations under the
strategies' transforms."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.inventory import (
    ActivationInventory,
    SavedTensor,
    drop_attention_scores,
    keep_layer_inputs,
)
from llmpar.plan import Derivation, SavedTensorRow, StageMemory
from llmpar.spec import Spec
from llmpar.strategy import Stage, Transform

MODEL_STATE_SOURCE = (
    "ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1): weights and gradients in "
    "their formats, plus the optimizer's states per parameter"
)
PER_LAYER_GROUPS = ("attention", "norms", "all")
DENSE_GROUPS = ("mlp",)
MOE_GROUPS = ("experts", "shared_experts", "router")


@attrs.frozen(kw_only=True)
class Memory:
    """The peak stage's bytes on one GPU, every stage's, and their derivations."""

    peak: StageMemory
    stages: tuple[StageMemory, ...]
    recomputed_fraction: float
    """Share of layers full recomputation reruns (1 without recompute_layers)."""
    activation_tensors: tuple[SavedTensorRow, ...]
    derivations: tuple[Derivation, ...]


def whole_model_stage(spec: Spec) -> Stage:
    """One stage holding everything: the layout without pipeline parallelism."""
    return Stage(index=0, first_layer=0, num_layers=spec.model.num_layers or 0,
                 has_embedding=True, has_head=True, micro_batches_in_flight=1.0)


def stages_of(spec: Spec, transforms: Iterable[Transform]) -> tuple[Stage, ...]:
    for transform in transforms:
        if transform.stages:
            return transform.stages
    return (whole_model_stage(spec),)


def _layer_kinds(spec: Spec, stage: Stage) -> tuple[int, int]:
    """(dense layers, MoE layers) of a stage."""
    indices = range(stage.first_layer, stage.first_layer + stage.num_layers)
    moe = sum(spec.model.is_moe_layer(i) for i in indices)
    return stage.num_layers - moe, moe


def stage_parameters(spec: Spec, footprint: Footprint, stage: Stage) -> dict[str, float]:
    """Parameters by group that one stage holds, before any sharding."""
    model = spec.model
    by_group = footprint.parameters.by_group or {"all": footprint.parameters.total}
    if not model.num_layers:  # a model given by its size: one stage holds it all
        return dict(by_group)
    layers = model.num_layers
    dense, moe = _layer_kinds(spec, stage)
    share = {"embedding": float(stage.has_embedding), "head": float(stage.has_head)}
    share.update(dict.fromkeys(PER_LAYER_GROUPS, stage.num_layers / layers))
    share.update(dict.fromkeys(DENSE_GROUPS, dense / max(1, model.num_dense_layers)))
    share.update(dict.fromkeys(MOE_GROUPS, moe / max(1, model.num_moe_layers)))
    return {group: count * share.get(group, stage.num_layers / layers)
            for group, count in by_group.items()}


def component_bytes(parameters: Mapping[str, float], bytes_per_parameter: float,
                    component: str, transforms: Iterable[Transform]) -> float:
    """Bytes of one model-state component on one GPU, each group under its shards."""
    shards = [s for t in transforms for s in t.shards if s.component == component]
    return sum(count * bytes_per_parameter
               / math.prod(s.divisor for s in shards if s.applies_to(group))
               for group, count in parameters.items())


def offloaded_bytes(parameters: Mapping[str, float], bytes_per_parameter: float,
                    component: str, transforms: Iterable[Transform]) -> float:
    """The part of `component_bytes` that strategies keep in host memory instead
    (`Transform.offloads`; ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840)."""
    transforms = list(transforms)
    offloads = [o for t in transforms for o in t.offloads if o.component == component]
    moved = {g: n for g, n in parameters.items() if any(o.applies_to(g) for o in offloads)}
    return component_bytes(moved, bytes_per_parameter, component, transforms)


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


def recomputed_layers(spec: Spec, stage: Stage) -> int:
    """Layers of `stage` that full recomputation reruns."""
    if spec.training.recompute != "full":
        return 0
    limit = spec.training.recompute_layers
    return stage.num_layers if limit is None else min(limit, stage.num_layers)


def stage_inventory(spec: Spec, footprint: Footprint, stage: Stage) -> ActivationInventory:
    """The stage's saved tensors; under partial full recomputation its first layers
    keep only their inputs and the others keep everything."""
    assert footprint.activations is not None
    inventory = footprint.activations
    rerun = recomputed_layers(spec, stage)
    if rerun in (0, stage.num_layers):
        dense, moe = _layer_kinds(spec, stage)
        staged = inventory.for_stage(dense, moe, stage.has_embedding, stage.has_head)
        return recomputed(staged, spec)
    head = attrs.evolve(stage, num_layers=rerun)
    tail = attrs.evolve(stage, first_layer=stage.first_layer + rerun,
                        num_layers=stage.num_layers - rerun)
    checkpoints = recomputed(inventory.for_stage(*_layer_kinds(spec, head), False, False), spec)
    kept = inventory.for_stage(*_layer_kinds(spec, tail), stage.has_embedding, stage.has_head)
    return attrs.evolve(kept, groups=checkpoints.groups + kept.groups)


def recomputed_fraction(spec: Spec, stages: tuple[Stage, ...]) -> float:
    """Share of all layers whose forward full recomputation reruns."""
    layers = sum(stage.num_layers for stage in stages)
    return sum(recomputed_layers(spec, s) for s in stages) / layers if layers else 0.0


def _stage_memory(spec: Spec, footprint: Footprint, stage: Stage,
                  transforms: list[Transform]) -> tuple[StageMemory, ActivationInventory | None]:
    precision = spec.precision
    parameters = stage_parameters(spec, footprint, stage)
    per_parameter = {
        "weights": bytes_per_element(precision.weights),
        "gradients": bytes_per_element(spec.gradients_dtype),
        "optimizer": spec.optimizer.bytes_per_parameter(precision.weights),
    }
    host = {c: round(offloaded_bytes(parameters, size, c, transforms))
            for c, size in per_parameter.items()}
    states = {c: round(component_bytes(parameters, size, c, transforms)) - host[c]
              for c, size in per_parameter.items()}
    inventory, activations = None, None
    if footprint.activations is not None:
        inventory = split_inventory(stage_inventory(spec, footprint, stage), transforms)
        activations = round(inventory.total_bytes * stage.micro_batches_in_flight)
    buffers = round(sum(t.buffer_bytes for t in transforms))
    total = sum(states.values()) + (activations or 0) + buffers
    memory = StageMemory(stage=stage.index, layers=stage.num_layers,
                         weights_bytes=states["weights"], gradients_bytes=states["gradients"],
                         optimizer_bytes=states["optimizer"], activations_bytes=activations,
                         buffers_bytes=buffers, total_bytes=total,
                         micro_batches_in_flight=stage.micro_batches_in_flight,
                         host_bytes=sum(host.values()))
    return memory, inventory


def per_gpu_memory(spec: Spec, footprint: Footprint, transforms: list[Transform]) -> Memory:
    """Every stage's memory; the peak stage's components with their derivations."""
    stages = stages_of(spec, transforms)
    results = [_stage_memory(spec, footprint, stage, transforms) for stage in stages]
    peak_index = max(range(len(results)), key=lambda i: results[i][0].total_bytes)
    peak, inventory = results[peak_index]
    return Memory(peak=peak, stages=tuple(r[0] for r in results),
                  recomputed_fraction=recomputed_fraction(spec, stages),
                  activation_tensors=_rows(inventory) if inventory else (),
                  derivations=_derivations(spec, footprint, peak, inventory))


def _derivations(spec: Spec, footprint: Footprint, peak: StageMemory,
                 inventory: ActivationInventory | None) -> tuple[Derivation, ...]:
    precision, n = spec.precision, footprint.parameters.total
    states = spec.optimizer.kept_states(precision.weights)
    listed = " + ".join(f"{s.name} ({s.dtype})" for s in states) or "no states"
    rule = "sum over parameter groups held by the stage of N_g * {} / (shards applying to g)"
    found = [
        Derivation(quantity="weights_bytes", value=peak.weights_bytes, unit="bytes",
                   rule=rule.format(f"bytes({precision.weights})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": n, "stage": peak.stage}),
        Derivation(quantity="gradients_bytes", value=peak.gradients_bytes, unit="bytes",
                   rule=rule.format(f"bytes({spec.gradients_dtype})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": n, "stage": peak.stage}),
        Derivation(quantity="optimizer_bytes", value=peak.optimizer_bytes, unit="bytes",
                   rule=rule.format(f"({listed})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": n, "bytes_per_parameter":
                           spec.optimizer.bytes_per_parameter(precision.weights)}),
    ]
    if inventory is not None:
        found.append(Derivation(
            quantity="activations_bytes", value=peak.activations_bytes, unit="bytes",
            rule=("(stage layers' saved tensors + embedding/output tensors it holds) * "
                  f"micro_batches_in_flight, after splits; recompute = {spec.training.recompute}"),
            source=_activation_source(inventory),
            inputs={"layers": inventory.num_layers, "layers_bytes": inventory.layers_bytes,
                    "outside_layers_bytes": inventory.fixed_bytes,
                    "micro_batches_in_flight": peak.micro_batches_in_flight}))
    return tuple(found)


def _activation_source(inventory: ActivationInventory) -> str:
    return inventory.source or f"activation model {inventory.model!r}"


def _rows(inventory: ActivationInventory) -> tuple[SavedTensorRow, ...]:
    def row(tensor: SavedTensor, kind: str, layers: int) -> SavedTensorRow:
        return SavedTensorRow(name=tensor.name, reason=tensor.reason, shape=tensor.shape_text,
                              bytes_per_element=tensor.bytes_per_element, bytes=tensor.bytes,
                              layer_kind=kind, layers=layers)

    rows = [row(t, group.kind, group.count) for group in inventory.groups
            if group.count for t in group.tensors]
    return tuple(rows) + tuple(row(t, "", 1) for t in inventory.fixed)
