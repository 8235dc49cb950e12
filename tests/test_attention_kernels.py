"""Serving engines' attention kernels: each profile's constants are the least-squares fit
of its kernel's law on the measurements committed under validation/published/kernels/,
the law reproduces every measured row, and a serving step prices its attention with it
(llmpar.spec.inference.AttentionKernel, llmpar.inference.engine)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

import llmpar
from llmpar.inference.engine import kernel_compute_efficiency
from llmpar.spec.inference import AttentionKernel

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "validation" / "published" / "kernels"
H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet: 3.35 TB/s (specs/gpus/h100-sxm.toml)."""
H100_PEAK = 989.4e12
"""H100 SXM5 datasheet: 989.4 TFLOP/s dense bf16 (specs/gpus/h100-sxm.toml)."""
H100_MATMUL: float = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "specs" / "gpus" / "h100-sxm.toml").read_text()
)["matmul_efficiency"]
"""specs/gpus/h100-sxm.toml's matmul_efficiency, what a null engine runs every product at."""
NULL_ENGINE = {"name": "null", "version": "0", "source": "a profile that adds nothing",
               "step_overhead_seconds": 0.0}
LLAMA_8B = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "inference": {"batch_size": 8, "prompt_tokens": 2048, "generated_tokens": 256}}


def _kernels(name: str) -> dict[str, dict]:
    table = tomllib.loads((KERNELS / name).read_text())
    return {kernel["name"]: kernel for kernel in table["kernel"]}


def _profile(engine: str, table: str) -> dict:
    return tomllib.loads((ROOT / "specs" / "engines" / f"{engine}.toml").read_text())[table]


def _decode_rows(kernel: dict) -> tuple[np.ndarray, np.ndarray]:
    """(bytes read, seconds) of a decode kernel's rows."""
    rows = kernel["rows"]
    read = np.array([r.get("read_bytes", r.get("read_mib", 0) * 2**20) for r in rows], float)
    return read, np.array([r["gpu_us"] for r in rows]) * 1e-6


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    a, b = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)[0]
    return float(a), float(b)


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


# --- the constants are the fits of the kernel data ----------------------------------------

@pytest.mark.parametrize(("engine", "kernel", "worst"), [
    ("vllm", "flash-attention-2-paged", 0.051), ("sglang", "flash-attention-3-paged", 0.05)])
def test_paged_decode_is_a_fixed_time_plus_the_cache_at_a_bandwidth_share(engine, kernel,
                                                                           worst):
    # seconds = fixed + bytes / (bandwidth x share): a line in the bytes read.
    measured = _kernels("attention_decode_h100.toml")[kernel]
    read, seconds = _decode_rows(measured)
    fixed, slope = _line(read, seconds)
    profile = _profile(engine, "decode_attention")
    assert profile["name"] == kernel and profile["gpu"] == measured["gpu"] == "h100-sxm"
    assert profile["memory_efficiency"] == round(1 / (slope * H100_BANDWIDTH), 3)
    assert _seconds(profile["fixed_seconds"]) == pytest.approx(round(fixed * 1e6, 1) * 1e-6)
    law = (_seconds(profile["fixed_seconds"])
           + read / (H100_BANDWIDTH * profile["memory_efficiency"]))
    assert np.max(np.abs(law / seconds - 1)) < worst
    # The achieved share of bandwidth saturates: it rises with the bytes, below the share.
    achieved = read / seconds / H100_BANDWIDTH
    assert np.all(np.diff(achieved) > 0) and np.all(achieved < profile["memory_efficiency"])


def test_flashmla_reads_at_its_measured_share_and_computes_at_its_readme_peak():
    measured = _kernels("attention_decode_h100.toml")["flashmla"]
    profile = _profile("sglang", "mla_decode_attention")
    read, seconds = [], []
    for row in measured["rows"]:
        b, s_k, h_q, s_q = row["sequences"], row["context"], row["query_heads"], row["queries"]
        d, dv = measured["head_dim"], measured["value_dim"]
        # Bytes and FLOPs as FlashMLA's test counts them, which its reported rates match.
        moved = (b * s_k * measured["kv_heads"] * d + b * s_q * h_q * (d + dv)) * 2
        flops = 2 * b * s_q * h_q * s_k * (d + dv)
        assert moved / (row["ms"] * 1e-3) / 1e9 == pytest.approx(row["gb_per_s"], rel=0.002)
        assert flops / (row["ms"] * 1e-3) / 1e12 == pytest.approx(row["tflops"], rel=0.01)
        assert h_q * s_q < 128  # memory-bound: the ridge of the deep-dive
        read.append(moved)
        seconds.append(row["ms"] * 1e-3)
    # One size of read in every row: the share is their bytes over their time, no fixed time.
    share = sum(read) / sum(seconds) / H100_BANDWIDTH
    assert profile["memory_efficiency"] == round(share, 3) and "fixed_seconds" not in profile
    assert profile["compute_efficiency"] == round(
        measured["compute_bound_tflops"] * 1e12 / H100_PEAK, 3)
    law = np.array(read) / (H100_BANDWIDTH * profile["memory_efficiency"])
    assert np.max(np.abs(law / np.array(seconds) - 1)) < 0.02
    # The README's best memory-bound read on the H800 SXM5 (the H100's 3.35 TB/s): above the
    # share fitted on the H100 rows, which stop at 64 query heads a token, and within 7% of it.
    best = measured["memory_bound_gb_per_s"] * 1e9 / H100_BANDWIDTH
    assert best == pytest.approx(0.896, abs=5e-4)
    assert profile["memory_efficiency"] < best < profile["memory_efficiency"] * 1.07


