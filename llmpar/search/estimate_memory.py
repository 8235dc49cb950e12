"""Per-GPU memory of every layout of a node at once, for the built-in strategies.

It follows `llmpar.evaluation.memory` (per stage: model states under the
strategies' shards, activations under their splits times the micro-batches in
flight, buffers; the peak over stages) with the built-in strategies' shards and
splits written out:
- data (llmpar.strategies.data): ZeRO stage k shards optimizer states (k >= 1),
  gradients (k >= 2) and weights (k = 3) over data x context ranks, expert weights
  over data x context / expert ranks; FSDP keeps two gathered layers;
- tensor: every split group by t, attention by `attention_divisor`; activations
  tagged "tensor" by t, "sequence" by t too with sequence parallelism;
- context: activations tagged "context" by c; expert: expert weights by e;
- pipeline: stages from `stage_layer_counts`, micro-batches from `in_flight`.
It is an estimate for pruning only; llmpar's evaluation gives every number returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import numpy as np

from llmpar.evaluation.memory import whole_model_stage
from llmpar.placement import EXPERT_TENSOR, RANK_ORDER, data_context_stride, stride
from llmpar.search.exact import stage_kind
from llmpar.search.grid import Grid
from llmpar.search.space import MICRO_BATCH, RECOMPUTE
from llmpar.strategies.common import EXPERT_GROUPS, TENSOR_SPLIT_GROUPS
from llmpar.strategies.data import FSDP_PREFETCH_LAYERS
from llmpar.strategies.pipeline import PipelineConfig, in_flight, stage_layer_counts
from llmpar.strategy import Stage

if TYPE_CHECKING:
    from llmpar.search.facts import Facts, TagBytes

COMPONENT_LEVELS = (("weights", 3), ("gradients", 2), ("optimizer", 1))
"""Each model-state component and the lowest ZeRO stage that shards it."""


@attrs.frozen(kw_only=True)
class NodeDegrees:
    t: int
    c: int
    d: int
    e: int
    p: int
    order: tuple[str, ...] = RANK_ORDER
    pinned_expert_tensor: int | None = None
    """`[parallel.expert] tensor_degree` when the spec pins it."""

    @classmethod
    def of(cls, degrees: Mapping[str, int], facts: Facts | None = None) -> NodeDegrees:
        spec = None if facts is None else facts.spec
        return cls(t=degrees.get("tensor", 1), c=degrees.get("context", 1),
                   d=degrees.get("data", 1), e=degrees.get("expert", 1),
                   p=degrees.get("pipeline", 1),
                   order=RANK_ORDER if spec is None else spec.rank_order,
                   pinned_expert_tensor=None if spec is None else getattr(
                       spec.parallel.get("expert"), "tensor_degree", None))

    @property
    def x(self) -> int:
        """Expert tensor degree (`Layout.expert_tensor`)."""
        return self.t if self.pinned_expert_tensor is None else self.pinned_expert_tensor

    @property
    def expert_data(self) -> int:
        """Ranks sharding expert states (data.shard_degrees)."""
        return max(1, self.d * self.c * self.t // self.x // self.e)

    @property
    def degrees(self) -> dict[str, int]:
        return {"tensor": self.t, "context": self.c, "data": self.d, "expert": self.e,
                "pipeline": self.p, EXPERT_TENSOR: self.x}

    def stride(self, strategy: str) -> int:
        """`Layout.stride` of these degrees (llmpar.placement)."""
        return stride(self.order, self.degrees, strategy)

    @property
    def data_context_stride(self) -> int:
        """Where the data x context ranks start (llmpar.placement)."""
        return data_context_stride(self.order, self.degrees)


def stage_kinds(facts: Facts, p: int, split: tuple[int, ...] | None) -> list[Stage]:
    """The first stage of each kind, in stage order (as the pipeline transform builds
    them; one whole-model stage without a pipeline)."""
    spec = facts.spec
    if p == 1:
        return [whole_model_stage(spec)]
    config = PipelineConfig(degree=p, layers_per_stage=split)
    counts = stage_layer_counts(config, spec.model.num_layers or p)
    firsts: dict[tuple[object, ...], Stage] = {}
    first = 0
    for index, count in enumerate(counts):
        last = index == p - 1
        stage = Stage(index=index, first_layer=first, num_layers=count,
                      has_embedding=index == 0 or (last and spec.model.tie_embeddings),
                      has_head=last, micro_batches_in_flight=0.0)
        firsts.setdefault(stage_kind(spec, stage), stage)
        first += count
    return list(firsts.values())


def states(facts: Facts, parameters: Mapping[str, float], n: NodeDegrees,
           stage: int) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes on one GPU of a stage holding `parameters`."""
    moe = facts.spec.model.moe is not None
    dense = n.d * n.c
    sizes = {"weights": facts.weight_bytes, "gradients": facts.grad_bytes,
             "optimizer": facts.optimizer_bytes}
    found = []
    for component, level in COMPONENT_LEVELS:
        total = 0.0
        for group, count in parameters.items():
            divisors: list[float] = []
            if stage >= level:
                divisors.append(n.expert_data if group in EXPERT_GROUPS else dense)
            if n.t > 1 and group == "attention":
                divisors.append(facts.attention_divisor(n.t))
            elif group in EXPERT_GROUPS:
                divisors.append(n.x)
            elif n.t > 1 and group in TENSOR_SPLIT_GROUPS:
                divisors.append(n.t)
            if moe and n.e > 1 and group in EXPERT_GROUPS:
                divisors.append(n.e)
            total += count * sizes[component] / math.prod(divisors)
        found.append(round(total))
    return found[0], found[1], found[2]


