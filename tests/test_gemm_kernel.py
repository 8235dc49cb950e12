"""FP8 block-scaled product kernels of the engine profiles (`[block_fp8_gemm]`,
llmpar.spec.inference.GemmKernel): the constants are the least-squares fit of the kernel's
law on DeepGEMM's own table (validation/published/kernels/deepgemm_fp8_h800.toml), the law
gives the rows back, a serving step prices its products with it, and it applies only to
FP8 weights in the kernel's blocks."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from validation_scripts import load_script

import llmpar
from llmpar.inference.engine import gemm_compute_efficiency, gemm_depth_factor
from llmpar.inference.evaluate import serving_of
from llmpar.inference.operations import mlp_matrices, projection_matrices, step_ops
from llmpar.inference.phases import decode_step
from llmpar.loading.checks import resolve_layout
from llmpar.roofline import rates_of, seconds
from llmpar.session import Session
from llmpar.spec.inference import GemmKernel

fit = load_script("fit_gemm_kernel")
ROOT = Path(__file__).resolve().parent.parent
H800_FP8_PEAK = 1978.9e12
"""H800 SXM5: the H100 SXM5's dense fp8 peak (specs/gpus/h800-sxm.toml)."""
H800_BANDWIDTH = 3.35e12
"""H800 SXM5: 3.35 TB/s HBM3 (specs/gpus/h800-sxm.toml)."""
PROFILES = {"deepseek-infra": "a6d97a1", "sglang": "989c9e3"}
"""Each profile's kernel and the version of DeepGEMM's table it is fitted on."""


def _profile(engine: str) -> dict[str, Any]:
    table = tomllib.loads((ROOT / "specs" / "engines" / f"{engine}.toml").read_text())
    return dict(table["block_fp8_gemm"])


def _rows(version: str) -> list[dict[str, Any]]:
    found = [k for k in fit.table()["kernel"] if k["version"].startswith(version)]
    assert len(found) == 1
    return list(found[0]["rows"])


def _stated(profile: dict[str, Any]) -> np.ndarray:
    fixed = float(profile["fixed_seconds"].split()[0]) * 1e-6
    assert profile["fixed_seconds"].endswith(" us")
    return np.array([profile["compute_efficiency"], profile["half_rows"],
                     profile["half_depth"], profile["memory_efficiency"], fixed])


# --- the constants are the fit of the kernel's table ---------------------------------------

def test_the_table_is_deepgemms_count_of_flops_and_bytes():
    # Each row's bandwidth is its bytes, g (m k + k n + 2 m n), over the time its TFLOPS give.
    for version in PROFILES.values():
        for row in _rows(version):
            m, _, _, moved, measured = (a[0] for a in fit.shapes([row]))
            assert moved / measured / 1e9 == pytest.approx(row["gb_per_s"], rel=0.002)
            assert m == row["m"]


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_profile_constants_are_the_least_squares_fit(engine):
    profile = _profile(engine)
    rows = _rows(PROFILES[engine])
    assert profile["gpu"] == fit.table()["gpu"] == "h800-sxm"
    assert profile["group_size"] == 128 * 128
    constants = fit.stated(fit.fit(rows, H800_FP8_PEAK, H800_BANDWIDTH))
    assert _stated(profile) == pytest.approx(np.array(list(constants.values())), abs=1e-9)


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_the_law_gives_the_rows_back(engine):
    rows = _rows(PROFILES[engine])
    law = fit.law_seconds(_stated(_profile(engine))[:, None], rows, H800_FP8_PEAK,
                          H800_BANDWIDTH)[:, 0]
    errors = law / fit.shapes(rows)[-1] - 1
    assert np.median(np.abs(errors)) < 0.035
    assert np.max(np.abs(errors)) < 0.28
    # The grouped GEMMs of the experts (prefill's contiguous, decode's masked) within 9%.
    grouped = [abs(e) for e, row in zip(errors, rows, strict=True) if row["layout"] != "normal"]
    assert max(grouped) < 0.09


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_the_fit_is_a_minimum_of_the_squared_log_errors(engine):
    rows = _rows(PROFILES[engine])
    best = fit.fit(rows, H800_FP8_PEAK, H800_BANDWIDTH)
    at_best = fit.loss(best[:, None], rows, H800_FP8_PEAK, H800_BANDWIDTH)
    for index in range(5):
        for factor in (0.95, 1.05):
            moved = best.copy()
            moved[index] *= factor
            if moved[index] > 0:
                assert fit.loss(moved[:, None], rows, H800_FP8_PEAK, H800_BANDWIDTH) >= at_best


