"""What a decode step runs beside its products and attention, each derived by hand: the
small elementwise kernels' fixed time and bandwidth share (`[elementwise_kernels]`,
fitted on validation/published/kernels/elementwise_h100.toml), multi-head latent
attention's absorbed widths and its own small kernels, and DeepEP's low-latency send and
receive kernels on the compute stream under two-batch overlap
(llmpar.inference.elementwise, llmpar.inference.operations).

Shapes from DeepSeek-V3's config.json: 61 layers (3 dense, 58 MoE), hidden 7,168, 128
heads with q/k 192 wide (128 without rope, 64 rope) and v 128, q_lora_rank 1,536,
kv_lora_rank 512, 256 routed experts of width 2,048, top-8, one shared expert."""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import pytest
from validation_scripts import load_script

import llmpar
from llmpar.inference.evaluate import serving_of
from llmpar.inference.operations import absorbed_widths, step_ops
from llmpar.inference.overlap import micro_batch_step
from llmpar.inference.phases import decode_step
from llmpar.loading.checks import resolve_layout
from llmpar.roofline import Operation, rates_of, seconds

ROOT = Path(__file__).resolve().parent.parent
fit = load_script("fit_elementwise_kernel")
report = load_script("published_serving")
SESSION = llmpar.Session(load_entry_points=False)

