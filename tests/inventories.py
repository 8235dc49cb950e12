"""What the inventory tests share: a model's fused activation groups, and a measured
model's runs and their exact comparison (validation/data, validation/measure_hf.py)."""

from __future__ import annotations

from pathlib import Path

import llmpar
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.inventory import (
    SPLIT_CONTEXT,
    SPLIT_SEQUENCE,
    SPLIT_TENSOR,
    LayerGroup,
    SavedTensor,
)

ROOT = Path(__file__).resolve().parents[1]
SESSION = llmpar.Session(load_entry_points=False)


def fused_groups(name: str, **parallel: object) -> dict[str, LayerGroup]:
    """Model preset `name`'s fused inventory by layer kind, at 4,096 tokens on 4 H100s
    under the layout `parallel`."""
    spec = SESSION.load_spec({"model": name, "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
                              "training": {"sequence_length": 4096,
                                           "activation_model": "fused"},
                              "parallel": parallel})
    inventory = baseline_footprint(spec).activations
    assert inventory is not None
    return {group.kind: group for group in inventory.groups}


def runs_by_key(data: dict) -> dict[tuple, M.MeasuredRun]:
    """A measurement file's runs by (variant, attention, batch, sequence)."""
    return {(run.variant, run.attention, run.batch, run.sequence): run
            for run in M.measured_runs(data)}


def assert_exact(data: dict, run: M.MeasuredRun, fixed_residual_bytes: float = 0) -> None:
    """The model's hf inventory equals measured `run`: per layer exactly, outside the
    layers up to the residual its test states (and explains)."""
    comparison = M.compare(data, run, ROOT)
    assert comparison.per_layer_bytes == run.per_layer_bytes
    assert comparison.fixed_bytes == run.fixed_bytes + fixed_residual_bytes


def assert_split_tags(tensor: SavedTensor) -> None:
    """A layer tensor's tags agree with its shape: an attention score exactly when it has
    two sequence dimensions (s x s), every per-token tensor splits with the context, and
    none is split both by heads (tensor parallelism) and by sequence parallelism."""
    symbols = [symbol for symbol, _ in tensor.shape]
    assert tensor.attention_score == (symbols.count("s") == 2), tensor.name
    if "s" in symbols:
        assert SPLIT_CONTEXT in tensor.splits, tensor.name
    assert not ({SPLIT_TENSOR, SPLIT_SEQUENCE} <= tensor.splits), tensor.name