# --- the law -------------------------------------------------------------------------------

KERNEL = GemmKernel(name="k", compute_efficiency=0.7, half_rows=100.0, half_depth=400.0,
                    memory_efficiency=0.85)


@given(st.floats(1, 1e6), st.floats(1, 1e6), st.floats(1.01, 100))
def test_the_share_of_the_peak_grows_with_rows_and_depth_below_its_ceiling(rows, depth,
                                                                           factor):
    def share(m: float, k: float) -> float:
        return gemm_compute_efficiency(KERNEL, m, gemm_depth_factor(KERNEL, [(1.0, k)]))

    assert 0 < share(rows, depth) < KERNEL.compute_efficiency
    assert share(rows * factor, depth) > share(rows, depth)
    assert share(rows, depth * factor) > share(rows, depth)


def test_the_depth_share_adds_the_matrices_times():
    # Two matrices, one of depth 400 (share 1/2) and one of depth 1200 (share 3/4), of
    # equal weights: their times add as 2 + 4/3, so the share is 2 / (10/3) = 0.6.
    assert gemm_depth_factor(KERNEL, [(1.0, 400.0), (1.0, 1200.0)]) == pytest.approx(0.6)


def test_deepseek_v3_matrices_are_deepgemms_shapes():
    # The README's shapes are DeepSeek-V3's: q_a + kv_a fused (N = 2112, K = 7168), q_b
    # (24576 x 1536), kv_b (32768 x 512), o (7168 x 16384); the experts' gate-up (4096 x
    # 7168) and down (7168 x 2048).
    model = llmpar.load_spec({"model": "deepseek-v3", "hardware": {"gpu": "h800-sxm"}}).model
    assert projection_matrices(model, 1) == [(2112 * 7168, 7168), (32768 * 512, 512),
                                             (24576 * 1536, 1536), (7168 * 16384, 16384)]
    assert mlp_matrices(model, 2048, 1) == [(4096 * 7168, 7168), (7168 * 2048, 2048)]


# --- a serving step ------------------------------------------------------------------------

DEEPSEEK = {"model": "deepseek-v3", "hardware": {"gpu": "h800-sxm", "num_gpus": 8},
            "parallel": {"data": {"degree": 8}, "expert": {"degree": 8}},
            "inference": {"engine": "deepseek-infra", "weights": "fp8",
                          "weights_group_size": 16384, "batch_size": 32,
                          "prompt_tokens": 2048, "generated_tokens": 256}}


def _decode_ops(table: dict[str, Any]) -> dict[str, Any]:
    session = Session(load_entry_points=False)
    spec = session.load_spec(table)
    layout, _ = resolve_layout(spec, session.strategies)
    serving = serving_of(spec, layout, session.strategies)
    ops = {op.name: op for op in step_ops(serving, decode_step(serving))
           if op.name != "attention projections" or op.bytes > 5e8}
    return {"ops": ops, "rates": rates_of(spec.hardware.gpu), "model": spec.model}