LAYERS, MOE, HIDDEN, HEADS = 61, 58, 7168, 128
NOPE, ROPE, V_HEAD, Q_LORA, KV_LORA = 128, 64, 128, 1536, 512
TOP_K, EXPERT_WIDTH = 8, 2048
H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet (specs/gpus/h100-sxm.toml)."""


def _profile(name: str) -> dict:
    return tomllib.loads((ROOT / "specs" / "engines" / f"{name}.toml").read_text())


def _sglang_row() -> report.Row:
    [row] = [row for name, row in report.all_rows()
             if name.startswith("sglang_large_scale_ep") and row.phase == "decode"]
    return row


def _serving(table: dict):  # type: ignore[no-untyped-def]
    spec = SESSION.load_spec(table)
    layout, _ = resolve_layout(spec, SESSION.strategies)
    return serving_of(spec, layout, SESSION.strategies)


def _ops(table: dict, micro_batches: int = 1) -> dict[str, Operation]:
    """One (micro-batch's) decode step's operations, those of one name (each layer kind's)
    added up."""
    served = _serving(table)
    step = micro_batch_step(decode_step(served), micro_batches)
    found: dict[str, Operation] = {}
    for op in step_ops(served, step):
        if op.name in found:
            seen = found[op.name]
            assert seen.memory_efficiency == op.memory_efficiency
            op = attrs.evolve(seen, flops=seen.flops + op.flops, bytes=seen.bytes + op.bytes,
                              fixed_seconds=seen.fixed_seconds + op.fixed_seconds)
        found[op.name] = op
    return found


def _without_table(table: dict) -> dict:
    engine = {key: value for key, value in _profile("sglang").items()
              if key != "elementwise_kernels"}
    return {**table, "inference": {**table["inference"], "engine": {"name": "sglang-no-table",
                                                                    **engine}}}


def test_the_profile_states_the_fit_of_the_kernel_table():
    # 12 rows: flashinfer's fused RMSNorm + FP8 quantization (1 kernel) and SGLang's RMSNorm
    # then static_quant_fp8 (2 kernels), 512 to 16,384 tokens of 4,096, in a CUDA graph.
    fixed, share = fit.fit()
    stated = _profile("sglang")["elementwise_kernels"]
    assert float(stated["fixed_seconds"].split()[0]) * 1e-6 == pytest.approx(fixed, abs=5e-9)
    assert stated["memory_efficiency"] == pytest.approx(share, abs=5e-4)
    errors = [fit.law_seconds(k, b, fixed, share) / s - 1 for k, b, s in fit.rows()]
    assert len(errors) == 12
    assert max(abs(e) for e in errors) < 0.27
    # by hand, the smallest fused row: 512 x 4,096 values read in bf16 and written in FP8
    moved = 512 * 4096 * 3
    assert fit.law_seconds(1, moved, fixed, share) == pytest.approx(
        fixed + moved / (H100_BANDWIDTH * share))


def test_absorbed_widths_of_deepseek_v3_by_hand():
    # projections: hidden in and out, the latents (576 + 1,536), the query up-projection's
    # 128 x 192, the key up-projection's latent query and the value up-projection's read of
    # the latent output (2 x 128 x 512), and 128 x 128 into the output projection; the
    # kernel: 128 x (512 + 64) in and 128 x 512 out.
    model = SESSION.load_spec(_sglang_row().spec).model
    projections, attention = absorbed_widths(model, 1)
    assert projections == 2 * HIDDEN + (KV_LORA + ROPE) + Q_LORA + HEADS * (NOPE + ROPE) \
        + 2 * HEADS * KV_LORA + HEADS * V_HEAD
    assert attention == HEADS * (KV_LORA + ROPE + KV_LORA)
    # tensor parallelism splits the heads, not the latents nor the hidden size
    projections_2, attention_2 = absorbed_widths(model, 2)
    assert attention_2 == attention / 2
    assert projections_2 == pytest.approx(
        2 * HIDDEN + KV_LORA + ROPE + Q_LORA + (projections - 2 * HIDDEN - KV_LORA - ROPE
                                                 - Q_LORA) / 2)


def test_a_decode_micro_batchs_small_kernels_by_hand():
    # The SGLang decode row, one micro-batch of 128 tokens: per layer two fused
    # add-RMSNorms, the latent norms and rotary
    # (q_a 1,536 and kv_a 512 read and written; the rope parts of 128 query heads and the
    # key), four kernels with the cache write; each kernel 0.54 us beside its bytes at
    # 0.682 of 3.35 TB/s.
    ops = _ops(_sglang_row().spec, micro_batches=2)
    rates = rates_of(SESSION.load_spec(_sglang_row().spec).hardware.gpu)
    tokens, fixed, share = 128, 0.54e-6, 0.682
    norms = ops["norms and residuals"]
    assert norms.fixed_seconds == pytest.approx(LAYERS * 2 * fixed)
    assert norms.memory_efficiency == share
    latent = ops["latent norms and rotary"]
    values = Q_LORA + KV_LORA + (HEADS + 1) * ROPE
    assert latent.bytes == pytest.approx(LAYERS * tokens * 2 * values * 2)
    assert latent.fixed_seconds == pytest.approx(LAYERS * 4 * fixed)
    assert seconds(latent, rates) == pytest.approx(
        LAYERS * 4 * fixed + latent.bytes / (H100_BANDWIDTH * share))
    # the router keeps its weight read's share and adds its top-k kernel
    assert ops["router"].fixed_seconds == pytest.approx(MOE * fixed)
    # the projections' inputs quantized: the fused down projections' (7,168), the query
    # up-projection's (1,536), the absorbed products' (128 x 128 and 128 x 512) and the
    # output projection's (128 x 128), five kernels a layer
    quantized = ops["projection inputs quantization"]
    inputs = HIDDEN + Q_LORA + HEADS * (NOPE + KV_LORA) + HEADS * V_HEAD
    assert quantized.bytes == pytest.approx(LAYERS * tokens * inputs * (2 + 1 + 4 / 128))
    assert quantized.fixed_seconds == pytest.approx(LAYERS * 5 * fixed)


def test_deepeps_send_and_receive_kernels_by_hand():
    # 128 tokens of a micro-batch under EP64, each sent to 8 experts: 1,024 pairs out and
    # (balanced) 1,024 in. Dispatch: each token cast from bf16 to FP8 with a 4-byte scale
    # per 128 values; each received pair copied from the receive buffer into the experts'
    # layout (read and written in FP8). Combine: each expert output (bf16) copied into the
    # send buffer; each token's 8 returned copies read and their sum written (bf16).
    ops = _ops(_sglang_row().spec, micro_batches=2)
    tokens, pairs, fp8 = 128, 128 * TOP_K, 1 + 4 / 128
    dispatch = tokens * HIDDEN * (2 + fp8) + pairs * HIDDEN * 2 * fp8
    combine = pairs * HIDDEN * 2 * 2 + tokens * HIDDEN * (TOP_K + 1) * 2
    exchange = ops["expert exchange passes"]
    assert exchange.bytes == pytest.approx(MOE * (dispatch + combine))
    assert exchange.fixed_seconds == pytest.approx(MOE * 4 * 0.54e-6)


def test_the_exchange_kernels_are_counted_only_behind_the_hook():
    # Without two-batch overlap the dispatch and combine run whole, their kernels inside
    # DeepEP's measured times: no operation of their own.
    row = _sglang_row()
    table = {**row.spec, "inference": {**row.spec["inference"], "two_batch_overlap": False}}
    assert "expert exchange passes" not in _ops(table)
    assert "expert exchange passes" in _ops(row.spec)


def test_without_the_kernel_table_no_time_per_kernel():
    # The same profile less its [elementwise_kernels]: no fixed time on any elementwise
    # operation, no latent norms and rotary operation, and the step is shorter.
    row = _sglang_row()
    ops = _ops(_without_table(row.spec), micro_batches=2)
    assert "latent norms and rotary" not in ops
    for name in ("norms and residuals", "router", "projection inputs quantization",
                 "expert exchange passes", "embedding"):
        assert ops[name].fixed_seconds == 0.0
    with_table = llmpar.evaluate(row.spec).serving[0].tpot_seconds
    without = llmpar.evaluate(_without_table(row.spec)).serving[0].tpot_seconds
    assert with_table is not None and without is not None
    assert with_table > without


def test_a_dense_model_without_an_engine_is_unchanged_by_mla_widths():
    # Llama-3-8B has no latent attention: its decode's attention reads and writes the
    # query and output (32 heads x 128 each), as before.
    table = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
             "inference": {"batch_size": 4, "prompt_tokens": 2048, "generated_tokens": 256}}
    served = _serving(table)
    ops = {op.name: op for op in step_ops(served, decode_step(served))}
    # the cache at the mean decode context, 2,048 + 256 / 2 tokens, and the new token's
    # key and value: layers x sequences x tokens x (K, V) x 8 KV heads x 128 x bf16
    cache = 32 * 4 * (2048 + 128 + 1) * 2 * 8 * 128 * 2
    io = 32 * 4 * (32 * 128 + 32 * 128) * 2
    assert ops["attention"].bytes == pytest.approx(cache + io, rel=1e-3)
    assert "latent norms and rotary" not in ops
