"""What evaluation needs of the footprint under one `[training]` table and one set of
pipeline stages: activation bytes by split tags per kind of stage, FLOPs, the share of
layers recomputed and the slowest stage's pace.

These depend on the training table (micro-batch size, recomputation) and the stages,
never on the other settings of a layout, so the search computes them once per
training table and stage structure and evaluates the rest over arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from llmpar.evaluation.balance import slowest_stage_factor
from llmpar.evaluation.stages import (
    every_interval_layer,
    layer_kinds,
    recomputed_fraction,
    recomputed_layers,
    stage_inventory,
    stage_parameters,
)
from llmpar.evaluation.timing import (
    attention_hardware_flops_per_sequence,
    recompute_flops_per_sequence,
)
from llmpar.evaluation.transients import KindParts, kind_parts
from llmpar.finetune.footprint import backward_free_layers_of, frozen_layers_of
from llmpar.finetune.trainable import frozen_layer_counts
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.flops import BACKWARD_TO_FORWARD, executed_attention_share
from llmpar.footprint.inventory import ActivationInventory, freed_by
from llmpar.footprint.op_checkpoint import rebuilt
from llmpar.spec import Spec
from llmpar.strategy import Stage

TagBytes = Mapping[frozenset[str], float]
"""Activation bytes of one micro-batch by the split tags their tensors carry."""
StageKind = tuple[object, ...]
"""(layers, MoE layers among the recomputed ones, MoE layers among the rest, holds the
embedding, holds the output layer), and under `[finetune] frozen` layer ranges the dense
and MoE blocks they freeze: what a stage's memory depends on besides the micro-batches
in flight."""


def tag_bytes(inventory: ActivationInventory) -> dict[frozenset[str], float]:
    """An inventory's bytes grouped by the split tags of its tensors."""
    found: dict[frozenset[str], float] = {}
    for group in inventory.groups:
        for tensor in group.tensors:
            found[tensor.splits] = found.get(tensor.splits, 0.0) + group.count * tensor.bytes
    for tensor in inventory.fixed:
        found[tensor.splits] = found.get(tensor.splits, 0.0) + tensor.bytes
    return found


def head_tag_bytes(inventory: ActivationInventory | None) -> dict[frozenset[str], float]:
    """The output layer's and the loss's part of `tag_bytes` (`SavedTensor.placement`
    "head"): what a schedule may hold for fewer micro-batches than the layers'
    (`Stage.head_micro_batches_in_flight`)."""
    found: dict[frozenset[str], float] = {}
    for tensor in () if inventory is None else inventory.fixed:
        if tensor.placement == "head":
            found[tensor.splits] = found.get(tensor.splits, 0.0) + tensor.bytes
    return found


def layer_tag_bytes(inventory: ActivationInventory) -> dict[frozenset[str], float]:
    """The layers' part of `tag_bytes` (not the embedding's or output layer's tensors)."""
    return tag_bytes(attrs.evolve(inventory, fixed=()))


def offloaded_layers(spec: Spec, stage: Stage) -> int:
    """Layers of `stage` whose activations wait in host memory: the first
    `activation_offload_layers`, never the stage's last."""
    limit = spec.training.activation_offload_layers
    return 0 if limit is None else max(0, min(limit, stage.num_layers - 1))


def offload_split(spec: Spec, stage: Stage, inventory: ActivationInventory
                  ) -> tuple[TagBytes, TagBytes, TagBytes]:
    """(kept on the GPU, in host memory, one layer in transit) of one micro-batch's
    activations on `stage`, by tags: the offloaded layers' share of the layers' bytes
    leaves the GPU, and one layer's worth is on its way out or back at a time."""
    kept = tag_bytes(inventory)
    k = offloaded_layers(spec, stage)
    if k == 0:
        return kept, {}, {}
    per_layer = {tags: size / stage.num_layers for tags, size in
                 layer_tag_bytes(inventory).items()}
    host = {tags: k * size for tags, size in per_layer.items()}
    return {tags: size - host.get(tags, 0.0) for tags, size in kept.items()}, host, per_layer


def with_mirror(spec: Spec, footprint: Footprint, stage: Stage, kept: TagBytes) -> TagBytes:
    """A stage's activation bytes of one micro-batch by tags, with its mirror's
    (`Stage.mirror`, DualPipe) at the mirror's share of the micro-batches in flight: the
    memory multiplies the sum by the stage's own micro-batches in flight."""
    mirror = stage.mirror
    if mirror is None:
        return kept
    share = stage.mirror_share
    found = dict(kept)
    for tags, size in tag_bytes(stage_inventory(spec, footprint, mirror)).items():
        found[tags] = found.get(tags, 0.0) + share * size
    return found


