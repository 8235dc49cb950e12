"""Pipeline stages: which parameters and saved activations each one holds, and what
recomputation keeps of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.finetune.activations import without_backward
from llmpar.finetune.footprint import beside
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.inventory import (
    ActivationInventory,
    drop_attention_scores,
    drop_recomputed_modules,
    keep_layer_inputs,
)
from llmpar.footprint.mtp import mtp_block_model
from llmpar.footprint.op_checkpoint import SOURCE as OP_SOURCE
from llmpar.footprint.op_checkpoint import op_checkpointed
from llmpar.spec import Spec
from llmpar.strategy import Stage, Transform

PER_LAYER_GROUPS = ("attention", "norms", "all")
DENSE_GROUPS = ("mlp",)
MOE_GROUPS = ("experts", "shared_experts", "router")


def whole_model_stage(spec: Spec) -> Stage:
    """One stage holding everything: the layout without pipeline parallelism."""
    return Stage(index=0, first_layer=0, num_layers=spec.model.num_layers or 0,
                 has_embedding=True, has_head=True, micro_batches_in_flight=1.0)


def stages_of(spec: Spec, transforms: Iterable[Transform]) -> tuple[Stage, ...]:
    """The first transform's stages (by phase), or one stage holding everything."""
    for transform in transforms:
        if transform.stages:
            return transform.stages
    return (whole_model_stage(spec),)


def layer_kinds(spec: Spec, stage: Stage) -> tuple[int, int]:
    """(dense layers, MoE layers) of a stage."""
    model = spec.model
    moe = model.moe_layers_in(stage.first_layer, stage.num_layers)
    return model.mlp_layers_in(stage.first_layer, stage.num_layers) - moe, moe


def hybrid_kinds(spec: Spec, stage: Stage) -> dict[str, int] | None:
    """A hybrid model's layers of a stage by kind (`Model.hybrid_kinds_in`); None for a
    model whose every layer attends."""
    if not spec.model.layer_kinds_vary:
        return None
    return spec.model.hybrid_kinds_in(stage.first_layer, stage.num_layers)


def stage_parameters(spec: Spec, footprint: Footprint, stage: Stage) -> dict[str, float]:
    """Parameters by group that one stage holds, before any sharding; with a mirror
    (`Stage.mirror`, DualPipe), the mirror stage's too."""
    if stage.mirror is not None:
        own = stage_parameters(spec, footprint, attrs.evolve(stage, mirror=None))
        mirror = stage_parameters(spec, footprint, stage.mirror)
        return {group: own.get(group, 0.0) + mirror.get(group, 0.0)
                for group in {**own, **mirror}}
    model = spec.model
    by_group = footprint.parameters_by_group
    if not model.num_layers:  # a model given by its size: one stage holds it all
        return by_group
    layers = model.num_layers
    dense, moe = layer_kinds(spec, stage)
    share = {"embedding": float(stage.has_embedding), "head": float(stage.has_head)}
    share.update(dict.fromkeys(PER_LAYER_GROUPS, stage.num_layers / layers))
    share.update(dict.fromkeys(DENSE_GROUPS, dense / max(1, model.num_dense_layers)))
    share.update(dict.fromkeys(MOE_GROUPS, moe / max(1, model.num_moe_layers)))
    if model.mixer_pattern is not None:  # each token mixer's layers hold its group
        held, total = (model.mixers_in(stage.first_layer, stage.num_layers),
                       model.mixers_in(0, layers))
        share.update({kind: held.get(kind, 0) / count for kind, count in total.items()})
    if model.single_module_layers:  # one norm per single-module layer, two per other
        share["norms"] = (model.norms_in(stage.first_layer, stage.num_layers)
                          / model.norms_in(0, layers))
    # Adapters and trained copies sit where their base group does (llmpar.finetune).
    default = stage.num_layers / layers
    stage_held = {group: count * (share[group] if group in share else
                                  share.get(beside(group), default))
                  for group, count in by_group.items()}
    if stage.has_head and footprint.mtp_by_group:  # trained MTP modules: the last stage's
        for group, count in footprint.mtp_by_group.items():
            stage_held[group] = stage_held.get(group, 0.0) + count
    return stage_held


