#!/usr/bin/env python3
"""Fit the training attention kernels' law on their kernel-level measurements.

The data: validation/published/kernels/attention_training_*.toml, the bar labels of the
FlashAttention-2 paper (A100) and the FlashAttention-3 paper (H100), each a kernel's
forward or backward TFLOP/s over sequence lengths 512 to 16k, head width 64 or 128,
with or without the causal mask, at 16k tokens a call. The law
(`llmpar.spec.hardware.AttentionKernelRate`): the share of the peak one call reaches is

    e x k / (k + h) x d (128 + w) / (128 (d + w))

with k the keys each query attends and d the head width: e the share with many keys at
width 128, h the keys at which a tile's fixed prologue and epilogue cost as much as its
pass over the keys, w the width at which the online softmax's non-matrix work per score
costs as much as the products'. Two mechanisms bring the causal rows onto the same law:

- a causal kernel skips the key tiles above the diagonal and computes the diagonal ones
  whole (FlashAttention-2, Sec. 3.1.1): of n = s / 128 tiles a side it runs n (n + 1) / 2,
  so each query tile passes over (n + 1) / 2 key tiles on average, k = 128 (n + 1) / 2;
- the papers count a causal call's FLOPs as half the square, while it executes
  (n + 1) / (2 n) of it: the rate it runs its executed FLOPs at is the reported one
  x (n + 1) / n.

The fit: for each w on a grid of whole numbers (0 to 300), 1 / share x (d + w) 128 /
(d (128 + w)) is a line in 1 / k, whose least squares give e and h; the w whose line
leaves the smallest sum of squared relative residuals wins. e is rounded to three
digits, h and w to whole numbers, as the GPU presets state them (`attention_kernels`;
tests/test_training_attention.py holds them equal to this fit).

The A100's rows are FlashAttention-2's forward plus backward at head width 64 alone, so
their one law serves both passes, and w is not fitted there but carried over from
FlashAttention-2 on the H100: the FLOP-weighted mean of its forward's and backward's w
(1 part forward, 2.5 parts backward). The same kernel code's ratio of softmax work to
product work depends on the ratio of the GPU's non-matrix to matrix throughput, which
is about the same on both (A100: 19.5 TFLOP/s fp32 against 312 fp16, 16x, the
FlashAttention-2 paper's Sec. 3.1; H100 SXM5: 66.9 against 989.4, 14.8x, its datasheet).

GPUs of a measured GPU's architecture that have no measurement of their own (the other
Hopper parts, the other A100s; `DERIVED_FROM`) take its laws with the share of the peak
scaled by their preset's matmul_efficiency over the measured GPU's: the same kernel code
on the same SM design reaches the same fraction of what the GPU's dense GEMMs reach, the
rule the presets' matmul_efficiency was itself carried over by (each preset's
efficiency_source). Derived, not measured: the preset's efficiency_uncertainty applies.

Usage:
  python validation/fit_attention_kernels.py           # the fits and their worst rows
  python validation/fit_attention_kernels.py --toml    # the presets' rows, as TOML
  python validation/fit_attention_kernels.py --write   # rewrite the derived presets' rows
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmpar.evaluation.attention import BACKWARD_PARTS  # noqa: E402
from llmpar.footprint.flops import FUSED_ATTENTION_TILE_TOKENS as TILE  # noqa: E402
from llmpar.spec.hardware import ATTENTION_WIDTH as WIDTH  # noqa: E402

KERNELS = ROOT / "validation" / "published" / "kernels"
FILES = ("attention_training_h100.toml", "attention_training_a100.toml")
WIDTHS = range(0, 301)
GPUS = ROOT / "specs" / "gpus"
DERIVED_FROM = {"h100-sxm": ("h100-pcie", "h20", "h200-sxm", "h800-sxm"),
                "a100-sxm-80gb": ("a100-sxm-40gb", "a100-pcie-40gb", "a100-pcie-80gb")}
"""Presets without attention measurements, by the measured GPU of their architecture."""


@attrs.frozen
class Row:
    """One bar: a call's reported TFLOP/s."""

    sequence: int
    head_dim: int
    causal: bool
    tflops: float

    @property
    def keys(self) -> float:
        """Keys each query attends on average, as the kernel runs it."""
        if not self.causal:
            return float(self.sequence)
        return TILE * (math.ceil(self.sequence / TILE) + 1) / 2

    @property
    def executed_tflops(self) -> float:
        """The rate of the FLOPs the kernel executes (the diagonal tiles whole)."""
        if not self.causal:
            return self.tflops
        tiles = math.ceil(self.sequence / TILE)
        return self.tflops * (tiles + 1) / tiles


@attrs.frozen
class Fit:
    gpu: str
    kernel: str
    direction: str
    compute_efficiency: float
    half_keys: float
    half_width: float
    rows: tuple[Row, ...]
    peak_tflops: float

    def share(self, row: Row) -> float:
        """The law's share of the peak for `row`'s call."""
        w = self.half_width
        width = min(1.0, row.head_dim * (WIDTH + w) / (WIDTH * (row.head_dim + w)))
        return self.compute_efficiency * width * row.keys / (row.keys + self.half_keys)

    def errors(self) -> list[float]:
        """The law over each measured row's executed rate, less 1."""
        return [self.share(r) * self.peak_tflops / r.executed_tflops - 1 for r in self.rows]


def table(name: str) -> dict:
    return tomllib.loads((KERNELS / name).read_text())