def stage_kind(spec: Spec, stage: Stage) -> StageKind:
    """The kind of a stage (see `StageKind`), in closed form."""
    model = spec.model
    limit = spec.training.recompute_layers
    head = stage.num_layers if limit is None else min(limit, stage.num_layers)
    first_moe = model.moe_layers_in(stage.first_layer, head)
    rest_moe = model.moe_layers_in(stage.first_layer + head, stage.num_layers - head)
    kind: StageKind = (stage.num_layers, first_moe, rest_moe, stage.has_embedding,
                       stage.has_head)
    chosen = every_interval_layer(spec, stage)
    if chosen is not None:  # every N-th layer recomputed: how many of them have experts
        kind = kind + (len(chosen), sum(model.is_moe_layer(index) for index in chosen))
    if stage.mirror is not None:  # DualPipe: what the mirror adds, and at what share
        kind = kind + (stage_kind(spec, stage.mirror), stage.mirror_share)
    tuned = spec.tuning
    if tuned is None or not tuned.frozen or model.num_layers is None:
        return kind
    frozen = frozen_layers_of(tuned, model.num_layers)
    free = frozenset(range(backward_free_layers_of(spec, frozen)))
    return (kind + frozen_layer_counts(model, frozen, stage)
            + frozen_layer_counts(model, free, stage))


@attrs.frozen(kw_only=True)
class StageKinds:
    """Stages grouped by kind: each kind's first stage, and the stages of each kind."""

    representatives: tuple[Stage, ...]
    members: tuple[tuple[int, ...], ...]
    """Indices (into the stages) of each kind's stages."""
    kind_of: tuple[int, ...]
    """Each stage's kind."""


def stage_kinds(spec: Spec, stages: Sequence[Stage]) -> StageKinds:
    firsts: dict[StageKind, int] = {}
    members: list[list[int]] = []
    kind_of = []
    for position, stage in enumerate(stages):
        key = stage_kind(spec, stage)
        if key not in firsts:
            firsts[key] = len(members)
            members.append([])
        members[firsts[key]].append(position)
        kind_of.append(firsts[key])
    return StageKinds(representatives=tuple(stages[m[0]] for m in members),
                      members=tuple(tuple(m) for m in members), kind_of=tuple(kind_of))


@attrs.frozen(kw_only=True)
class TrainingFacts:
    """Per training table and stage structure; every number may be an array along a
    search node's training axis (`llmpar.evaluation.batch.stack`)."""

    stage_tags: tuple[TagBytes, ...]
    """Unsplit activation bytes one micro-batch leaves on each kind of stage, by tags."""
    full_tags: TagBytes
    """The whole unsplit inventory by tags (what elementwise traffic counts)."""
    inventory_bytes: float
    """The whole unsplit inventory of one micro-batch (0 without an estimate)."""
    recomputed_fraction: float
    flops_per_step: float
    """Model FLOPs of one step, all GPUs."""
    hardware_flops_per_step: float
    """What the GPUs execute: attention as its kernel runs it, with recomputation
    (before what strategies add or skip)."""
    executed_model_flops_per_step: float
    """What the GPUs execute of the model's forward and backward, attention as its kernel
    runs it, without recomputation: the count that splits a step into its passes, the
    same whatever `attention_flops` reports."""
    attention_hardware_flops_per_step: float
    slowest_stage_factor: float
    attention_forward_flops_per_step: float = 0.0
    """One forward pass of Q.K^T and scores.V as the attention kernel executes them, all
    sequences of the step (no reruns): what splits attention's time into its kernel's
    forward and backward (`llmpar.evaluation.attention`)."""
    offloaded_tags: tuple[TagBytes, ...] = ()
    """Unsplit activation bytes of one micro-batch each kind of stage keeps in host memory
    (`[training] activation_offload_layers`); empty without offloading."""
    transit_tags: tuple[TagBytes, ...] = ()
    """One offloaded layer's unsplit bytes per kind: what is on its way at a time."""
    rerun_tags: TagBytes = attrs.field(factory=dict)
    """The whole unsplit inventory's tensors that `[training] recompute_modules` frees
    (the attention scores aside), by tags: what their recomputation writes again in the
    backward; empty without recompute_modules."""
    output_layer_hardware_flops_per_step: float = 0.0
    """The output layer's products, forward and backward, all GPUs (3 x its forward FLOPs
    per sequence x global batch; recomputation never reruns it): the product a profile
    may leave in the compute format (`Framework.fp8_output_layer`)."""
    peak_parts: tuple[KindParts, ...] = ()
    """Each kind of stage's transient buffers before splits (`llmpar.evaluation.peak`)."""
    head_tags: tuple[TagBytes, ...] = ()
    """Each kind's output-layer and loss tensors of one micro-batch, unsplit, by tags
    (empty for a kind without the output layer): part of `stage_tags`."""