def recomputed(inventory: ActivationInventory, spec: Spec) -> ActivationInventory:
    """The inventory under `[training] recompute` (Korthikanti et al. 2022, Sec. 5) and
    `recompute_modules` (Megatron-Core's --recompute-modules) or `recompute_policy`
    (torchtitan's op-level checkpointing)."""
    mode = spec.training.recompute
    if mode == "selective":
        if spec.training.recompute_policy is not None:
            return op_checkpointed(inventory, spec)
        modules = spec.training.recompute_modules
        if modules is None:
            return drop_attention_scores(inventory)
        return drop_recomputed_modules(inventory, modules)
    if mode == "full":
        assert spec.model.hidden_size is not None
        return keep_layer_inputs(inventory, spec.training.micro_batch_size,
                                 spec.training.sequence_length, spec.model.hidden_size,
                                 bytes_per_element(spec.precision.activations))
    return inventory


def recompute_modules_text(spec: Spec) -> str:
    """For derivations: the modules selective recomputation drops, when named, or the
    op-level policy's and the layer interval's rule."""
    training = spec.training
    if training.recompute == "selective" and training.recompute_policy is not None:
        return (f" (recompute_policy = {training.recompute_policy}: each layer keeps its "
                "input and the outputs of the ops torchtitan's checkpoint policy saves; "
                f"{OP_SOURCE})")
    if training.recompute == "full" and training.recompute_layer_interval is not None:
        return (f" (recompute_layer_interval = {training.recompute_layer_interval}: every "
                "N-th layer of a stage keeps only its input, the others everything)")
    modules = spec.training.recompute_modules
    if modules is None or spec.training.recompute != "selective":
        return ""
    return (" (recompute_modules = " + ", ".join(modules) + ": each drops the tensors "
            "saved inside it and keeps its input)")


def recomputed_layers(spec: Spec, stage: Stage) -> int:
    """Layers of `stage` that full recomputation reruns: all, the first
    `recompute_layers`, or every `recompute_layer_interval`-th (torchtitan's
    `selective_ac_option = "N"`: a counter over the stage's blocks wraps those whose count
    is a multiple of N, torchtitan v0.2.2 activation_checkpoint.py `_apply_layer_sac`)."""
    if spec.training.recompute != "full":
        return 0
    interval = spec.training.recompute_layer_interval
    if interval is not None:
        return stage.num_layers // interval
    limit = spec.training.recompute_layers
    return stage.num_layers if limit is None else min(limit, stage.num_layers)


def interval_layers(spec: Spec, stage: Stage) -> tuple[int, ...] | None:
    """The layers (model indices) `recompute_layer_interval` recomputes on `stage`: the
    N-th, 2N-th... of its layers (torchtitan counts its blocks from 1 and checkpoints
    those whose count is a multiple of N); None without the interval or full
    recomputation."""
    if spec.training.recompute != "full":
        return None
    return every_interval_layer(spec, stage)


def every_interval_layer(spec: Spec, stage: Stage) -> tuple[int, ...] | None:
    """`interval_layers` whatever the recomputation mode (a search node's modes are an
    array; the stages' kinds must not depend on them); None without the interval."""
    interval = spec.training.recompute_layer_interval
    if interval is None:
        return None
    return tuple(range(stage.first_layer + interval - 1, stage.first_layer + stage.num_layers,
                       interval))


def _kinds_of(spec: Spec, layers: tuple[int, ...]) -> tuple[int, int, dict[str, int] | None]:
    """(dense, MoE, hybrid kinds) of the given layers."""
    model = spec.model
    moe = sum(model.is_moe_layer(index) for index in layers)
    hybrid: dict[str, int] | None = None
    if model.layer_kinds_vary:
        hybrid = {}
        for index in layers:
            for kind, count in model.hybrid_kinds_in(index, 1).items():
                hybrid[kind] = hybrid.get(kind, 0) + count
    return sum(model.has_mlp(index) for index in layers) - moe, moe, hybrid


