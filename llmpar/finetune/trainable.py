"""Which of the parameters a pipeline stage holds get gradients and optimizer states.

Full training: all of them. An adapter method: its adapters and `modules_to_save`
copies. Method "frozen": all but the frozen groups and the groups of the frozen blocks
(`layers[a:b]`), each per-layer group in the share of the stage's blocks that have it
and are not frozen.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmpar.finetune.footprint import COPY_SUFFIX, FinetuneFootprint, beside
from llmpar.footprint.parameters import layer_norm_parameters, outer_norm_parameters
from llmpar.spec import Model
from llmpar.strategy import Stage

ATTENTION_LIKE = frozenset({"attention", "norms"})
"""Per-layer groups every block has."""
MOE_LIKE = frozenset({"experts", "shared_experts", "router"})
PER_LAYER = ATTENTION_LIKE | MOE_LIKE | {"mlp"}


def frozen_layer_counts(model: Model, frozen: frozenset[int], stage: Stage) -> tuple[int, int]:
    """(dense, MoE) blocks of `stage` that a layer range freezes."""
    found = [i for i in range(stage.first_layer, stage.first_layer + stage.num_layers)
             if i in frozen]
    moe = sum(1 for i in found if model.is_moe_layer(i))
    return sum(1 for i in found if model.has_mlp(i)) - moe, moe


def trainable_share(group: str, model: Model, frozen: frozenset[int], stage: Stage) -> float:
    """The share of a per-layer group's parameters on `stage` outside frozen blocks."""
    if group not in PER_LAYER or not frozen or not stage.num_layers:
        return 1.0
    dense_frozen, moe_frozen = frozen_layer_counts(model, frozen, stage)
    moe = model.moe_layers_in(stage.first_layer, stage.num_layers)
    if group in ATTENTION_LIKE:
        layers = range(stage.first_layer, stage.first_layer + stage.num_layers)
        return 1.0 - sum(1 for i in layers if i in frozen) / stage.num_layers
    if group in MOE_LIKE:
        return 1.0 - moe_frozen / moe if moe else 0.0
    dense = model.mlp_layers_in(stage.first_layer, stage.num_layers) - moe
    return 1.0 - dense_frozen / dense if dense else 0.0


def trainable_held(model: Model, tuned: FinetuneFootprint, stage: Stage,
                   held: Mapping[str, float]) -> dict[str, float]:
    """The trainable part of the parameters `held` (by group) on `stage`."""
    found = {}
    for group, count in held.items():
        derived = group in tuned.adapters_by_group or group.endswith(COPY_SUFFIX) and (
            group in tuned.copies_by_group)
        if derived:
            found[group] = count
        elif not tuned.trains_base or beside(group) in tuned.frozen_groups:
            found[group] = 0.0
        elif group == "norms" and tuned.frozen_layers and model.num_layers:
            # The stage's unfrozen blocks' own norms, and on the stage with the output
            # layer the norms outside the blocks (final, embedding), which a layer range
            # does not freeze (llmpar.footprint.parameters counts both in "norms").
            halves = sum(model.norms_in(index, 1) for index in range(
                stage.first_layer, stage.first_layer + stage.num_layers)
                if index not in tuned.frozen_layers)
            trained = halves * layer_norm_parameters(model) // 2
            outer = outer_norm_parameters(model) if stage.has_head else 0
            found[group] = min(count, float(trained + outer))
        else:
            found[group] = count * trainable_share(group, model, tuned.frozen_layers, stage)
    return found
