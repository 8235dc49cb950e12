"""Modelled step time of every layout of a node at once, for the built-in strategies.

It follows `llmpar.evaluation.step_time` (compute, paced by the slowest pipeline
stage, with what products lose to their shapes; + exposed communication + bubble +
optimizer step; ring attention's exchange hidden at most behind the attention
products, all hiding capped at compute, so exposed = max(sum of unhidden, all
communication - compute)) with the built-in strategies' collectives written out,
each costed by `seconds_of` (llmpar.communication):
- data: all-reduce (ZeRO 0) or reduce-scatter + all-gather of the gradients and
  weights a GPU holds, over data x context ranks (and expert-data ranks);
- tensor: an all-reduce of the hidden states 4 (6 with full recomputation) times per
  layer and micro-batch (2 of them, the backward input gradients, behind the weight
  gradients with `overlap_backward`), or with sequence parallelism an all-gather and a
  reduce-scatter each (Korthikanti et al. 2022, Sec. 4.2.2);
- context: ring send-recvs of K and V behind attention, or all-to-alls of Q, K, V
  and the output; expert: dispatch and combine all-to-alls of the routed tokens;
- pipeline: a send per micro-batch, stage boundary and direction (a 1/t slice with
  sequence parallelism or scatter-gather, which adds an all-gather over the tensor
  group); its bubble from `bubble_fraction`.
It is an estimate for pruning only; llmpar's evaluation gives every number returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from llmpar.communication.collectives import members_per_node, seconds_of
from llmpar.evaluation.balance import slowest_stage_factor
from llmpar.evaluation.matmuls import RankShape, shape_loss_seconds
from llmpar.evaluation.memory import recomputed_fraction, whole_model_stage
from llmpar.evaluation.step_time import ELEMENTWISE_PASSES, materialized_scores
from llmpar.roofline import rates_of
from llmpar.search.estimate_memory import NodeDegrees, parameters_per_gpu, split_bytes
from llmpar.search.grid import Grid
from llmpar.search.space import MICRO_BATCH, RECOMPUTE
from llmpar.strategies.expert import network_copies
from llmpar.strategies.pipeline import PipelineConfig, bubble_fraction, stage_layer_counts
from llmpar.strategy import Collective, Stage

if TYPE_CHECKING:
    from llmpar.search.facts import Facts


def seconds_per_call(facts: Facts, operation: str, buffer: np.ndarray | float, size: int,
                     stride: int) -> np.ndarray | float:
    """`call_seconds` of one collective, for an array of buffer sizes."""
    if size <= 1:
        return 0.0
    probe = Collective(strategy="search", name="probe", operation=operation, buffer_bytes=0.0,
                       group_size=size, group_stride=stride)
    seconds, _ = seconds_of(probe, facts.spec.hardware, buffer)
    return 0.0 if seconds is None else seconds


class Communication:
    """All communication of a step (S) and the part no strategy hides (E)."""

    def __init__(self) -> None:
        self.total: np.ndarray | float = 0.0
        self.exposed: np.ndarray | float = 0.0

    def add(self, seconds: np.ndarray | float, overlap: float = 0.0) -> None:
        self.total = self.total + seconds
        self.exposed = self.exposed + seconds * (1.0 - overlap)

    def add_behind(self, seconds: np.ndarray | float, work: np.ndarray | float) -> None:
        """Communication that overlaps only `work` seconds (ring attention: attention)."""
        self.total = self.total + seconds
        self.exposed = self.exposed + np.maximum(0.0, seconds - work)


def step_seconds(facts: Facts, grid: Grid, traffic: np.ndarray) -> np.ndarray:
    """Modelled step seconds, grid-shaped; `traffic` is the peak stage's optimizer bytes."""
    n = NodeDegrees.of(grid.node.degrees, facts)
    b = grid.array(MICRO_BATCH)
    m = np.maximum(1, facts.global_batch // (b.astype(np.int64) * n.d)).astype(float)
    full = grid.array(RECOMPUTE, lambda r: r == "full", "none", bool)
    sequence = grid.array("sequence", lambda on: bool(on) and facts.sequence_enabled,
                          False, bool)
    compute = (_matmul(facts, grid, n, facts.hardware_flops)
               + _shape_loss(facts, grid, n) * m
               + _elementwise(facts, grid, n, m) / facts.hbm)
    comm = Communication()
    hidden = b * facts.sequence / n.c * facts.hidden * facts.act_bytes
    passes = np.where(full, 2, 1)
    layer_calls = 2 * (passes + 1) * (facts.layers / n.p) * m
    backward_calls = 2 * (facts.layers / n.p) * m
    _data(facts, grid, n, m, comm)
    _tensor(facts, n, hidden, layer_calls, backward_calls, sequence, comm)
    attention = _matmul(facts, grid, n, facts.attention_hardware_flops, slowest=False)
    _context(facts, grid, n, b, m, comm, attention)
    _expert(facts, n, hidden, passes, m, sequence, comm)
    _pipeline(facts, grid, n, hidden, m, sequence, comm)
    exposed = np.maximum(comm.exposed, comm.total - compute)
    bubble = _bubble(facts, grid, n)
    return compute + exposed + bubble * compute + traffic / facts.hbm


def _fraction(facts: Facts, p: int, recompute: str, split: tuple[int, ...] | None) -> float:
    """Share of layers full recomputation reruns (`recomputed_fraction`)."""
    return facts.cached(("fraction", recompute, p, split), lambda: recomputed_fraction(
        facts.training(1, recompute), _stages(facts, p, split)))


def _matmul(facts: Facts, grid: Grid, n: NodeDegrees,
            flops: Callable[[str, float], float], slowest: bool = True) -> np.ndarray:
    """Seconds of `flops` (all hardware FLOPs, paced by the slowest pipeline stage, or
    the attention products') on one GPU."""
    gpu = facts.spec.hardware.gpu
    rate = facts.num_gpus * facts.peak * (gpu.matmul_efficiency or 1.0)

    def seconds(recompute: str, split: tuple[int, ...] | None) -> float:
        fraction = _fraction(facts, n.p, recompute, split)
        factor = slowest_stage_factor(facts.training(1, recompute),
                                      _stages(facts, n.p, split), fraction) if slowest else 1.0
        return flops(recompute, fraction) / rate * factor

    return grid.table((RECOMPUTE, "pipeline.layers_per_stage"), seconds, ("none", None),
                      cache=("matmul", flops.__name__, slowest, n.p))


def _shape_loss(facts: Facts, grid: Grid, n: NodeDegrees) -> np.ndarray:
    """What products lose to their shapes per micro-batch on one GPU
    (`llmpar.evaluation.matmuls`)."""
    rates = rates_of(facts.spec.hardware.gpu)

    def seconds(b: int, recompute: str, split: tuple[int, ...] | None, kind: str) -> float:
        shape = RankShape(tensor=n.t, context=n.c, expert=n.e, expert_tensor=n.x,
                          micro_batch_size=b, context_ring=kind == "ring")
        return shape_loss_seconds(facts.training(b, recompute), shape, rates, recompute,
                                  _fraction(facts, n.p, recompute, split),
                                  materialized_scores(facts.footprint(b))) / n.p

    return grid.table((MICRO_BATCH, RECOMPUTE, "pipeline.layers_per_stage", "context.kind"),
                      seconds, (1, "none", None, _pinned_context_kind(facts)),
                      cache=("shape-loss", n.t, n.c, n.e, n.x, n.p))


def _pinned_context_kind(facts: Facts) -> str:
    return getattr(facts.spec.parallel.get("context"), "kind", "ring")


def _stages(facts: Facts, p: int, split: tuple[int, ...] | None) -> tuple[Stage, ...]:
    if p == 1:
        return (whole_model_stage(facts.spec),)
    counts = stage_layer_counts(PipelineConfig(degree=p, layers_per_stage=split),
                                facts.layers or p)
    firsts = [sum(counts[:i]) for i in range(p)]
    return tuple(Stage(index=i, first_layer=firsts[i], num_layers=count, has_embedding=i == 0,
                       has_head=i == p - 1, micro_batches_in_flight=1.0)
                 for i, count in enumerate(counts))


def _elementwise(facts: Facts, grid: Grid, n: NodeDegrees, m: np.ndarray) -> np.ndarray:
    def per_gpu(b: int, recompute: str, on: bool) -> float:
        passes = ELEMENTWISE_PASSES + (2 if recompute == "full" else 0)
        sequence_on = bool(on) and facts.sequence_enabled and n.t > 1
        kept = facts.cached(("elementwise", b, sequence_on, n.t, n.c),
                            lambda: split_bytes(facts.full_tags(b), n.t, sequence_on, n.c))
        return passes * kept / n.p

    return grid.table((MICRO_BATCH, RECOMPUTE, "sequence"), per_gpu, (1, "none", False),
                      cache=("elementwise", n.t, n.c, n.p)) * m


def _data(facts: Facts, grid: Grid, n: NodeDegrees, m: np.ndarray,
          comm: Communication) -> None:
    config = facts.spec.parallel.get("data")
    grads = 1.0 if getattr(config, "overlap_grad_reduce", True) else 0.0
    gathers = 1.0 if getattr(config, "overlap_param_gather", True) else 0.0
    fsdp = bool(getattr(config, "fsdp", False))
    stage = grid.array("data.zero", lambda z: 3 if fsdp else z, 0)
    dense = n.d * n.c
    block = n.data_context_stride
    groups = ((dense, block, False), (n.expert_data, n.stride("expert") * n.e, True))
    for size, stride, experts in groups:
        params = parameters_per_gpu(facts, n, experts)
        if size <= 1 or params <= 0:
            continue
        reduce = seconds_per_call(facts, "all-reduce", params * facts.grad_bytes, size, stride)
        scatter = seconds_per_call(facts, "reduce-scatter", params * facts.grad_bytes, size,
                                   stride)
        gather = seconds_per_call(facts, "all-gather", params * facts.weight_bytes, size,
                                  stride)
        comm.add(np.where(stage == 0, reduce, 0.0), grads)
        comm.add(np.where(stage >= 1, scatter * np.where(stage == 3, m, 1.0), 0.0), grads)
        comm.add(np.where(stage >= 1, gather * np.where(stage == 3, 2 * m, 1.0), 0.0), gathers)


def _tensor(facts: Facts, n: NodeDegrees, hidden: np.ndarray, calls: np.ndarray,
            backward: np.ndarray, sequence: np.ndarray, comm: Communication) -> None:
    """`calls` per-layer collectives, of which `backward` (the input gradients) may run
    behind the weight gradients."""
    if n.t == 1:
        return
    stride = n.stride("tensor")
    reduce = seconds_per_call(facts, "all-reduce", hidden, n.t, stride)
    gather = seconds_per_call(facts, "all-gather", hidden, n.t, stride)
    tensor = _overlap_backward(facts, "tensor")
    sequence_overlap = _overlap_backward(facts, "sequence")
    comm.add(np.where(sequence, gather * (2 * calls - backward), reduce * (calls - backward)))
    comm.add(np.where(sequence, 0.0, reduce * backward), tensor)
    comm.add(np.where(sequence, gather * backward, 0.0), sequence_overlap)


def _overlap_backward(facts: Facts, strategy: str) -> float:
    config = facts.spec.parallel.get(strategy)
    return 1.0 if getattr(config, "overlap_backward", True) else 0.0


def _context(facts: Facts, grid: Grid, n: NodeDegrees, b: np.ndarray, m: np.ndarray,
             comm: Communication, attention: np.ndarray) -> None:
    if n.c == 1:
        return
    model = facts.spec.model
    chunk = b * facts.sequence / n.c
    layers = facts.layers / n.p
    ring_bytes = chunk * 2 * model.kv_width / n.t * facts.act_bytes
    ring = seconds_per_call(facts, "send-recv", ring_bytes, n.c, n.stride("context")) * (
        3 * (n.c - 1) * layers * m)
    width = (2 * model.query_width + 2 * model.kv_width) / n.t
    swap = seconds_per_call(facts, "all-to-all", chunk * width * facts.act_bytes, n.c,
                            n.stride("context")) * (
        2 * layers * m)
    all_to_all = grid.array("context.kind", lambda k: k == "all-to-all", "ring", bool)
    comm.add_behind(np.where(all_to_all, 0.0, ring), attention)
    comm.add(np.where(all_to_all, swap, 0.0))


def _expert(facts: Facts, n: NodeDegrees, hidden: np.ndarray, passes: np.ndarray,
            m: np.ndarray, sequence: np.ndarray, comm: Communication) -> None:
    moe = facts.spec.model.moe
    if moe is None or n.e == 1:
        return
    stride = n.stride("expert")
    dispatcher = getattr(facts.spec.parallel.get("expert"), "dispatcher", "all-to-all")
    copies = network_copies(dispatcher, moe.experts_per_token, n.e,
                            members_per_node(n.e, stride, facts.gpus_per_node))
    tokens = hidden * copies / np.where(sequence, n.t, 1)
    calls = 2 * (passes + 1) * (facts.moe_layers / n.p) * m
    comm.add(seconds_per_call(facts, "all-to-all", tokens, n.e, stride) * calls)


def _pipeline(facts: Facts, grid: Grid, n: NodeDegrees, hidden: np.ndarray, m: np.ndarray,
              sequence: np.ndarray, comm: Communication) -> None:
    if n.p == 1:
        return
    scatter = bool(getattr(facts.spec.parallel.get("pipeline"), "scatter_gather", True))
    boundary = hidden / (n.t if scatter else np.where(sequence, n.t, 1))
    v = grid.array("pipeline.virtual_stages", default=1)
    calls = 2 * m * v
    sends = seconds_per_call(facts, "send-recv", boundary, 2, n.stride("pipeline"))
    comm.add(sends * calls)
    if scatter and n.t > 1:
        gather = seconds_per_call(facts, "all-gather", hidden, n.t, n.stride("tensor"))
        comm.add(np.where(sequence, 0.0, gather) * calls)


def _bubble(facts: Facts, grid: Grid, n: NodeDegrees) -> np.ndarray:
    if n.p == 1:
        return grid.along(None, [0.0])

    def fraction(b: int, schedule: str, v: int) -> float:
        m = max(1, facts.global_batch // (b * n.d))
        return facts.cached(("bubble", n.p, schedule, v, m), lambda: bubble_fraction(
            PipelineConfig(degree=n.p, schedule=schedule, virtual_stages=v), m))

    return grid.table((MICRO_BATCH, "pipeline.schedule", "pipeline.virtual_stages"),
                      fraction, (1, "1f1b", 1),
                      cache=("bubble", n.p, n.d))