@pytest.mark.parametrize(("engine", "kernel", "worst"), [
    ("sglang", "flash-attention-3", 0.015), ("vllm", "flash-attention-2-varlen", 0.025)])
def test_prefill_share_of_the_peak_grows_with_the_keys_per_query(engine, kernel, worst):
    # share = e x k / (k + h): 1 / TFLOPS = (1 + h / k) / (e x peak), a line in 1 / k.
    measured = _kernels("attention_prefill_h100.toml")[kernel]
    keys = np.array([r["sequence"] for r in measured["rows"]], float)
    tflops = np.array([r["tflops"] for r in measured["rows"]]) * 1e12
    a, b = _line(1 / keys, 1 / tflops)
    profile = _profile(engine, "prefill_attention")
    assert profile["name"] == kernel and profile["gpu"] == measured["gpu"] == "h100-sxm"
    assert profile["compute_efficiency"] == round(1 / (a * H100_PEAK), 3)
    assert profile["half_keys"] == round(b / a)
    fitted = AttentionKernel(name=kernel, compute_efficiency=profile["compute_efficiency"],
                             half_keys=profile["half_keys"])
    law = np.array([kernel_compute_efficiency(fitted, k) or 0.0 for k in keys]) * H100_PEAK
    assert np.max(np.abs(law / tflops - 1)) < worst
    for row in measured.get("paper_rows", []):  # the same kernel in another harness
        share = kernel_compute_efficiency(fitted, row["sequence"]) or 0.0
        assert share * H100_PEAK / (row["tflops"] * 1e12) == pytest.approx(1, abs=0.10)


def test_flash_attention_2_reaches_about_the_third_of_the_h100_peak_its_successor_states():
    # FlashAttention-3's abstract: FlashAttention-2 reaches about 35% of the H100's peak.
    assert 0.33 < _profile("vllm", "prefill_attention")["compute_efficiency"] < 0.40


# --- the serving step prices attention with the kernel -------------------------------------

def _engine(**kernels: dict) -> dict:
    return {**NULL_ENGINE, **kernels}


def _plan(spec: dict, engine: dict | None, **inference: object) -> llmpar.Plan:
    table = {**spec["inference"], **inference}
    if engine is not None:
        table["engine"] = engine
    return llmpar.evaluate({**spec, "inference": table})


def test_a_kernel_at_the_gpus_efficiencies_changes_nothing():
    gpu = {"name": "same", "memory_efficiency": 0.8, "compute_efficiency": H100_MATMUL}
    plain = _plan(LLAMA_8B, NULL_ENGINE)
    same = _plan(LLAMA_8B, _engine(decode_attention=gpu, prefill_attention=gpu))
    assert same.tpot_seconds == pytest.approx(plain.tpot_seconds, rel=1e-12)
    assert same.serving[0].prefill_seconds == pytest.approx(plain.serving[0].prefill_seconds,
                                                            rel=1e-12)


def test_the_fixed_time_is_paid_once_per_layer_and_step():
    kernel = {"name": "k", "memory_efficiency": 0.8}
    fixed = {**kernel, "fixed_seconds": "10 us"}
    for batch in (1, 64):
        without = _plan(LLAMA_8B, _engine(decode_attention=kernel), batch_size=batch)
        with_fixed = _plan(LLAMA_8B, _engine(decode_attention=fixed), batch_size=batch)
        assert with_fixed.tpot_seconds - without.tpot_seconds == pytest.approx(32 * 10e-6,
                                                                               rel=1e-9)


