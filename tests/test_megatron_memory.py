"""The memory of a Megatron-Core step: the vocab-parallel loss's in-place softmax."""

from __future__ import annotations

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
