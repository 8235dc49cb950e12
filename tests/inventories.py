"""What the inventory tests share: a model's fused activation groups, and a measured
model's runs and their exact comparison (validation/data, validation/measure_hf.py)."""

from __future__ import annotations

from pathlib import Path

import llmpar
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.inventory import LayerGroup

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
