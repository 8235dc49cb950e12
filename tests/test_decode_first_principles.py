"""What one decode step of the two DeepSeek-V3 expert-parallel decode rows costs, derived
by hand, against the plan: SGLang's large-scale EP decode
(validation/published/serving/sglang_large_scale_ep_h100_2025.toml: 256 sequences a GPU at
a 2,000-token context, EP64, two-batch overlap, DeepEP low-latency kernels) and DeepSeek's
H800 service (deepseek_v3_inference_system_h800_2025.toml: 88 sequences at 4,989, EP128).

Per GPU and micro-batch (two-batch overlap: half the sequences, every weight read once per
micro-batch; SGLang two_batch_overlap.py), from DeepSeek-V3's config.json (61 layers, 58
of them MoE with 256 routed experts of width 2048, top-8; MLA with 128 heads, q/k heads
192 wide, v heads 128, kv_lora_rank 512, qk_rope_head_dim 64; arXiv:2412.19437 Sec. 2.1):

- the KV cache: MLA keeps the 512-wide latent and the 64-wide rope key, 576 elements a
  token and layer (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2; FlashMLA's 576-wide cache),
  2 bytes each in bf16, all of it read once a step by the absorbed decode kernel;
- the routed experts: under EP64 a GPU holds 4 experts, and the 64 ranks' 128 tokens of a
  micro-batch pick 8 of 256 each, so all 4 are read, 3 x 7168 x 2048 fp8 weights each;
- the dispatch and combine of 128 tokens at EP64: 173 us and 314 us (DeepEP's measured
  low-latency kernels on 400 Gb/s NICs, validation/published/kernels/
  deepep_low_latency_h800.toml), 58 layers x 2 micro-batches of each in a step: 56.5 ms,
  more than the step's 48 ms of operations.

So the step is communication-bound, and what matters is how much of the transfers the
overlap hides. The plan hid them behind all of the step's computation (max(M, W)), 60.6 ms
against 91.9 ms measured. SGLang's decode runs each MoE layer in five stages with the
second micro-batch two stages behind (operations_strategy.py,
`_compute_moe_deepseek_blog_decode`, tbo_delta_stages=2; DeepSeek's five-stage decoding
pipeline): a dispatch travels while its own shared experts and the other micro-batch's
attention preparation run, a combine while the other's attention kernel and output
projection run, never behind the routed experts. The later tests check that schedule.
"""

from __future__ import annotations

import pytest
from validation_scripts import load_script

import llmpar
from llmpar.inference.evaluate import serving_of
from llmpar.inference.operations import active_local_experts
from llmpar.inference.overlap import micro_batch_step
from llmpar.inference.phases import decode_step
from llmpar.loading.checks import resolve_layout

report = load_script("published_serving")
DECODE_ROWS = {name: row for name, row in report.all_rows()
               if row.phase == "decode" and ("sglang_large_scale_ep" in name
                                             or "deepseek_v3_inference" in name)}
SESSION = llmpar.Session(load_entry_points=False)

LAYERS, MOE = 61, 58
LATENT_BYTES = (512 + 64) * 2  # bf16
QUERY, OUTPUT = 128 * (512 + 64), 128 * 512
"""The absorbed kernel's query and output per token: each head's query in the latent space
with its rope part, its output in the latent space (FlashMLA's flash_mla_with_kvcache
shapes; SGLang 0.4.6 deepseek_v2.py forward_absorb)."""


def row_of(prefix: str) -> report.Row:
    [row] = [row for name, row in DECODE_ROWS.items() if name.startswith(prefix)]
    return row


def serving(row: report.Row):  # type: ignore[no-untyped-def]
    spec = llmpar.load_spec(row.spec)
    layout, _ = resolve_layout(spec, SESSION.strategies)
    return serving_of(spec, layout, SESSION.strategies)


def decode_phase(row: report.Row) -> llmpar.plan.InferencePhase:
    [phase] = [p for p in llmpar.evaluate(row.spec).serving[0].phases if p.name == "decode"]
    return phase


@pytest.mark.parametrize(("prefix", "sequences", "context"), [
    ("sglang_large_scale_ep", 256, 2001), ("deepseek_v3_inference", 88, 4989)])
