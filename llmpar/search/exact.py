"""The exact memory and step time of one layout, as `llmpar.evaluate` computes them,
with what layouts share computed once.

`build_plan` (llmpar.evaluation.evaluate) composes footprint, transforms, memory,
FLOPs and step time. This follows the same composition with two savings: the
baseline footprint is kept per `[training]` table (it reads the model, the
precision and the training fields, never the layout), and memory is computed
only for one stage of each kind (same layers, same embedding and output layer):
among stages of a kind the one with the most micro-batches in flight has the most
memory, which is the one the peak can be. tests/test_search_exact.py checks that
the numbers equal `llmpar.evaluate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from llmpar.evaluation.evaluate import transforms_of
from llmpar.evaluation.memory import per_gpu_memory, recomputed_fraction, stages_of
from llmpar.evaluation.step_time import step_time
from llmpar.evaluation.timing import step_flops
from llmpar.footprint.baseline import Footprint, baseline_footprint
from llmpar.strategy import Stage, Transform

if TYPE_CHECKING:
    from llmpar.spec import Spec, Training
    from llmpar.strategy import Layout, Strategy


@attrs.frozen(kw_only=True)
class Score:
    """What ranking needs of a layout's plan."""

    total_bytes: int
    step_seconds: float | None
    time_model: str


def stage_kind(spec: Spec, stage: Stage) -> tuple[object, ...]:
    """What a stage's memory depends on besides the micro-batches in flight."""
    model = spec.model
    layers = range(stage.first_layer, stage.first_layer + stage.num_layers)
    kinds = tuple(model.is_moe_layer(i) for i in layers) if model.moe is not None else ()
    return stage.num_layers, kinds, stage.has_embedding, stage.has_head


def peak_candidates(spec: Spec, stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """One stage per kind: the first with the most micro-batches in flight."""
    best: dict[tuple[object, ...], Stage] = {}
    for stage in stages:
        kind = stage_kind(spec, stage)
        held = best.get(kind)
        if held is None or stage.micro_batches_in_flight > held.micro_batches_in_flight:
            best[kind] = stage
    return tuple(sorted(best.values(), key=lambda s: s.index))


def _with_stages(transforms: list[Transform], stages: tuple[Stage, ...]) -> list[Transform]:
    return [attrs.evolve(t, stages=stages) if t.stages else t for t in transforms]


class ExactScorer:
    """Scores layouts of one searched spec; keeps footprints per training table."""

    def __init__(self, strategies: Mapping[str, Strategy]):
        self.strategies = strategies
        self._footprints: dict[Training, Footprint] = {}

    def footprint(self, spec: Spec) -> Footprint:
        found = self._footprints.get(spec.training)
        if found is None:
            found = self._footprints[spec.training] = baseline_footprint(spec)
        return found

    def score(self, spec: Spec, layout: Layout) -> Score:
        """The plan's total_bytes and step_seconds, without building the plan."""
        footprint = self.footprint(spec)
        transforms = transforms_of(spec, footprint, layout, self.strategies)
        stages = stages_of(spec, transforms)
        memory = per_gpu_memory(spec, footprint,
                                _with_stages(transforms, peak_candidates(spec, stages)))
        extra = sum(t.extra_flops_per_step for t in transforms)
        flops = step_flops(spec, footprint, layout.degree("data"), extra,
                           recomputed_fraction(spec, stages))
        counts = [t.micro_batches_per_step for t in transforms if t.micro_batches_per_step]
        time = step_time(spec, footprint, layout, flops, transforms, memory,
                         counts[0] if counts else 1)
        return Score(total_bytes=memory.peak.total_bytes, step_seconds=time.step_seconds,
                     time_model=time.time_model)
