"""Attention's executed FLOPs follow its kernel; `attention_flops` only changes the count."""

from __future__ import annotations

import attrs
import pytest

import llmpar
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.flops import executed_attention_share, forward_flops_per_sequence

CP8_A100 = "specs/examples/llama-3-8b-cp8-a100.toml"


def preset(name: str) -> llmpar.Spec:
    spec = {"model": name, "hardware": {"gpu": "h100-sxm"}, "training": {"sequence_length": 512}}
    return llmpar.load_spec(spec).model


def with_training(spec: llmpar.Spec, **changes: object) -> llmpar.Spec:
    return attrs.evolve(spec, training=attrs.evolve(spec.training, **changes))


def test_causal_flash_attention_executes_about_half_of_eager_scores_at_32k():
    # Llama-3-8B at 32K tokens: 256 tiles of 128 a side; a causal fused kernel computes
    # the 256 * 257 / 2 tiles on and below the diagonal, eager attention all 256^2.
    s = 32768
    eager = forward_flops_per_sequence(preset("llama-3-8b"), s, kernel="eager")
    fused = forward_flops_per_sequence(preset("llama-3-8b"), s, kernel="fused")
    square = 2 * 2 * s * s * 4096 * 32  # Q.K^T and scores.V, 32 layers
    assert eager.executed_attention == square
    assert fused.executed_attention == pytest.approx(square * 257 / 512, rel=1e-12)
    assert fused.executed_attention / eager.executed_attention == pytest.approx(0.5, abs=0.002)
    # The counting convention is a separate number: the full square here.
    assert fused.attention == eager.attention == square


def test_the_convention_never_changes_executed_attention():
    model = preset("llama-3-8b")
    for kernel in ("eager", "fused"):
        full = forward_flops_per_sequence(model, 4096, causal=False, kernel=kernel)
        causal = forward_flops_per_sequence(model, 4096, causal=True, kernel=kernel)
        assert causal.attention == full.attention / 2
        assert causal.executed_attention == full.executed_attention


def test_an_encoder_executes_the_whole_square_with_any_kernel():
    assert executed_attention_share(preset("bert-large"), 512, "fused") == 1.0
    assert executed_attention_share(preset("llama-3-8b"), 100, "fused") == 1.0  # one tile


@pytest.mark.parametrize(("activation_model", "kernel"), [
    ("korthikanti", "eager"), ("hf-eager", "eager"), ("fused", "fused"),
    ("hf-sdpa", "fused"), ("coefficient", "fused")])
def test_the_activation_model_decides_the_kernel(activation_model, kernel):
    spec = with_training(llmpar.load_spec(CP8_A100), activation_model=activation_model)
    assert baseline_footprint(spec).attention_kernel == kernel


@pytest.mark.parametrize("activation_model", ["korthikanti", "fused"])
def test_flipping_the_convention_keeps_the_step_and_moves_mfu(activation_model):
    spec = with_training(llmpar.load_spec(CP8_A100), activation_model=activation_model)
    full = llmpar.evaluate(with_training(spec, attention_flops="full"))
    causal = llmpar.evaluate(with_training(spec, attention_flops="causal"))
    assert causal.step_seconds == full.step_seconds
    assert causal.hfu == full.hfu
    assert causal.mfu == pytest.approx(full.mfu * causal.flops_per_step / full.flops_per_step)
    assert causal.mfu < full.mfu


def test_fused_causal_attention_runs_faster_than_eager():
    # Same FLOPs counted; the fused kernel executes about half the attention square.
    spec = llmpar.load_spec(CP8_A100)
    eager = llmpar.evaluate(with_training(spec, activation_model="korthikanti"))
    fused = llmpar.evaluate(with_training(spec, activation_model="fused"))
    assert fused.flops_per_step == eager.flops_per_step
    assert fused.hardware_flops_per_step < eager.hardware_flops_per_step
    assert fused.step_seconds < eager.step_seconds