def rows_of(data: dict, kernel: dict, direction: str) -> tuple[Row, ...]:
    found = []
    for row in kernel["rows"]:
        if row["pass"] != direction:
            continue
        for sequence, tflops in zip(data["sequence"], row["tflops"], strict=True):
            found.append(Row(sequence, row["head_dim"], row["causal"], float(tflops)))
    return tuple(found)


def _line(rows: Sequence[Row], peak: float, w: float) -> tuple[float, float, float]:
    """(e, h, sum of squared relative residuals) of the line at half width `w`."""
    keys = np.array([r.keys for r in rows])
    width = np.array([min(1.0, r.head_dim * (WIDTH + w) / (WIDTH * (r.head_dim + w)))
                      for r in rows])
    inverse = 1 / (np.array([r.executed_tflops for r in rows]) / peak / width)
    design = np.vstack([np.ones_like(keys), 1 / keys]).T
    (a, b), *_ = np.linalg.lstsq(design, inverse, rcond=None)
    residual = float(np.sum(((design @ np.array([a, b])) / inverse - 1) ** 2))
    return 1 / float(a), float(b) / float(a), residual


def fit(gpu: str, kernel: str, direction: str, rows: Sequence[Row], peak: float,
        widths: Iterable[float] = WIDTHS) -> Fit:
    """The least-squares law of `rows`, its half width the best of `widths`."""
    best = min(((_line(rows, peak, w), w) for w in widths), key=lambda found: found[0][2])
    (e, h, _), w = best
    return Fit(gpu=gpu, kernel=kernel, direction=direction, compute_efficiency=round(e, 3),
               half_keys=float(round(h)), half_width=float(w), rows=tuple(rows),
               peak_tflops=peak)


def fits() -> list[Fit]:
    """Every kernel's forward and backward law, per GPU."""
    found: list[Fit] = []
    h100 = table(FILES[0])
    for kernel in h100["kernel"]:
        for direction in ("forward", "backward"):
            found.append(fit(h100["gpu"], kernel["name"], direction,
                             rows_of(h100, kernel, direction), h100["peak_tflops"]))
    a100 = table(FILES[1])
    fa2 = {f.direction: f.half_width for f in found if f.kernel == "flash-attention-2"}
    carried = round((fa2["forward"] + BACKWARD_PARTS * fa2["backward"]) / (1 + BACKWARD_PARTS))
    for kernel in a100["kernel"]:
        both = fit(a100["gpu"], kernel["name"], "forward+backward",
                   rows_of(a100, kernel, "forward+backward"), a100["peak_tflops"],
                   widths=(carried,))
        found += [attrs.evolve(both, direction=direction) for direction in ("forward", "backward")]
    return found


def toml_rows(found: Sequence[Fit], gpu: str, scale: float = 1.0, source: str = "") -> str:
    lines = []
    for f in found:
        if f.gpu != gpu:
            continue
        lines.append("[[attention_kernels]]")
        lines.append(f'kernel = "{f.kernel}"')
        lines.append(f'direction = "{f.direction}"')
        lines.append(f"compute_efficiency = {min(1.0, round(f.compute_efficiency * scale, 3))}")
        lines.append(f"half_keys = {int(f.half_keys)}")
        lines.append(f"half_width = {int(f.half_width)}")
        if source:
            lines.append(f'source = "{source}"')
        lines.append("")
    return "\n".join(lines)


def preset(name: str) -> dict:
    return tomllib.loads((GPUS / f"{name}.toml").read_text())


def derived_scale(measured: str, gpu: str) -> float:
    """The derived GPU's share of its peak over the measured one's (matmul_efficiency)."""
    return preset(gpu)["matmul_efficiency"] / preset(measured)["matmul_efficiency"]


def derived_source(measured: str, gpu: str) -> str:
    theirs, ours = preset(measured)["matmul_efficiency"], preset(gpu)["matmul_efficiency"]
    return (f"derived, not measured on this GPU: {measured}'s law for the kernel "
            f"(validation/fit_attention_kernels.py), its share of the peak scaled by this "
            f"preset's matmul_efficiency over {measured}'s ({ours} / {theirs}), the same kernel "
            f"on the same architecture; expect this preset's efficiency_uncertainty or more")


def derived_rows(found: Sequence[Fit], gpu: str) -> str:
    (measured,) = [m for m, derived in DERIVED_FROM.items() if gpu in derived]
    return toml_rows(found, measured, derived_scale(measured, gpu),
                     derived_source(measured, gpu))


def write_derived(found: Sequence[Fit]) -> None:
    """Rewrite each derived preset's `[[attention_kernels]]` rows (kept at its end)."""
    for gpu in (g for derived in DERIVED_FROM.values() for g in derived):
        path = GPUS / f"{gpu}.toml"
        text = path.read_text()
        head = text.split("\n[[attention_kernels]]")[0].rstrip("\n")
        path.write_text(head + "\n\n" + derived_rows(found, gpu).rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--toml", action="store_true", help="print the presets' rows")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the derived presets' rows (DERIVED_FROM)")
    args = parser.parse_args()
    found = fits()
    if args.write:
        write_derived(found)
        return
    if args.toml:
        for gpu in dict.fromkeys(f.gpu for f in found):
            print(f"# {gpu}\n{toml_rows(found, gpu)}")
        return
    for f in found:
        worst = max(f.errors(), key=abs)
        print(f"{f.gpu:14} {f.kernel:18} {f.direction:9} e = {f.compute_efficiency:.3f} "
              f"h = {f.half_keys:4.0f} w = {f.half_width:3.0f}  rows {len(f.rows):2}, "
              f"worst {worst:+.1%}")


if __name__ == "__main__":
    main()
