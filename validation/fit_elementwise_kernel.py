"""Fit the small elementwise kernels' law on their kernel-level table.

    python validation/fit_elementwise_kernel.py

Reads validation/published/kernels/elementwise_h100.toml (RMSNorm and FP8 quantization
kernels on an H100 SXM5, timed inside a CUDA graph with a cold L2) and fits the law of
`llmpar.spec.inference.ElementwiseKernel`:

    seconds = kernels x fixed + bytes / (bandwidth x memory_efficiency)

on its 12 rows (the fused provider one kernel, the unfused two), by least squares on each
row's relative error (the law is linear in fixed and 1 / memory_efficiency, so the fit is
closed-form: every row weighs by 1 / its time). Prints the constants the engine profiles
state (specs/engines/sglang.toml: elementwise_kernels) and each row's error. No run-level
data is read.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "published" / "kernels" / "elementwise_h100.toml"
H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet HBM3 bandwidth (specs/gpus/h100-sxm.toml)."""
BF16, FP8 = 2, 1
PROVIDERS = (("fused_ms", 1, BF16 + FP8), ("unfused_ms", 2, BF16 + BF16 + BF16 + FP8))
"""(column, kernels, bytes per value): flashinfer's rmsnorm_quant reads bf16 and writes
FP8; RMSNorm then static_quant_fp8 read and write bf16, then read bf16 and write FP8."""


def table() -> dict:
    return tomllib.loads(DATA.read_text(encoding="utf-8"))


def rows() -> list[tuple[int, float, float]]:
    """(kernels, bytes, seconds) of each measured row."""
    data = table()
    found = []
    for row in data["rows"]:
        values = row["tokens"] * data["hidden"]
        for column, kernels, per_value in PROVIDERS:
            found.append((kernels, float(values * per_value), row[column] * 1e-3))
    return found


def fit() -> tuple[float, float]:
    """(fixed_seconds, memory_efficiency) minimizing the rows' squared relative errors."""
    measured = rows()
    design = np.array([[k, b / H100_BANDWIDTH] for k, b, _ in measured])
    seconds = np.array([s for _, _, s in measured])
    solution, *_ = np.linalg.lstsq(design / seconds[:, None], np.ones(len(seconds)),
                                   rcond=None)
    fixed, inverse = solution
    return float(fixed), float(1 / inverse)


def law_seconds(kernels: int, moved: float, fixed: float, efficiency: float) -> float:
    return kernels * fixed + moved / (H100_BANDWIDTH * efficiency)


def main() -> int:
    fixed, efficiency = fit()
    print(f"fixed_seconds = {fixed * 1e6:.2f} us, memory_efficiency = {efficiency:.3f}")
    for kernels, moved, seconds in rows():
        law = law_seconds(kernels, moved, fixed, efficiency)
        print(f"  {kernels} kernel(s), {moved / 1e6:7.1f} MB: measured {seconds * 1e6:7.2f} "
              f"us, law {law * 1e6:7.2f} us ({law / seconds - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
