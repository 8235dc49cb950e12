"""The built-in strategies' checks over a whole node at once.

Each rule mirrors a `check` of a strategy in llmpar/strategies/ (named below), in the
order `spec_problems` runs them (by phase), and gives the key path of the first
problem, as `spec_problems(...)[0].path` would. Every layout the search keeps is
checked again by the strategies themselves; tests/test_search_fast.py compares the
rules with `spec_problems` layout by layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llmpar.search.estimate_memory import NodeDegrees
from llmpar.search.grid import Grid
from llmpar.search.space import MICRO_BATCH

if TYPE_CHECKING:
    from llmpar.search.facts import Facts

PATHS = ("$.training.global_batch_size", "$.parallel.tensor.degree",
         "$.parallel.context.degree", "$.parallel.context.kind", "$.parallel.expert.degree",
         "$.parallel.expert.tensor_degree", "$.parallel.pipeline.degree",
         "$.parallel.pipeline.layers_per_stage", "$.parallel.pipeline.virtual_stages",
         "$.parallel.pipeline.schedule")
"""Rejection reasons; a layout's code is 1 + the index of its reason, 0 when valid."""
CODE = {path: index + 1 for index, path in enumerate(PATHS)}


def _first(reason: np.ndarray, failed: np.ndarray | bool, path: str) -> np.ndarray:
    return np.where((reason == 0) & failed, CODE[path], reason)


def reason_codes(facts: Facts, grid: Grid) -> np.ndarray:
    """Per layout of the node (grid-shaped), the code of its first problem, or 0."""
    degrees = grid.node.degrees
    t, c, d = degrees.get("tensor", 1), degrees.get("context", 1), degrees.get("data", 1)
    b = grid.array(MICRO_BATCH, dtype=np.int64)
    reason = np.zeros(grid.shape, dtype=np.int8)
    # data: DataParallel.check
    reason = _first(reason, facts.global_batch % (b * d) != 0, "$.training.global_batch_size")
    reason = _first(reason, _tensor_fails(facts, t), "$.parallel.tensor.degree")
    reason = _context(facts, grid, reason, t, c)
    reason = _expert(facts, grid, reason, NodeDegrees.of(degrees, facts))
    return _pipeline(facts, grid, reason, b, d)


def _tensor_fails(facts: Facts, t: int) -> bool:
    """TensorParallel.check: t divides heads and the MLP width; t and kv heads divide."""
    model = facts.spec.model
    heads, ffn, kv = model.num_attention_heads, model.ffn_hidden_size, model.num_kv_heads
    if any(value is not None and value % t for value in (heads, ffn)):
        return True
    return kv is not None and t > 1 and bool(kv % t) and bool(t % kv)


def _context(facts: Facts, grid: Grid, reason: np.ndarray, t: int, c: int) -> np.ndarray:
    """ContextParallel.check: architecture, sequence in 2c chunks, heads for all-to-all."""
    model = facts.spec.model
    degree_fails = c > 1 and (not model.has_architecture or bool(facts.sequence % (2 * c)))
    reason = _first(reason, degree_fails, "$.parallel.context.degree")
    if degree_fails and not model.has_architecture:
        return reason
    heads = model.num_attention_heads
    all_to_all = grid.array("context.kind", lambda k: k == "all-to-all", "ring", bool)
    kind_fails = all_to_all & (heads is not None and bool(heads % (c * t)))
    return _first(reason, kind_fails, "$.parallel.context.kind")


def _expert(facts: Facts, grid: Grid, reason: np.ndarray, n: NodeDegrees) -> np.ndarray:
    """ExpertParallel.check: needs MoE; e divides the experts and data x context; a
    smaller expert tensor degree divides t, e x it divides t x c x d, and it needs
    sequence parallelism and the tensor ranks right inside the data x context ranks."""
    moe = facts.spec.model.moe
    if moe is None:
        return _first(reason, n.e != 1, "$.parallel.expert.degree")
    if n.x == n.t:
        return _first(reason, bool(moe.num_experts % n.e) or bool(n.d * n.c % n.e),
                      "$.parallel.expert.degree")
    reason = _first(reason, bool(moe.num_experts % n.e), "$.parallel.expert.degree")
    path = "$.parallel.expert.tensor_degree"
    if n.x > n.t or n.t % n.x:
        return _first(reason, True, path)
    sequence = grid.array("sequence", lambda on: bool(on) and facts.sequence_enabled,
                          False, bool)
    block = n.data_context_stride
    fails = (bool(n.t * n.c * n.d % (n.e * n.x)) | ~sequence
             | (block != n.stride("tensor") * n.t))
    return _first(reason, fails, path)


def _pipeline(facts: Facts, grid: Grid, reason: np.ndarray, b: np.ndarray,
              d: int) -> np.ndarray:
    """PipelineParallel.check: layers split over p x v, v only when interleaved, and
    interleaved needs micro-batches per step divisible by p."""
    p = grid.node.degrees.get("pipeline", 1)
    schedules = grid.values("pipeline.schedule", "1f1b")
    stages = grid.values("pipeline.virtual_stages", 1)
    splits = grid.values("pipeline.layers_per_stage", None)
    static = [_pipeline_static(facts, p, s, v, split)
              for s, v, split in zip(*_aligned(grid, schedules, stages, splits))]
    axis = _pipeline_axis(grid)
    code = grid.along(axis, static, dtype=np.int8)
    reason = np.where(reason == 0, code, reason)
    interleaved = grid.array("pipeline.schedule", lambda s: s == "interleaved", "1f1b", bool)
    m = np.maximum(1, facts.global_batch // (b * d))
    return _first(reason, interleaved & (p > 1) & (m % p != 0), "$.parallel.pipeline.schedule")


def _pipeline_axis(grid: Grid) -> int | None:
    for key in ("pipeline.schedule", "pipeline.virtual_stages", "pipeline.layers_per_stage"):
        if grid.has(key):
            return grid.axis(key)
    return None


def _aligned(grid: Grid, *columns: list[object]) -> list[list[object]]:
    """Columns of one group repeated to the group's length (a missing key has one value)."""
    length = max(len(column) for column in columns)
    return [column * length if len(column) == 1 else column for column in columns]


def _pipeline_static(facts: Facts, p: int, schedule: str, v: int,
                     split: tuple[int, ...] | None) -> int:
    layers = facts.spec.model.num_layers
    if p > 1 and layers is None:
        return CODE["$.parallel.pipeline.degree"]
    if split is not None:
        if len(split) != p or layers is not None and sum(split) != layers or min(split) < 1:
            return CODE["$.parallel.pipeline.layers_per_stage"]
    elif layers is not None and layers % (p * v):
        return CODE["$.parallel.pipeline.degree"]
    if schedule != "interleaved" and v != 1:
        return CODE["$.parallel.pipeline.virtual_stages"]
    return 0
