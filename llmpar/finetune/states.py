"""The parameters each model-state component counts on one kind of pipeline stage:
weights (every parameter held, a quantized base at its bytes per weight), gradients
and optimizer states (the trainable ones only, `llmpar.finetune.trainable`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmpar.finetune.footprint import FinetuneFootprint
from llmpar.finetune.trainable import trainable_held
from llmpar.spec import Spec
from llmpar.strategy import Stage

StateCounts = Mapping[str, Mapping[str, float]]
"""Per component ("weights", "gradients", "optimizer"): parameters by group. Weights
count a quantized group as weight_factor x its parameters (16-bit equivalents), so
that every strategy's shards and bytes per parameter apply to it unchanged."""


def state_counts(spec: Spec, tuned: FinetuneFootprint, stage: Stage,
                 held: Mapping[str, float]) -> StateCounts:
    trainable = trainable_held(spec.model, tuned, stage, held)
    factors = tuned.weight_factors
    weights = {group: count * factors.get(group, 1.0) for group, count in held.items()}
    return {"weights": weights, "gradients": trainable, "optimizer": trainable}


def kinds_state_counts(spec: Spec, tuned: FinetuneFootprint | None, stages: Sequence[Stage],
                       parameters: Sequence[Mapping[str, float]]
                       ) -> tuple[StateCounts, ...] | None:
    """Each kind of stage's counts (its representative `stages`); None in full training,
    where every component counts `parameters`."""
    if tuned is None:
        return None
    return tuple(state_counts(spec, tuned, stage, held)
                 for stage, held in zip(stages, parameters))


def counts_of(component: str, parameters: Sequence[Mapping[str, float]],
              states: Sequence[StateCounts] | None) -> Sequence[Mapping[str, float]]:
    """Each kind's parameters that `component` counts."""
    return parameters if states is None else [kind[component] for kind in states]
