"""What one prefill step of SGLang's large-scale expert-parallel DeepSeek-V3 rows
(validation/published/serving/sglang_large_scale_ep_h100_2025.toml: 16,384 tokens a GPU,
EP32, two-batch overlap, DeepEP normal kernels) costs, derived by hand, against the plan.

FLOPs per token, 2 per multiply-accumulate, from DeepSeek-V3's config.json (hidden 7168, 61
layers of which the first 3 dense with FFN 18432, 58 MoE layers of 256 routed experts of
width 2048 with top-8 and 1 shared expert of the same width, vocabulary 129280; MLA with
128 heads, q_lora_rank 1536, kv_lora_rank 512, q/k heads of 128 + 64 rope = 192 wide, v
heads 128 wide; DeepSeek-V3 report, arXiv:2412.19437, Sec. 2.1 and 4.2):

- MLA projections a layer: q down 7168 x 1536, q up 1536 x 128 x 192, kv down
  7168 x (512 + 64), kv up 512 x 128 x (128 + 128), output 128 x 128 x 7168: 187,105,280
  weights (in prefill the up-projections run on every token: SGLang's MLA prefill is
  unabsorbed multi-head attention, python/sglang/srt/models/deepseek_v2.py
  forward_normal);
- attention a layer: Q.K^T over 192 channels and scores.V over 128 for each of 128 heads,
  2 x 128 x (192 + 128) = 81,920 FLOPs per causal (query, key) pair, (s + 1) / 2 pairs a
  token for s-token prompts (FlashAttention-3's varlen kernel with head dims 192 / 128,
  Shah et al. 2024, arXiv:2407.08608, Sec. 3);
- dense MLP 3 x 7168 x 18432; an MoE layer 8 + 1 experts of 3 x 7168 x 2048 and a
  7168 x 256 router; the output layer on the last token of each prompt only.

That makes 71.4 GFLOP a token beside attention and 2.6 / 5.1 / 10.3 GFLOP of attention at
1K / 2K / 4K prompts. The plan charges exactly these FLOPs (the first tests), so the gap to
the measured rows is not a missing or mis-sized product: at the H100's fp8 rate for the
block-quantized products (DeepGEMM on Hopper) and FA3's bf16 rate for attention they take
1.1 to 1.3 s of the 16,384-token step, against 2.3 to 2.6 s measured. What the plan got
wrong was the overlap: it hid the 1.43 s of dispatch and combine behind all of the step's
computation, so every prompt length gave the same step. SGLang's prefill runs its MoE
layers in lockstep (python/sglang/srt/operations_strategy.py,
`_compute_moe_deepseek_blog_prefill`): nothing is sent while the first micro-batch's
attention runs, the four transfers of a layer follow one another, and DeepGEMM's products
run on the SMs DeepEP's normal kernels leave (20 of the H100's 132: deep_ep/buffer.py
`Buffer.num_sms`). The later tests check that schedule by hand.
"""

from __future__ import annotations

import attrs
import pytest
from validation_scripts import load_script

import llmpar

report = load_script("published_serving")
PREFILL_ROWS = [row for name, row in report.all_rows()
                if name.startswith("sglang_large_scale_ep") and row.phase == "prefill"]

H, LAYERS, DENSE, MOE = 7168, 61, 3, 58
MLA_WEIGHTS = (H * 1536 + 1536 * 128 * 192 + H * (512 + 64) + 512 * 128 * (128 + 128)
               + 128 * 128 * H)
PAIR_FLOPS = 2 * 128 * (192 + 128)
DENSE_MLP = 3 * H * 18432
EXPERT = 3 * H * 2048
ROUTER = H * 256
HEAD = H * 129280


def hand_flops_per_token(prompt: int) -> float:
    """Prefill FLOPs a token of `prompt`-token prompts, the output layer left out."""
    linear = 2 * (LAYERS * MLA_WEIGHTS + DENSE * DENSE_MLP + MOE * ((8 + 1) * EXPERT + ROUTER))
    return linear + LAYERS * PAIR_FLOPS * (prompt + 1) / 2


def test_the_hand_count_is_the_model_s_active_parameters():
    """DeepSeek-V3 states 37B activated parameters a token (report, Sec. 1),
    of which the embedding and output layers are 2 x 0.93B; 71.4 GFLOP a token beside
    attention is 35.7B multiply-accumulates."""
    assert MLA_WEIGHTS == 187_105_280
    linear = hand_flops_per_token(0) - LAYERS * PAIR_FLOPS / 2
    assert linear / 2 + 2 * HEAD == pytest.approx(37e9, rel=0.02)


