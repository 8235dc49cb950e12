"""Fit the FP8 block-scaled product kernel's law on DeepGEMM's own table.

    python validation/fit_gemm_kernel.py

Reads validation/published/kernels/deepgemm_fp8_h800.toml (DeepGEMM's README tables on an
H800 SXM5, two versions) and fits, per version, the law of `llmpar.spec.inference.
GemmKernel`:

    seconds = fixed + max(FLOPs / (peak x e x m / (m + half_rows) x k / (k + half_depth)),
                          bytes / (bandwidth x memory_efficiency))

by least squares on the log of each row's time (every row weighs alike, whatever its
size): a grid over the five constants, then coordinate descent from its best point with
halving steps. Prints the constants the engine profiles state (specs/engines/sglang.toml
and deepseek.toml: block_fp8_gemm) and each row's error. No run-level data is read.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "published" / "kernels" / "deepgemm_fp8_h800.toml"
NAMES = ("compute_efficiency", "half_rows", "half_depth", "memory_efficiency",
         "fixed_seconds")
GRID = (np.linspace(0.6, 0.9, 7), np.linspace(0, 400, 9), np.linspace(0, 1200, 9),
        np.linspace(0.6, 0.95, 8), np.linspace(0, 6e-6, 7))
"""Each constant's grid before the descent."""
FIRST_STEPS = np.array([0.02, 20.0, 60.0, 0.02, 0.5e-6])
ROUNDING = (3, 0, 0, 3, 7)
"""Decimals the profiles state each constant to (fixed_seconds to 0.1 us)."""


def table() -> dict:
    return tomllib.loads(DATA.read_text(encoding="utf-8"))


def shapes(rows: list[dict]) -> tuple[np.ndarray, ...]:
    """(m, k, FLOPs, bytes, seconds) of each row: FLOPs 2 g m n k, bytes DeepGEMM's count
    g (m k + k n + 2 m n), seconds FLOPs over the TFLOPS."""
    g, m, n, k = (np.array([row[key] for row in rows], float)
                  for key in ("groups", "m", "n", "k"))
    flops = 2 * g * m * n * k
    moved = g * (m * k + k * n + 2 * m * n)
    seconds = flops / (np.array([row["tflops"] for row in rows], float) * 1e12)
    return m, k, flops, moved, seconds


def law_seconds(constants: np.ndarray, rows: list[dict], peak: float,
                bandwidth: float) -> np.ndarray:
    """The law's time of each row under `constants` (in NAMES' order; each may carry
    trailing grid axes)."""
    e, half_rows, half_depth, memory, fixed = constants
    m, k, flops, moved, _ = shapes(rows)
    shape = (-1,) + (1,) * np.ndim(e)
    m, k, flops, moved = (a.reshape(shape) for a in (m, k, flops, moved))
    compute = flops * (m + half_rows) / m * (k + half_depth) / k / (peak * e)
    return fixed + np.maximum(compute, moved / (bandwidth * memory))


def loss(constants: np.ndarray, rows: list[dict], peak: float, bandwidth: float) -> float:
    measured = shapes(rows)[-1]
    return float(np.sum(np.log(law_seconds(constants, rows, peak, bandwidth)[:, 0]
                               / measured) ** 2))


def fit(rows: list[dict], peak: float, bandwidth: float) -> np.ndarray:
    """The least-squares constants (NAMES' order)."""
    measured = shapes(rows)[-1]
    grid = np.array(np.meshgrid(*GRID, indexing="ij"))
    flat = grid.reshape(5, -1)
    errors = np.log(law_seconds(flat, rows, peak, bandwidth) / measured[:, None])
    best = flat[:, int(np.argmin(np.sum(errors ** 2, axis=0)))].copy()
    step = FIRST_STEPS.copy()
    current = loss(best[:, None], rows, peak, bandwidth)
    for _ in range(400):
        moved = False
        for index, sign in itertools.product(range(5), (1.0, -1.0)):
            trial = best.copy()
            trial[index] += sign * step[index]
            if trial[index] < 0 or (index in (0, 3) and trial[index] > 1):
                continue
            value = loss(trial[:, None], rows, peak, bandwidth)
            if value < current:
                best, current, moved = trial, value, True
        if not moved:
            step /= 2
            if np.all(step < FIRST_STEPS * 1e-4):
                break
    return best


def stated(constants: np.ndarray) -> dict[str, float]:
    """The constants as the profiles state them (rounded)."""
    return {name: round(float(value), digits)
            for name, value, digits in zip(NAMES, constants, ROUNDING, strict=True)}


def main() -> int:
    data = table()
    peak, bandwidth = data["peak_fp8_flops_per_s"], data["hbm_bandwidth_bytes_per_s"]
    for kernel in data["kernel"]:
        rows = kernel["rows"]
        constants = stated(fit(rows, peak, bandwidth))
        values = np.array(list(constants.values()))
        errors = law_seconds(values[:, None], rows, peak, bandwidth)[:, 0] / shapes(rows)[-1] - 1
        print(f"{kernel['name']} {kernel['version']}")
        print("  " + ", ".join(f"{k} = {v:g}" for k, v in constants.items()))
        for row, error in zip(rows, errors, strict=True):
            print(f"  {row['layout']:10s} g={row['groups']} m={row['m']:5d} n={row['n']:5d} "
                  f"k={row['k']:5d}: {error:+.1%}")
        print(f"  worst {np.max(np.abs(errors)):.1%}, median {np.median(np.abs(errors)):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