def test_cache_reads_at_a_lower_share_take_longer_by_hand():
    # Llama-3-8B at batch 64, every decode operation memory-bound (null engine: the GPU's
    # 0.8 elsewhere). Attention per layer reads each sequence's 2,176 cached tokens once
    # (prompt 2,048 + 256 / 2), writes the new token's K and V, and reads and writes the
    # queries and outputs: 8 KV heads x 128 x 2 (K, V) x 2 bytes = 4,096 bytes a token.
    def decode(share: float) -> llmpar.plan.InferencePhase:
        kernel = {"name": "k", "memory_efficiency": share}
        return _plan(LLAMA_8B, _engine(decode_attention=kernel), batch_size=64).phases[1]
    fast, slow = decode(0.8), decode(0.4)
    cache = 32 * (64 * 2176 * 4096 + 64 * 4096 + 64 * (4096 + 4096) * 2)
    assert fast.compute_seconds == slow.compute_seconds == 0.0
    assert slow.memory_seconds - fast.memory_seconds == pytest.approx(
        cache / (H100_BANDWIDTH * 0.8), rel=1e-9)


def test_prefill_attention_runs_at_the_kernels_share_for_its_keys_by_hand():
    # Llama-3-8B, one 4,096-token prompt: every product compute-bound (attention does 512
    # FLOPs a byte: 2 x 32 heads x 256 per pair, 4,096 cache bytes per 128-query tile).
    # Causal attention has 4,096 x 4,097 / 2 pairs a layer and each query attends 4,097 / 2
    # keys on average: the kernel's share 0.637 x k / (k + 235) replaces the GPU's
    # matmul_efficiency.
    kernel = {"name": "fa", "compute_efficiency": 0.637, "half_keys": 235}

    def prefill(engine: dict, prompt: int) -> llmpar.plan.InferencePhase:
        return _plan(LLAMA_8B, engine, prompt_tokens=prompt, batch_size=1).phases[0]
    base, measured = prefill(NULL_ENGINE, 4096), prefill(_engine(prefill_attention=kernel), 4096)
    flops = 32 * 4096 * 4097 / 2 * 2 * 32 * 256
    keys = 4097 / 2
    share = 0.637 * keys / (keys + 235)
    assert measured.memory_seconds == base.memory_seconds
    assert measured.compute_seconds - base.compute_seconds == pytest.approx(
        flops / H100_PEAK * (1 / share - 1 / H100_MATMUL), rel=1e-9)
    # Shorter prompts: fewer keys per query, a smaller share, a slower attention per FLOP
    # (the share each prompt's extra compute time implies, as above; the whole prefill's
    # slowdown also weighs attention's part of it, which grows with the prompt).
    shares = []
    for prompt in (1024, 4096, 16384):
        extra = (prefill(_engine(prefill_attention=kernel), prompt).compute_seconds
                 - prefill(NULL_ENGINE, prompt).compute_seconds)
        pair_flops = 32 * prompt * (prompt + 1) / 2 * 2 * 32 * 256
        shares.append(1 / (extra * H100_PEAK / pair_flops + 1 / H100_MATMUL))
    keys = [(prompt + 1) / 2 for prompt in (1024, 4096, 16384)]
    # compute-bound from 4,096 tokens on (above): the law itself; at 1,024 smaller still
    assert shares[1:] == pytest.approx([0.637 * k / (k + 235) for k in keys[1:]], rel=1e-9)
    assert shares == sorted(shares)


def test_latent_attention_decodes_through_its_own_kernel_only():
    spec = {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "inference": {"batch_size": 16, "prompt_tokens": 1024, "generated_tokens": 64,
                          "weights": "fp8"},
            "parallel": {"expert": {"degree": 8}, "data": {"degree": 8}}}
    plain = _plan(spec, NULL_ENGINE)
    paged = _plan(spec, _engine(decode_attention={"name": "k", "memory_efficiency": 0.1}))
    assert paged.tpot_seconds == plain.tpot_seconds
    mla = _plan(spec, _engine(mla_decode_attention={"name": "m", "memory_efficiency": 0.1}))
    assert mla.tpot_seconds > plain.tpot_seconds


def test_the_shipped_profiles_warn_off_the_gpu_they_were_measured_on():
    a100 = {**LLAMA_8B, "hardware": {"gpu": "a100-sxm-80gb"}}
    plan = _plan(a100, "sglang")
    assert any("attention kernel 'flash-attention-3' was measured on h100-sxm" in w
               for w in plan.warnings)
    assert not any("attention kernel" in w for w in _plan(LLAMA_8B, "sglang").warnings)


@pytest.mark.parametrize(("kernel", "path"), [
    ({"name": "k", "memory_efficiency": 1.5},
     "$.inference.engine.decode_attention.memory_efficiency"),
    ({"name": "k", "half_keys": -1}, "$.inference.engine.decode_attention.half_keys"),
    ({"memory_efficiency": 0.5}, "$.inference.engine.decode_attention.name"),
])
def test_bad_kernels_name_their_key(kernel, path):
    with pytest.raises(llmpar.SpecError) as error:
        _plan(LLAMA_8B, _engine(decode_attention=kernel))
    assert [p.path for p in error.value.problems] == [path]
