"""The time law of one matrix product (llmpar.evaluation.matmuls) against measured GEMMs
(validation/published/gemm/, each file with its citation).

The law: fixed + max(FLOPs / (peak x efficiency), bytes / (HBM bandwidth x memory
efficiency)). The presets' `matmul_efficiency` is what whole training steps reach, below
what one large GEMM reaches alone, so the law is checked here with the plateau each sweep
itself shows (its best efficiency among shapes of at least 2 x 4096^3 FLOPs) and the
preset's `matmul_fixed_seconds` and `memory_efficiency`: what is tested is how time
depends on shape.

Tolerance: rows of at least 2 x 1024^3 FLOPs (below that, launch and timing harness
dominate) whose dimensions are multiples of 64 (a misaligned one, 1000 tokens in the Vidur
sweep, takes other kernels and runs at 0.65 of the law; llmpar assumes aligned shapes),
predicted / measured within [0.7, 1.2] row by row and within 12% at the median. Today:
OpenXLA's H100 table 0.76 to 1.07 (median 0.97), the Triton issue's A100 squares 0.72 to
1.07 (0.95), Vidur's A100 Llama-2-7B shapes 0.72 to 1.03 (0.90; its source does not say
which A100). Without the fixed time the smallest of these products come out up to 3.7x
too fast on the H100 table.
"""

from __future__ import annotations

import statistics
import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.evaluation.matmuls import Product, pass_seconds
from llmpar.roofline import Rates

GEMM = Path(__file__).resolve().parent.parent / "validation" / "published" / "gemm"
if not GEMM.is_dir():  # an sdist ships no validation/
    pytest.skip("validation/ is not part of this tree", allow_module_level=True)

SESSION = llmpar.Session(load_entry_points=False)
SWEEPS = ["xla_sm90_matmul_perf_table", "triton_issue3551_a100_fp16",
          "vidur_a100_llama2_7b_fp16"]
SMALLEST_FLOPS = 2 * 1024**3
PLATEAU_FLOPS = 2 * 4096**3


def measured(data: dict) -> list[tuple[int, int, int, float]]:
    """(m, n, k, seconds) of every row."""
    found = []
    for row in data["rows"]:
        m, n, k = row["m"], row["n"], row["k"]
        seconds = (row["time_us"] * 1e-6 if "time_us" in row
                   else 2 * m * n * k / (row["tflops"] * 1e12))
        found.append((m, n, k, seconds))
    return found


def ratios(name: str) -> list[float]:
    data = tomllib.loads((GEMM / f"{name}.toml").read_text())
    dtype = data["dtype"]
    spec = SESSION.load_spec({"model": {"parameters": 1e9},
                              "hardware": {"gpu": data["gpu"]},
                              "precision": {"weights": dtype, "activations": dtype}})
    gpu = spec.hardware.gpu
    peak = gpu.peak_flops_per_s(dtype)
    rows = measured(data)
    plateau = max(2 * m * n * k / s / peak for m, n, k, s in rows
                  if 2 * m * n * k >= min(PLATEAU_FLOPS, max(2 * m * n * k for m, n, k, _ in rows)))
    rates = Rates(gpu=gpu, matmul_efficiency=plateau,
                  memory_efficiency=gpu.memory_efficiency or 0.8, source="test")
    found = []
    for m, n, k, seconds in rows:
        if 2 * m * n * k < SMALLEST_FLOPS or any(d % 64 for d in (m, n, k)):
            continue
        time, _ = pass_seconds(Product(name="gemm", m=m, n=n, k=k, weights=False), spec, rates)
        found.append(time / seconds)
    return found


@pytest.mark.parametrize("name", SWEEPS)
def test_time_law_follows_measured_gemms(name):
    found = ratios(name)
    assert len(found) >= 10
    assert all(0.7 <= r <= 1.2 for r in found), sorted(found)
    assert statistics.median(found) == pytest.approx(1.0, abs=0.12)