def test_a_decode_steps_projections_by_hand():
    # 32 tokens a step through the 58 MoE layers' projections (the dense 3's are apart):
    # fixed 5 calls x 2.5 us a layer (decode runs the key/value up projection as two
    # absorbed products, by w_kc and by w_vc: SGLang 0.4.6 deepseek_v2.py forward_absorb),
    # FLOPs at 0.701 x 32 / (32 + 62) x the depth share of DeepSeek-V3's matrices, bytes
    # at 0.834 of 3.35 TB/s.
    found = _decode_ops(DEEPSEEK)
    op, rates = found["ops"]["attention projections"], found["rates"]
    profile = _profile("deepseek-infra")
    kernel = GemmKernel(name="k", compute_efficiency=profile["compute_efficiency"],
                        half_rows=profile["half_rows"], half_depth=profile["half_depth"],
                        memory_efficiency=profile["memory_efficiency"])
    depth = gemm_depth_factor(kernel, projection_matrices(found["model"], 1))
    share = 0.701 * 32 / (32 + 62) * depth
    assert op.matmul_efficiency == pytest.approx(share)
    assert op.fixed_seconds == pytest.approx(58 * 5 * 2.5e-6)
    by_hand = op.fixed_seconds + max(op.flops / (H800_FP8_PEAK * share),
                                     op.bytes / (H800_BANDWIDTH * 0.834))
    assert seconds(op, rates) == pytest.approx(by_hand)


def test_routed_experts_run_at_their_tokens_per_expert():
    # 32 tokens x 8 experts over the 32 experts of a GPU that some token picked: the rows of
    # each grouped call.
    found = _decode_ops(DEEPSEEK)
    op = found["ops"]["routed experts"]
    active = 32 * (1 - (1 - 8 / 256) ** (32 * 8))
    depth = op.matmul_efficiency / (0.701 * (256 / active) / (256 / active + 62))
    assert 0 < depth < 1
    assert op.fixed_seconds == pytest.approx(58 * 2 * 2.5e-6)


@pytest.mark.parametrize("change", [{"weights_group_size": None}, {"weights": "bf16"},
                                    {"weights": "int4"}])
def test_other_formats_keep_the_weight_read_shares(change):
    # Without FP8 weights in the kernel's blocks the kernel never applies: the plan is the
    # one of the same profile without it.
    table = {**DEEPSEEK, "inference": {**DEEPSEEK["inference"], **change}}
    profile = tomllib.loads((ROOT / "specs" / "engines" / "deepseek-infra.toml").read_text())
    without = {key: value for key, value in profile.items() if key != "block_fp8_gemm"}
    plain = {**table, "inference": {**table["inference"],
                                    "engine": {"name": "plain", **without}}}
    assert llmpar.evaluate(table).tpot_seconds == llmpar.evaluate(plain).tpot_seconds


def test_the_plan_warns_off_the_gpu_the_kernel_was_measured_on():
    table = {**DEEPSEEK, "hardware": {"gpu": "h100-sxm", "num_gpus": 8}}
    warnings = " ".join(llmpar.evaluate(table).warnings)
    assert "FP8 product kernel 'deepgemm-fp8' was measured on h800-sxm" in warnings
    assert "FP8 product kernel" not in " ".join(llmpar.evaluate(DEEPSEEK).warnings)


@given(st.sampled_from(["deepseek-infra", "sglang"]), st.integers(1, 256),
       st.integers(1, 8192), st.booleans(), st.sampled_from([1, 2, 4, 8]))
def test_tpot_stays_above_the_floor_under_the_kernel(engine, batch, prompt, overlap, e):
    """A decode step under the kernel reads its bytes at most at full bandwidth and runs its
    FLOPs at most at the fp8 peak, with expert parallelism and two-batch overlap."""
    table = {"model": "deepseek-v3", "hardware": {"gpu": "h800-sxm", "num_gpus": 8},
             "parallel": {"data": {"degree": 8}, "expert": {"degree": e}},
             "inference": {"engine": engine, "weights": "fp8", "weights_group_size": 16384,
                           "batch_size": batch, "prompt_tokens": prompt,
                           "generated_tokens": 64, "two_batch_overlap": overlap and batch >= 2}}
    plan = llmpar.evaluate(table)
    decode = plan.phases[1]
    assert plan.tpot_seconds >= decode.bytes / H800_BANDWIDTH
    assert plan.tpot_seconds >= decode.flops / H800_FP8_PEAK
    assert decode.seconds >= decode.floor_seconds
