"""Shape-dependent compute: memory-bound matrix products (llmpar.evaluation.matmuls) and
ring attention's exchange hidden only behind attention (llmpar.evaluation.step_time)."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.evaluation.matmuls import (
    RankShape,
    layer_matmuls,
    memory_bound_seconds,
    output_layer,
)
from llmpar.evaluation.step_time import hide
from llmpar.evaluation.timing import attention_hardware_flops_per_sequence
from llmpar.footprint.baseline import baseline_footprint
from llmpar.plan import CollectiveCost
from llmpar.roofline import compute_seconds, memory_seconds, rates_of

SESSION = llmpar.Session(load_entry_points=False)


def spec_of(model: str = "gpt-3-175b", sequence: int = 2048, gpu: str = "a100-sxm-80gb"):
    return SESSION.load_spec({"model": model, "hardware": {"gpu": gpu},
                              "training": {"sequence_length": sequence}})


def test_large_products_at_training_shapes_are_compute_bound():
    """GPT-3 175B, TP8, 2048 tokens per micro-batch (Narayanan et al.'s runs)."""
    spec = spec_of()
    assert memory_bound_seconds(spec, RankShape(tensor=8), rates_of(spec.hardware.gpu),
                                "full", 1.0) == 0.0


def test_few_tokens_per_gpu_make_products_memory_bound_by_the_roofline_excess():
    """CP32 leaves 64 tokens per GPU: every product streams more than it computes, and
    the time lost is memory time - compute time, 3 forward equivalents per layer product
    (4 with full recomputation) and 3 for the output layer."""
    spec, shape = spec_of(), RankShape(tensor=8, context=32)
    rates = rates_of(spec.hardware.gpu)
    layers = sum(count * (memory_seconds(op, rates) - compute_seconds(op, rates))
                 for op, count in layer_matmuls(spec, shape))
    head = memory_seconds(output_layer(spec, shape), rates) - compute_seconds(
        output_layer(spec, shape), rates)
    assert layers > 0 and head > 0
    assert memory_bound_seconds(spec, shape, rates, "none", 1.0) == pytest.approx(
        3 * layers + 3 * head)
    assert memory_bound_seconds(spec, shape, rates, "full", 0.5) == pytest.approx(
        3.5 * layers + 3 * head)
    assert memory_bound_seconds(spec, shape, rates, "selective", 1.0) == pytest.approx(
        3 * layers + 3 * head)


def test_attention_projection_bytes_and_flops_by_hand():
    """Llama-3-8B (h 4096, 32 heads, 8 KV heads of 128), TP2, 1024 tokens: Q and output
    4096 x 4096 / 2 each, K and V 4096 x 1024 / 2 each; weights read once in bf16,
    activations in and out once."""
    spec = spec_of("llama-3-8b", sequence=1024)
    (attention, layers), *_ = layer_matmuls(spec, RankShape(tensor=2))
    weights = (2 * 4096 * 4096 + 2 * 4096 * 1024) / 2
    assert layers == 32
    assert attention.flops == 2 * 1024 * weights
    width = (4096 + 2 * 1024 + 4096) / 2  # query, K, V and output per rank
    assert attention.bytes == 2 * weights + 2 * 1024 * (2 * 4096 + width)


@pytest.mark.parametrize("model", ["llama-3-8b", "gpt-3-175b", "mixtral-8x7b"])
@pytest.mark.parametrize("tensor", [1, 8])
def test_lost_time_grows_as_tokens_per_gpu_shrink(model, tensor):
    """Per micro-batch as the context degree grows; per token as micro-batches shrink."""
    spec = spec_of(model, sequence=2048)
    rates = rates_of(spec.hardware.gpu)
    lost = [memory_bound_seconds(spec, RankShape(tensor=tensor, context=c), rates, "none", 0.0)
            for c in (1, 4, 16, 64, 256)]
    assert lost == sorted(lost) and lost[-1] > 0
    per_token = [memory_bound_seconds(spec, RankShape(tensor=tensor, context=64,
                                                      micro_batch_size=b), rates, "none", 0.0) / b
                 for b in (1, 2, 4, 8)]
    assert per_token == sorted(per_token, reverse=True)


def test_experts_that_see_few_tokens_are_memory_bound_until_expert_parallelism():
    """Mixtral: 8 experts, top-2. At 256 tokens per GPU each local expert sees 64 tokens
    without expert parallelism, and 512 with EP8 (the tokens of 8 GPUs)."""
    spec = spec_of("mixtral-8x7b", sequence=256)
    rates = rates_of(spec.hardware.gpu)

    def experts(e):
        ops = dict((op.name, op) for op, _ in layer_matmuls(spec, RankShape(expert=e)))
        op = ops["routed experts"]
        return memory_seconds(op, rates) - compute_seconds(op, rates)

    assert experts(1) > 0 > experts(8)


def cost(seconds: float, exposed: float, behind: str) -> CollectiveCost:
    return CollectiveCost(strategy="s", operation="send-recv", buffer_bytes=1, group_size=2,
                          tier="intra-node", calls_per_step=1, seconds=seconds,
                          exposed_seconds=exposed, hides_behind=behind)


def test_hiding_behind_attention_is_capped_by_attention_then_by_compute():
    ring, grads = cost(3.0, 0.0, "attention"), cost(2.0, 0.0, "compute")
    hidden = hide([ring, grads], compute=10.0, attention=1.0)
    assert [c.exposed_seconds for c in hidden] == [2.0, 0.0]
    squeezed = hide([ring, grads], compute=1.5, attention=1.0)
    # 1 s of ring and 2 s of gradients could hide; 1.5 s of compute hides half of each.
    assert [c.exposed_seconds for c in squeezed] == [pytest.approx(2.5), pytest.approx(1.0)]


def test_ring_attention_shows_when_attention_is_short():
    """Llama-3-8B on 8 single-GPU nodes, CP8 ring over 1024 tokens: the K/V sends cross
    the network and outlast the attention they overlap. (The gradient all-reduce is kept
    off the compute it would share with the ring.)"""
    spec = SESSION.load_spec({
        "model": "llama-3-8b",
        "hardware": {"cluster": "dgx-a100", "num_gpus": 8, "gpus_per_node": 1},
        "training": {"sequence_length": 1024, "global_batch_size": 8},
        "parallel": {"context": {"degree": 8}, "data": {"overlap_grad_reduce": False}}})
    plan = SESSION.evaluate(spec)
    (ring,) = [c for c in plan.collectives if c.strategy == "context"]
    gpu = spec.hardware.gpu
    attention = (attention_hardware_flops_per_sequence(spec, baseline_footprint(spec))
                 * plan.global_batch_size / plan.num_gpus
                 / (gpu.peak_flops_per_s("bf16") * gpu.matmul_efficiency))
    assert ring.hides_behind == "attention"
    assert ring.seconds > attention
    assert ring.exposed_seconds == pytest.approx(ring.seconds - attention)
    assert plan.compute_seconds > ring.seconds