def training_facts(spec: Spec, footprint: Footprint, stages: Sequence[Stage],
                   kinds: StageKinds, global_batch: int) -> TrainingFacts:
    """The facts of one training table (plain numbers)."""
    fraction = recomputed_fraction(spec, stages)
    per_sequence = footprint.train_flops_per_sequence()
    flops = (per_sequence * global_batch if per_sequence is not None
             else 6.0 * footprint.parameters.active * global_batch
             * spec.training.sequence_length)
    rerun = recompute_flops_per_sequence(spec, footprint, fraction)
    executed = footprint.executed_train_flops_per_sequence()
    hardware = (flops if executed is None else executed * global_batch) + rerun * global_batch
    hardware += finetune_flops_per_sequence(footprint) * global_batch
    activations = footprint.activations
    stage_tags: tuple[TagBytes, ...] = ()
    offloaded: tuple[TagBytes, ...] = ()
    transit: tuple[TagBytes, ...] = ()
    full: TagBytes = {}
    staged = [None if activations is None else stage_inventory(spec, footprint, stage)
              for stage in kinds.representatives]
    if activations is not None:
        splits = [offload_split(spec, stage, inventory)
                  for stage, inventory in zip(kinds.representatives, staged)
                  if inventory is not None]
        stage_tags = tuple(with_mirror(spec, footprint, stage, kept)
                           for stage, (kept, _, _) in zip(kinds.representatives, splits))
        if spec.training.activation_offload_layers is not None:
            offloaded = tuple(host for _, host, _ in splits)
            transit = tuple(moving for _, _, moving in splits)
        full = tag_bytes(activations)
    return TrainingFacts(
        stage_tags=stage_tags, full_tags=full, recomputed_fraction=fraction,
        offloaded_tags=offloaded, transit_tags=transit,
        head_tags=tuple(head_tag_bytes(inventory) if stage.has_head else {}
                        for stage, inventory in zip(kinds.representatives, staged)),
        rerun_tags=rerun_tags(spec, activations),
        peak_parts=tuple(kind_parts(spec, footprint, stage, stage_parameters(
            spec, footprint, stage), inventory, *layer_kinds(spec, stage),
            recomputed_layers(spec, stage))
            for stage, inventory in zip(kinds.representatives, staged)),
        inventory_bytes=0.0 if activations is None else activations.total_bytes,
        flops_per_step=flops, hardware_flops_per_step=hardware,
        executed_model_flops_per_step=hardware - rerun * global_batch,
        attention_hardware_flops_per_step=attention_hardware_flops_per_sequence(
            spec, footprint, fraction) * global_batch,
        output_layer_hardware_flops_per_step=output_layer_flops_per_sequence(footprint)
        * global_batch,
        attention_forward_flops_per_step=(0.0 if footprint.forward_flops_per_sequence is None
                                          else footprint.forward_flops_per_sequence
                                          .executed_attention * global_batch),
        slowest_stage_factor=slowest_stage_factor(spec, stages, fraction,
                                                   attention_share(spec, footprint)))


def output_layer_flops_per_sequence(footprint: Footprint) -> float:
    """The output layer's forward and backward FLOPs of one sequence (the backward twice
    the forward: input and weight gradients)."""
    forward = footprint.forward_flops_per_sequence
    return 0.0 if forward is None else (1.0 + BACKWARD_TO_FORWARD) * forward.logits


def finetune_flops_per_sequence(footprint: Footprint) -> float:
    """What a fine-tuning method changes in the executed FLOPs of one sequence: its
    adapters' products less the frozen weights' gradient products (`llmpar.finetune`);
    0 in full training."""
    tuned = footprint.finetune
    if tuned is None:
        return 0.0
    return tuned.adapter_flops_per_sequence - tuned.skipped_flops_per_sequence


def rerun_tags(spec: Spec, inventory: ActivationInventory | None) -> dict[frozenset[str], float]:
    """The bytes by tags of the tensors recompute_modules frees and rebuilds, attention
    scores aside (recompute = "selective" alone counts no traffic for them), or those an
    op-level `recompute_policy` writes again."""
    modules = spec.training.recomputed_modules
    found: dict[frozenset[str], float] = {}
    if (inventory is not None and spec.training.recompute_policy is not None
            and spec.training.recompute == "selective"):
        # The op-level policy reruns the whole block but what it returns from its cache
        # (llmpar.footprint.op_checkpoint.rebuilt).
        for group in inventory.groups:
            for tensor in rebuilt(group.tensors):
                found[tensor.splits] = found.get(tensor.splits, 0.0) + group.count * tensor.bytes
        return found
    if inventory is None or spec.training.recompute_modules is None or not modules:
        return {}
    for group in inventory.groups:
        for tensor in group.tensors:
            if not tensor.attention_score and freed_by(tensor, modules):
                found[tensor.splits] = (found.get(tensor.splits, 0.0)
                                        + group.count * tensor.bytes)
    return found


def attention_share(spec: Spec, footprint: Footprint) -> float:
    """The share of the s x s square the run's attention kernel executes."""
    return executed_attention_share(spec.model, spec.training.sequence_length,
                                    footprint.attention_kernel)
