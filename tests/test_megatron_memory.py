"""The memory of a Megatron-Core step: hidden dropout's masks and the vocab-parallel
loss's in-place softmax."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.evaluation.transients import _loss_parts


def test_vocab_parallel_loss_upcasts_once_since_core_r0_8():
    """megatron/core/tensor_parallel/cross_entropy.py from core_r0.8.0 (commit 9634c0e4):
    the max is subtracted and the exponent taken in the fp32 copy itself, so the loss's
    forward holds the bf16 logits and one fp32 tensor, its backward the fp32 softmax
    turned gradient and the gradient cast to bf16; before it (the legacy profiles), a
    second fp32 tensor in the forward."""
    session = llmpar.Session()
    example = "specs/examples/llama-3-8b-tp8-sp-a100.toml"
    spec = session._checked(example, None)[0]
    legacy = session._checked(example, {"training.framework": "megatron-core-legacy"})[0]
    elements = spec.training.micro_batch_size * spec.training.sequence_length * 128256
    forward, backward = _loss_parts(spec)
    assert sum(sum(p.tags.values()) for p in forward) == elements * (2 + 4)
    assert sum(sum(p.tags.values()) for p in backward) == elements * (4 + 2)
    forward, _ = _loss_parts(legacy)
    assert sum(sum(p.tags.values()) for p in forward) == elements * (2 + 4 + 4)


def test_vocab_parallel_loss_of_fp32_logits_copies_nothing():
    """Tensor.float() of fp32 logits returns them: the softmax is made in the logits
    themselves and the gradient returned needs no cast."""
    spec = llmpar.Session()._checked("specs/examples/llama-3-8b-tp8-sp-a100.toml",
                                     {"precision.activations": "fp32"})[0]
    elements = spec.training.micro_batch_size * spec.training.sequence_length * 128256
    forward, backward = _loss_parts(spec)
    assert sum(sum(p.tags.values()) for p in forward) == elements * 4
    assert sum(sum(p.tags.values()) for p in backward) == elements * 4


def test_hidden_dropout_keeps_a_byte_mask_after_attention_mlp_and_embedding():
    """Korthikanti et al. 2022, Sec. 4.1: a dropout keeps a one-byte mask per element;
    after each layer's attention and MLP and after the embedding, b x s x h each
    (Megatron-LM's --hidden-dropout, 0.1 by default there), split by sequence
    parallelism as the residual stream is; none by default. Llama-3-8B, TP8 + SP:
    s = 8192, h = 4096, b = 1, 32 layers."""
    example = "specs/examples/llama-3-8b-tp8-sp-a100.toml"
    with_masks = llmpar.evaluate(example, {"training.hidden_dropout": 0.1})
    without = llmpar.evaluate(example)
    spec = llmpar.Session()._checked(example, None)[0]
    b, s, h, t = spec.training.micro_batch_size, spec.training.sequence_length, 4096, 8
    rows = {r.name: r.bytes for r in with_masks.activation_tensors}
    assert rows["attention dropout mask"] == rows["MLP dropout mask"] == b * s * h / t
    assert not any("dropout" in r.name for r in without.activation_tensors)
    stage = with_masks.stages[0]
    masks = stage.micro_batches_in_flight * (2 * stage.layers + 1) * b * s * h / t
    assert with_masks.stages[0].activations_bytes - without.stages[0].activations_bytes == (
        pytest.approx(masks, abs=1))


def test_hidden_dropout_must_be_a_probability():
    with pytest.raises(llmpar.SpecError) as raised:
        llmpar.evaluate("specs/examples/llama-3-8b-tp8-sp-a100.toml",
                        {"training.hidden_dropout": 1.0})
    assert "hidden_dropout" in str(raised.value)