def test_the_latent_cache_is_read_once_a_step(prefix: str, sequences: int,
                                              context: int) -> None:
    """All of each sequence's 576-wide latent in every layer, once for all 128 heads,
    the new token's written, the latent query in and the latent output out (bf16)."""
    from llmpar.inference.operations import step_ops

    served = serving(row_of(prefix))
    attention = sum(op.bytes for op in step_ops(served, decode_step(served))
                    if op.name == "attention")
    hand = LAYERS * sequences * ((context + 1) * LATENT_BYTES + (QUERY + OUTPUT) * 2)
    assert attention == pytest.approx(hand, rel=1e-9)


@pytest.mark.parametrize(("prefix", "held"), [("sglang_large_scale_ep", 4),
                                              ("deepseek_v3_inference", 2)])
def test_every_local_expert_is_read_by_each_micro_batch(prefix: str, held: int) -> None:
    """128 (44) tokens a rank under EP64 (EP128) pick 8 of 256 experts each: an expert
    is left out with probability (1 - 8/256)^8192 (^5632), about e^-260 (e^-179)."""
    served = serving(row_of(prefix))
    unit = micro_batch_step(decode_step(served), 2)
    assert active_local_experts(served, unit.tokens) == pytest.approx(held, rel=1e-12)


def test_the_low_latency_transfers_are_deepep_s_measured_ones():
    """58 MoE layers x 2 micro-batches of a 173 us dispatch and a 314 us combine (DeepEP's
    EP64 row at 128 tokens; the dgx-h100 preset's 400 Gb/s NIC is the measured one): the
    plan's all-to-all within 5% (it adds the network latency and the scales' bytes)."""
    plan = llmpar.evaluate(row_of("sglang_large_scale_ep").spec)
    hiding = [c for c in plan.serving[0].collectives if c.hides_behind == "other-micro-batch"]
    assert sum(c.seconds for c in hiding) == pytest.approx(MOE * 2 * (173 + 314) * 1e-6,
                                                           rel=0.05)


def test_the_staged_schedule_by_hand():
    """A micro-batch's dispatch hides behind its shared experts and the other's stage 1,
    its combine behind the other's stage 2 (operations_strategy.py, tbo_delta_stages=2)."""
    from llmpar.inference.overlap import staged_decode_layer_seconds

    # the SGLang row's shapes, roughly (us): stage 1 30, stage 2 200, shared 25,
    # dispatch 173, combine 314: 118 + 114 exposed
    assert staged_decode_layer_seconds(30, 200, 25, 173, 314) == pytest.approx(232)
    # transfers shorter than their windows: nothing exposed
    assert staged_decode_layer_seconds(30, 200, 25, 40, 150) == 0.0
    # a long stage 2 does not hide the dispatch: the windows are not pooled
    assert staged_decode_layer_seconds(0, 1000, 0, 10, 0) == pytest.approx(10)


def test_mla_core_share_is_w_vc_and_o_proj():
    """SGLang's forward_absorb_core runs the absorbed value up-projection (512 x 128 x 128)
    and the output projection (128 x 128 x 7168) after the kernel: 125,829,120 of MLA's
    187,105,280 weights."""
    from llmpar.inference.overlap import attention_core_share

    served = serving(row_of("sglang_large_scale_ep"))
    assert attention_core_share(served) == pytest.approx(125_829_120 / 187_105_280)


@pytest.mark.parametrize("prefix", ["sglang_large_scale_ep", "deepseek_v3_inference"])
def test_the_overlap_hides_no_more_than_the_computation(prefix: str) -> None:
    """The staged schedule leaves exposed at least what the step's computation cannot
    cover, max(0, M - W), and at most all of it; the step is its parts added up."""
    row = row_of(prefix)
    plan = llmpar.evaluate(row.spec)
    phase = decode_phase(row)
    hiding = [c for c in plan.serving[0].collectives if c.hides_behind == "other-micro-batch"]
    total = sum(c.seconds for c in hiding)
    exposed = sum(c.exposed_seconds for c in hiding)
    work = phase.compute_seconds + phase.memory_seconds
    assert max(0.0, total - work) <= exposed <= total
    assert phase.communication_seconds == pytest.approx(exposed)
    assert phase.seconds == pytest.approx(work + exposed + phase.overhead_seconds)
