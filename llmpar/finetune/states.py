"""The parameters each model-state component counts on one kind of pipeline stage:
weights (every parameter held, a quantized base at its bytes per weight), gradients
and optimizer states (the trainable ones only, `llmpar.finetune.trainable`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmpar.arrays import Value, largest
from llmpar.evaluation.compose import Composition
from llmpar.finetune.footprint import FinetuneFootprint
from llmpar.finetune.trainable import trainable_held
from llmpar.spec import Spec
from llmpar.strategy import Stage

DEQUANTIZED = "dequantized"
"""The key of QLoRA's bytes moved per pass to dequantize the base, by group."""
StateCounts = Mapping[str, Mapping[str, float]]
"""Per component ("weights", "gradients", "optimizer"): parameters by group. Weights
count a quantized group as weight_factor x its parameters (16-bit equivalents), so
that every strategy's shards and bytes per parameter apply to it unchanged."""


def state_counts(spec: Spec, tuned: FinetuneFootprint, stage: Stage,
                 held: Mapping[str, float]) -> StateCounts:
    trainable = trainable_held(spec.model, tuned, stage, held)
    factors = tuned.weight_factors
    weights = {group: count * factors.get(group, 1.0) for group, count in held.items()}
    found = {"weights": weights, "gradients": trainable, "optimizer": trainable}
    if tuned.dequantized_bytes:
        found[DEQUANTIZED] = {group: held[group] * size
                              for group, size in tuned.dequantized_bytes.items() if group in held}
    return found


def kinds_state_counts(spec: Spec, tuned: FinetuneFootprint | None, stages: Sequence[Stage],
                       parameters: Sequence[Mapping[str, float]]
                       ) -> tuple[StateCounts, ...] | None:
    """Each kind of stage's counts (its representative `stages`); None in full training,
    where every component counts `parameters`."""
    if tuned is None:
        return None
    return tuple(state_counts(spec, tuned, stage, held)
                 for stage, held in zip(stages, parameters))


def dequantized_bytes_per_pass(composition: Composition,
                               counts: Sequence[StateCounts] | None) -> Value:
    """QLoRA: bytes one GPU moves to dequantize its base layers for one pass over its
    stage (the busiest kind): each layer is dequantized whole, also where ZeRO-3 shards
    its storage (it is gathered first), so the data-parallel shards do not divide it."""
    if counts is None or DEQUANTIZED not in counts[0]:
        return 0.0
    return largest(composition.held(kind[DEQUANTIZED], 1.0, "weights", without="data")
                   for kind in counts)


def counts_of(component: str, parameters: Sequence[Mapping[str, float]],
              states: Sequence[StateCounts] | None) -> Sequence[Mapping[str, float]]:
    """Each kind's parameters that `component` counts."""
    return parameters if states is None else [kind[component] for kind in states]