def split_bytes(tags: TagBytes, t: int, sequence_on: bool, c: int) -> float:
    """Activation bytes after the tensor, sequence and context splits."""
    total = 0.0
    for tagset, size in tags:
        divisor = 1
        if t > 1 and "tensor" in tagset:
            divisor *= t
        if sequence_on and "sequence" in tagset:
            divisor *= t
        if c > 1 and "context" in tagset:
            divisor *= c
        total += size / divisor
    return total


def parameters_per_gpu(facts: Facts, n: NodeDegrees, experts: bool) -> float:
    """data.parameters_per_gpu: parameters one GPU holds before ZeRO."""
    total = 0.0
    for group, count in facts.by_group.items():
        if (group in EXPERT_GROUPS) != experts:
            continue
        divisor = n.p
        if group in EXPERT_GROUPS:
            divisor *= n.e * n.x
        elif group in TENSOR_SPLIT_GROUPS or group == "all":
            divisor *= n.t
        total += count / divisor
    return total


def fsdp_buffer(facts: Facts, n: NodeDegrees) -> int:
    if not facts.layers:
        return 0  # as llmpar.strategies.data: no layers to prefetch
    held = parameters_per_gpu(facts, n, False) + parameters_per_gpu(facts, n, True)
    per_layer = held * n.p / facts.layers
    return round(FSDP_PREFETCH_LAYERS * per_layer * facts.weight_bytes)


def zero_stages(facts: Facts, grid: Grid) -> list[int]:
    fsdp = bool(getattr(facts.spec.parallel.get("data"), "fsdp", False))
    return [3 if fsdp else z for z in grid.values("data.zero", 0)]


def memory(facts: Facts, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(peak bytes per GPU, optimizer-step traffic of the peak stage), grid-shaped."""
    n = NodeDegrees.of(grid.node.degrees, facts)
    zeros = zero_stages(facts, grid)
    data_axis = grid.axis("data.zero")
    buffer = grid.along(data_axis, [fsdp_buffer(facts, n) if z == 3 else 0 for z in zeros])
    best = np.full(grid.shape, -1.0)
    traffic = np.zeros(grid.shape)
    for split in dict.fromkeys(grid.values("pipeline.layers_per_stage", None)):
        mask = grid.array("pipeline.layers_per_stage", lambda s, k=split: s == k, None, bool)
        stages = stage_kinds(facts, n.p, split)
        kinds = [stage_kind(facts.spec, stage) for stage in stages]
        kept = _kept(facts, grid, n, stages, kinds)
        flight = _in_flight(facts, grid, n, stages)
        for k, (stage, kind) in enumerate(zip(stages, kinds)):
            by_zero = _states_by_zero(facts, stage, kind, n, zeros)
            model_states = grid.along(data_axis, [sum(s) for s in by_zero])
            moved = grid.along(data_axis, [2 * (o + w) + g for w, g, o in by_zero])
            total = model_states + np.rint(kept[..., k] * flight[..., k]) + buffer
            better = mask & (total > best)
            best = np.where(better, total, best)
            traffic = np.where(better, moved, traffic)
    return best, traffic


def _states_by_zero(facts: Facts, stage: Stage, kind: tuple[object, ...], n: NodeDegrees,
                    zeros: list[int]) -> list[tuple[int, int, int]]:
    parameters = facts.stage_parameters(stage, kind)
    return [facts.cached(("states", kind, n.t, n.d * n.c, n.e, z),
                         lambda z=z: states(facts, parameters, n, z)) for z in zeros]


def _kept(facts: Facts, grid: Grid, n: NodeDegrees, stages: list[Stage],
          kinds: list[tuple[object, ...]]) -> np.ndarray:
    """Activation bytes of one micro-batch per stage kind, after the splits."""

    def kept_bytes(b: int, recompute: str, on: bool) -> list[float]:
        sequence_on = bool(on) and facts.sequence_enabled and n.t > 1
        return [facts.cached(("kept", kind, b, recompute, sequence_on, n.t, n.c),
                             lambda s=stage, k=kind: split_bytes(
                                 facts.stage_tags(s, k, b, recompute), n.t, sequence_on, n.c))
                for stage, kind in zip(stages, kinds)]

    return grid.table((MICRO_BATCH, RECOMPUTE, "sequence"), kept_bytes, (1, "none", False),
                      width=len(stages), cache=("kept", tuple(kinds), n.t, n.c))


def _in_flight(facts: Facts, grid: Grid, n: NodeDegrees, stages: list[Stage]) -> np.ndarray:
    """Micro-batches in flight per stage kind (`in_flight`)."""
    if n.p == 1:
        return np.ones((1,) * len(grid.shape) + (len(stages),))

    def held(b: int, schedule: str, v: int, split: tuple[int, ...] | None) -> list[float]:
        m = max(1, facts.global_batch // (b * n.d))
        config = PipelineConfig(degree=n.p, schedule=schedule, virtual_stages=v,
                                layers_per_stage=split)
        return [in_flight(config, stage.index, m) for stage in stages]

    return grid.table((MICRO_BATCH, "pipeline.schedule", "pipeline.virtual_stages",
                       "pipeline.layers_per_stage"), held, (1, "1f1b", 1, None),
                      width=len(stages),
                      cache=("in_flight", n.p, n.d, tuple(s.index for s in stages)))