@pytest.mark.parametrize("row", PREFILL_ROWS, ids=[r.label for r in PREFILL_ROWS])
def test_prefill_flops_are_the_hand_count(row: report.Row) -> None:
    spec = llmpar.load_spec(row.spec)
    assert spec.inference is not None
    pool = llmpar.evaluate(spec).serving[0]
    prefill = pool.phases[0]
    prompt, batch = spec.inference.prompt_tokens, spec.inference.batch_size
    hand = batch * prompt * hand_flops_per_token(prompt) + batch * 2 * HEAD
    assert prefill.flops == pytest.approx(hand, rel=1e-6)


def test_deepep_normal_kernels_slow_the_products_they_run_beside():
    """Under the lockstep prefill schedule the products run on the 112 of 132 SMs DeepEP's
    normal kernels leave (SGLang's deep_gemm_num_sms): a GPU preset without an SM count
    gives a faster step; both steps are their parts added up."""
    row = PREFILL_ROWS[-1]
    spec = llmpar.load_spec(row.spec)
    gpu = attrs.evolve(spec.hardware.gpu, streaming_multiprocessors=None)
    free = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu=gpu))
    taken, untaken = (llmpar.evaluate(s).serving[0] for s in (spec, free))
    assert taken.prefill_seconds > untaken.prefill_seconds
    for pool in (taken, untaken):
        phase = pool.phases[0]
        assert pool.prefill_seconds == pytest.approx(
            phase.compute_seconds + phase.memory_seconds + phase.communication_seconds
            + phase.overhead_seconds)


def test_the_lockstep_schedule_by_hand():
    """SGLang's prefill schedule (operations_strategy.py, tbo_delta_stages=0) for a layer
    with stages a, e, s and dispatch d, combine c per micro-batch."""
    from llmpar.inference.overlap import lockstep_layer_seconds

    # nothing to send: the six stages back to back
    assert lockstep_layer_seconds(3.0, 5.0, 1.0, 0.0, 0.0) == pytest.approx(18.0)
    # communication-bound: A's attention, then the four transfers in a row
    assert lockstep_layer_seconds(1.0, 1.0, 0.5, 10.0, 20.0) == pytest.approx(61.0)
    # the 1K row's shapes, roughly (ms): A.a 0-4, D_A 4-8, B.a 4-8, D_B 8-12, A.e 8-14,
    # C_A 14-22, B.e 14-20, A.s 20-21 then waits C_A (22), B.s 22-23, C_B 22-30
    assert lockstep_layer_seconds(4.0, 6.0, 1.0, 4.0, 8.0) == pytest.approx(30.0)
    # never below the compute of both micro-batches nor the transfers after A's attention
    for a, e, s, d, c in [(2, 3, 1, 1, 2), (1, 4, 2, 3, 1), (5, 1, 1, 2, 6)]:
        t = lockstep_layer_seconds(a, e, s, d, c)
        assert t >= 2 * (a + e + s) and t >= a + 2 * (d + c)


@pytest.mark.parametrize(("comm", "work", "step"), [
    (3.0, 2.0, 3.0),  # 2 s of work on 3/4 of the SMs take 8/3 s < 3 s: the window is M
    (2.5, 2.0, 2.625),  # 2 + 0.25 x 2.5: the work outlasts the slowed window
    (1.0, 2.0, 2.25),  # all hidden, the work 0.25 x 1 s longer
])
def test_a_share_of_the_sms_gives_max_of_comm_and_slowed_work(comm: float, work: float,
                                                              step: float) -> None:
    from llmpar.inference.overlap import behind_other_micro_batch, contention_seconds
    from llmpar.plan import CollectiveCost

    costs = [CollectiveCost(strategy="expert", operation="all-to-all", name="expert.a2a",
                            buffer_bytes=1, group_size=8, tier="inter-node",
                            calls_per_step=1.0, seconds=comm, exposed_seconds=comm,
                            hides_behind="compute", reason="")]
    slowed = contention_seconds(costs, [True], [0.25], work)
    after = behind_other_micro_batch(costs, [True], work, [0.25])
    assert work + slowed + after[0].exposed_seconds == pytest.approx(step)
    assert work + slowed + after[0].exposed_seconds == pytest.approx(
        max(comm, work + 0.25 * comm))
