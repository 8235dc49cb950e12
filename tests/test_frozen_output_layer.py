"""The output layer's backward makes its weight's gradient only where the weight trains:
autograd computes no gradient of a tensor that does not require one, so LoRA over a
frozen output layer has none at that moment."""

from __future__ import annotations

from pathlib import Path

from llmpar.evaluation.transients import _output_parts
from llmpar.footprint.baseline import baseline_footprint
from llmpar.session import Session

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"
SESSION = Session(load_entry_points=False, environ={})
WGRAD = "output layer's weight gradient"


def weight_gradient_bytes(name: str) -> float:
    spec = SESSION.load_spec(EXAMPLES / name)
    footprint = baseline_footprint(spec)
    parts = {p.name: p for p in _output_parts(spec, footprint, footprint.parameters_by_group)}
    return sum(parts[WGRAD].tags.values())


def test_full_training_makes_the_output_layers_weight_gradient() -> None:
    # Llama-3-8B: a 128,256 x 4,096 output layer, its gradient in bf16
    assert weight_gradient_bytes("llama-3-8b-fsdp-8-h100.toml") == 128_256 * 4_096 * 2


def test_lora_over_a_frozen_output_layer_makes_none() -> None:
    assert weight_gradient_bytes("llama-3-8b-lora-rtx-4090.toml") == 0