def stage_inventory(spec: Spec, footprint: Footprint, stage: Stage) -> ActivationInventory:
    """The stage's saved tensors; under partial full recomputation its first layers
    keep only their inputs and the others keep everything; blocks no backward pass runs
    through (`[finetune]`, llmpar.finetune.activations) keep nothing."""
    inventory = _stage_inventory(spec, footprint, stage)
    if stage.has_head and footprint.mtp_by_group:
        inventory = _with_mtp_tensors(spec, footprint, inventory)
    tuned = footprint.finetune
    if tuned is None:
        return inventory
    return without_backward(spec, tuned, stage, inventory)


def _with_mtp_tensors(spec: Spec, footprint: Footprint,
                      inventory: ActivationInventory) -> ActivationInventory:
    """The last stage's tensors with the trained MTP modules' (`[training]
    multi_token_prediction`): each depth's block, saved as a layer of its kind is (under
    the run's recomputation), and a second copy of the output layer's and loss's tensors
    per depth (each depth's logits and cross entropy, arXiv:2412.19437, Eq. 24)."""
    assert footprint.activations is not None
    whole, depth = footprint.activations, spec.model.mtp_layers
    block = mtp_block_model(spec.model, depth)
    dense, moe = block.num_dense_layers, block.num_moe_layers
    counts: dict[str, int] = {"dense": dense, "moe": moe, "layer": dense + moe}
    if spec.model.layer_kinds_vary:
        counts.update(block.hybrid_kinds_in(0, depth))
    layers = tuple(attrs.evolve(g, count=counts[g.kind]) for g in whole.groups
                   if counts.get(g.kind))
    saved = recomputed(attrs.evolve(whole, groups=layers, fixed=()), spec)
    heads = tuple(attrs.evolve(t, name=f"MTP depth {k} {t.name}") for k in range(1, depth + 1)
                  for t in whole.fixed if t.placement == "head")
    return attrs.evolve(inventory, groups=inventory.groups + saved.groups,
                        fixed=inventory.fixed + heads)


def _stage_inventory(spec: Spec, footprint: Footprint, stage: Stage) -> ActivationInventory:
    assert footprint.activations is not None
    inventory = footprint.activations
    rerun = recomputed_layers(spec, stage)
    chosen = interval_layers(spec, stage)
    if chosen is not None and rerun not in (0, stage.num_layers):
        # every N-th layer: its kinds counted layer by layer, the rest keep everything
        rest = tuple(sorted(set(range(stage.first_layer, stage.first_layer + stage.num_layers))
                            - set(chosen)))
        dense, moe, hybrid = _kinds_of(spec, chosen)
        checkpoints = recomputed(inventory.for_stage(dense, moe, False, False, hybrid), spec)
        dense, moe, hybrid = _kinds_of(spec, rest)
        kept = inventory.for_stage(dense, moe, stage.has_embedding, stage.has_head, hybrid)
        return attrs.evolve(kept, groups=checkpoints.groups + kept.groups)
    if rerun in (0, stage.num_layers):
        dense, moe = layer_kinds(spec, stage)
        staged = inventory.for_stage(dense, moe, stage.has_embedding, stage.has_head,
                                     hybrid_kinds(spec, stage))
        return recomputed(staged, spec)
    head = attrs.evolve(stage, num_layers=rerun)
    tail = attrs.evolve(stage, first_layer=stage.first_layer + rerun,
                        num_layers=stage.num_layers - rerun)
    checkpoints = recomputed(inventory.for_stage(*layer_kinds(spec, head), False, False,
                                                 hybrid_kinds(spec, head)), spec)
    kept = inventory.for_stage(*layer_kinds(spec, tail), stage.has_embedding, stage.has_head,
                               hybrid_kinds(spec, tail))
    return attrs.evolve(kept, groups=checkpoints.groups + kept.groups)


def recomputed_fraction(spec: Spec, stages: Sequence[Stage]) -> float:
    """Share of all layers whose forward full recomputation reruns."""
    layers = sum(stage.num_layers for stage in stages)
    return sum(recomputed_layers(spec, s) for s in stages) / layers if layers else 0.0
