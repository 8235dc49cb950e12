"""Shape-dependent compute: what matrix products lose to their shapes
(llmpar.evaluation.matmuls) and ring attention's exchange hidden only behind attention
(llmpar.evaluation.step_time)."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.evaluation.matmuls import (
    RankShape,
    launch_seconds,
    pass_seconds,
    products,
    shape_loss_seconds,
)
from llmpar.evaluation.step_time import Cost, hide_costs
from llmpar.evaluation.timing import attention_hardware_flops_per_sequence
from llmpar.footprint.baseline import baseline_footprint
from llmpar.roofline import rates_of
from llmpar.strategy import Collective

SESSION = llmpar.Session(load_entry_points=False)


def spec_of(model: str = "gpt-3-175b", sequence: int = 2048, gpu: str = "a100-sxm-80gb"):
    return SESSION.load_spec({"model": model, "hardware": {"gpu": gpu},
                              "training": {"sequence_length": sequence}})


def lost(spec, product, rates) -> float:
    """One pass of one product: its time beyond its FLOPs'."""
    time, flops = pass_seconds(product, spec, rates)
    return time - flops


def test_large_products_lose_only_their_fixed_time():
    """GPT-3 175B, TP8, 2048 tokens per micro-batch (Narayanan et al.'s runs): every
    product is compute-bound, so each pass loses the GPU's fixed 6 us; three passes per
    product, four for layer products under full recomputation."""
    spec = spec_of()
    rates = rates_of(spec.hardware.gpu)
    fixed = spec.hardware.gpu.matmul_fixed_seconds
    assert fixed == pytest.approx(6e-6)
    found = products(spec, RankShape(tensor=8), materialized_scores=False)
    assert all(lost(spec, p, rates) == pytest.approx(fixed) for p in found)
    layers = sum(p.count for p in found if p.layer)
    attention = 96 * 3  # one FlashAttention kernel per layer: forward, backward, rerun
    assert shape_loss_seconds(spec, RankShape(tensor=8), rates, "full", 1.0, False) == (
        pytest.approx((4 * layers + 3 + attention) * fixed))


def test_ring_context_parallelism_launches_attention_once_per_step():
    """Ring attention runs one FlashAttention kernel per ring step; Ulysses one."""
    spec = spec_of()
    rates = rates_of(spec.hardware.gpu)
    fixed = spec.hardware.gpu.matmul_fixed_seconds

    def loss(ring):
        shape = RankShape(tensor=8, context=4, attention_steps=4 if ring else 1)
        return shape_loss_seconds(spec, shape, rates, "none", 0.0, False)

    assert loss(True) - loss(False) == pytest.approx(96 * (4 - 1) * 2 * fixed)


def test_a_hybrid_model_launches_attention_only_in_its_attention_layers():
    """Qwen3.5-27B's 64 layers repeat "LLLA": 16 attend, 48 are gated DeltaNet layers,
    which run no FlashAttention kernel. Ring attention over 4 steps adds 3 launches per
    attention layer and pass (forward, backward): 16 x 3 x 2, not 64 x 3 x 2."""
    spec = spec_of("qwen3.5-27b", gpu="h100-sxm")
    assert spec.model.num_layers == 64 and spec.model.num_attention_layers == 16
    rates = rates_of(spec.hardware.gpu)
    launch = launch_seconds(spec, rates)

    def loss(steps: int) -> float:
        shape = RankShape(tensor=8, context=4, attention_steps=steps)
        return float(shape_loss_seconds(spec, shape, rates, "none", 0.0, False))

    assert loss(4) - loss(1) == pytest.approx(16 * (4 - 1) * 2 * launch)


def test_few_tokens_per_gpu_make_products_memory_bound():
    """CP32 leaves 64 tokens per GPU: every product streams its weights for few FLOPs,
    and loses memory time - compute time on top of the fixed time."""
    spec, shape = spec_of(), RankShape(tensor=8, context=32)
    rates = rates_of(spec.hardware.gpu)
    fixed = spec.hardware.gpu.matmul_fixed_seconds
    found = products(spec, shape, materialized_scores=False)
    assert all(lost(spec, p, rates) > 2 * fixed for p in found)
    total = sum(3 * p.count * lost(spec, p, rates) for p in found)
    attention = 96 * 32 * 2 * fixed  # a FlashAttention kernel per ring step and pass
    assert shape_loss_seconds(spec, shape, rates, "none", 0.0, False) == pytest.approx(
        total + attention)


