"""After the loss's backward autograd has released what the loss saved
(Node::release_variables, torch/csrc/autograd/function.h): the output layer's backward and
every layer's backward after it run without the loss's tensors of that micro-batch."""

from __future__ import annotations

import pytest

import llmpar

# torchtune's 70B LoRA recipe on 8 GPUs (validation/published/finetune/torchtune_memory.toml)
SPEC = {"model": "llama-3.1-70b", "hardware": {"gpu": "a100-sxm-80gb", "num_gpus": 8},
        "precision": {"weights": "bf16", "gradients": "bf16", "activations": "bf16"},
        "finetune": {"method": "lora", "rank": 16, "target_modules": ["q_proj", "k_proj",
                                                                      "v_proj"]},
        "parallel": {"data": {"fsdp": True}},
        "training": {"sequence_length": 2048, "micro_batch_size": 2, "global_batch_size": 16,
                     "recompute": "full", "tokens": 1e9,
                     "framework": {"preset": "pytorch-fsdp2", "cross_entropy_chunks": 8,
                                   "compiled_cross_entropy": True}}}


def test_a_layer_backward_holds_no_loss_tensor():
    plan = llmpar.evaluate(SPEC)
    peak = plan.training.memory_peak
    assert peak.moment == "layer backward"
    alive = {b.name: b.bytes for b in peak.alive}
    # the fused activation model keeps the loss's exp(logits) in bf16: b x s x V x 2 bytes
    loss = 2 * 2048 * 128256 * 2
    assert alive["activations"] == pytest.approx(plan.activations_bytes - loss, abs=2**20)