def test_attention_projection_shape_by_hand():
    """Llama-3-8B (h 4096, 32 heads, 8 KV heads of 128), TP2, 1024 tokens: Q, K and V
    together are 4096 x (2048 + 2 x 512) per rank, the output (4096 / 2) x 4096."""
    spec = spec_of("llama-3-8b", sequence=1024)
    qkv, output, *_ = products(spec, RankShape(tensor=2), materialized_scores=False)
    assert (qkv.m, qkv.n, qkv.k, qkv.count) == (1024, 2048 + 2 * 512, 4096, 32)
    assert (output.m, output.n, output.k) == (1024, 4096, 2048)


def test_scores_are_products_only_where_attention_materializes_them():
    """Eager attention (activation models that keep the scores) runs Q.K^T and scores.V
    per head; FlashAttention is not a product here."""
    spec = spec_of("llama-3-8b", sequence=1024)
    names = {p.name for p in products(spec, RankShape(tensor=2, micro_batch_size=2), True)}
    assert {"Q.K^T", "scores.V"} <= names
    assert not {"Q.K^T", "scores.V"} & {
        p.name for p in products(spec, RankShape(tensor=2), False)}
    scores = [p for p in products(spec, RankShape(tensor=2, micro_batch_size=2), True)
              if p.name == "Q.K^T"][0]
    assert (scores.m, scores.n, scores.k, scores.count) == (1024, 1024, 128, 2 * 16 * 32)


@pytest.mark.parametrize("model", ["llama-3-8b", "gpt-3-175b", "mixtral-8x7b"])
@pytest.mark.parametrize("tensor", [1, 8])
def test_lost_time_grows_as_tokens_per_gpu_shrink(model, tensor):
    """Per micro-batch as the context degree grows; per token as micro-batches shrink."""
    spec = spec_of(model, sequence=2048)
    rates = rates_of(spec.hardware.gpu)

    def loss(c, b=1):
        return shape_loss_seconds(spec, RankShape(tensor=tensor, context=c, micro_batch_size=b),
                                  rates, "none", 0.0, False)

    found = [loss(c) for c in (1, 4, 16, 64, 256)]
    assert all(later >= earlier * (1 - 1e-12) for earlier, later in zip(found, found[1:]))
    assert found[-1] > found[0]
    per_token = [loss(64, b) / b for b in (1, 2, 4, 8)]
    assert all(later <= earlier * (1 + 1e-12)
               for earlier, later in zip(per_token, per_token[1:]))


def test_experts_that_see_few_tokens_are_memory_bound_until_expert_parallelism():
    """Mixtral: 8 experts, top-2. At 256 tokens per GPU each local expert sees 64 tokens
    without expert parallelism, and 512 with EP8 (the tokens of 8 GPUs)."""
    spec = spec_of("mixtral-8x7b", sequence=256)
    rates = rates_of(spec.hardware.gpu)
    fixed = spec.hardware.gpu.matmul_fixed_seconds

    def expert_up(e):
        (product,) = [p for p in products(spec, RankShape(expert=e), False)
                      if p.name == "expert up"]
        return product

    assert expert_up(1).m == 64 and expert_up(8).m == 512
    assert lost(spec, expert_up(1), rates) > 2 * fixed
    assert lost(spec, expert_up(8), rates) == pytest.approx(fixed)


def cost(seconds: float, exposed: float, behind: str) -> Cost:
    collective = Collective(strategy="s", name="s.c", operation="send-recv", group_size=2,
                            hides_behind=behind)
    return Cost(collective, 1, 1, "intra-node", seconds, exposed, True)


def test_hiding_behind_attention_is_capped_by_attention_then_by_compute():
    ring, grads = cost(3.0, 0.0, "attention"), cost(2.0, 0.0, "compute")
    hidden = hide_costs([ring, grads], {"compute": 10.0, "attention": 1.0})
    assert [c.exposed for c in hidden] == [2.0, 0.0]
    squeezed = hide_costs([ring, grads], {"compute": 1.5, "attention": 1.0})
    # 1 s of ring and 2 s of gradients could hide; 1.5 s of compute hides half of each.
    assert [c.exposed for c in squeezed] == [pytest.approx(2.5), pytest.approx(1.0)]


def test_ring_attention_shows_when_attention_is_short():
    """Llama-3-8B on 8 single-GPU nodes, CP8 ring over 1024 tokens: the K/V sends cross
    the network and outlast the attention they overlap. (The gradient all-reduce is kept
    off the compute it would share with the ring; attention is timed at matmul_efficiency,
    as the window below is written, not at its kernel's rates.)"""
    spec = SESSION.load_spec({
        "model": "llama-3-8b",
        "hardware": {"cluster": "dgx-a100", "num_gpus": 8, "gpus_per_node": 1},
        "training": {"sequence_length": 1024, "global_batch_size": 8,
                     "framework": {"preset": "megatron-core", "attention_timing": "matmul"}},
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
