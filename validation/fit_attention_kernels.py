#!/usr/bin/env python3
"""Fit the training attention kernels' law on their kernel-level measurements.

The data: validation/published/kernels/attention_training_*.toml, the bar labels of the
FlashAttention-2 paper (A100) and the FlashAttention-3 paper (H100), each a kernel's
forward or backward TFLOP/s over sequence lengths 512 to 16k, head width 64 or 128,
with or without the causal mask, at 16k tokens a call; NVIDIA cudnn-frontend's training
SDPA benchmark on the B200 (cuDNN, FlashAttention-2, torch SDPA's flash backend; causal)
and the GB200 (cuDNN); AITER's flash attention on the MI355X, as HipKittens measured it;
FlashAttention-2 on the RTX 4090 at 2k tokens, from TileLang's notes. Those files fit from
`fit_min_sequence` on (shorter calls are host-bound) and leave out a series marked
`fitted = false`; where a kernel was measured at head width 128 alone, its half width w
comes from another fit (`CARRIED_WIDTH`), and where at one sequence length alone, its
half keys h (`CARRIED_KEYS`). A share above 1 of the preset's stated peak (the RTX 4090's
forward: its board clocks above the rated boost) is capped at 1. The law
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

GPUs that have no measurement of their own (`DERIVED_FROM`: the other Hopper parts, the
other A100s, the B300, the L40S, the RTX 5090, the CDNA3 and CDNA2 Instinct parts) take a
measured GPU's laws, running the same kernel code (its architecture's, or per
`DERIVED_NOTES` the same kernels on a neighbouring one), with the share of the peak
scaled by their preset's matmul_efficiency over the measured GPU's: the same kernel code
on a like SM design reaches the same fraction of what the GPU's dense GEMMs reach, the
rule the presets' matmul_efficiency was itself carried over by (each preset's
efficiency_source). Derived, not measured: the preset's efficiency_uncertainty applies,
and each row's source says how far the design is from the measured one.

Usage:
  python validation/fit_attention_kernels.py           # the fits and their worst rows
  python validation/fit_attention_kernels.py --toml    # the presets' rows, as TOML
  python validation/fit_attention_kernels.py --write   # rewrite the presets' rows (all but
                                                       # the H100's and A100's, hand-noted)
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
FILES = ("attention_training_h100.toml", "attention_training_a100.toml",
         "attention_training_b200.toml", "attention_training_gb200.toml",
         "attention_training_mi355x.toml", "attention_training_rtx4090.toml")
WIDTHS = range(0, 301)
GPUS = ROOT / "specs" / "gpus"
CARRIED_WIDTH = {
    # Measured at head width 128 alone: w from the same kernel's H100 fit (cuDNN's own;
    # FlashAttention-2's sm80 code and torch SDPA's vendored copy of it, FlashAttention-2's).
    ("b200", "cudnn", "forward"): ("h100-sxm", "cudnn", "forward"),
    ("b200", "cudnn", "backward"): ("h100-sxm", "cudnn", "backward"),
    ("b200", "flash-attention-2", "forward"): ("h100-sxm", "flash-attention-2", "forward"),
    ("b200", "flash-attention-2", "backward"): ("h100-sxm", "flash-attention-2", "backward"),
    ("b200", "sdpa-flash", "forward"): ("h100-sxm", "flash-attention-2", "forward"),
    ("b200", "sdpa-flash", "backward"): ("h100-sxm", "flash-attention-2", "backward"),
    ("gb200", "cudnn", "forward"): ("h100-sxm", "cudnn", "forward"),
    ("gb200", "cudnn", "backward"): ("h100-sxm", "cudnn", "backward"),
    # AITER's backward is measured at width 128 alone: its own forward's w, fitted on the
    # width-64 rows (an upper bound: the backward runs 5 products per score, not 2).
    ("mi355x", "aiter", "backward"): ("mi355x", "aiter", "forward"),
}
"""Where a kernel was measured at head width 128 alone, whose fit its half width comes from
(gpu, kernel, pass): at width 128 the width term is 1 and the data leave w free."""
CARRIED_KEYS = {
    # One sequence length (2k) measured: the tile prologue's h from FlashAttention-2 on the
    # A100, the same sm80 kernels.
    ("rtx-4090", "flash-attention-2", "forward"): ("a100-sxm-80gb", "flash-attention-2",
                                                   "forward"),
    ("rtx-4090", "flash-attention-2", "backward"): ("a100-sxm-80gb", "flash-attention-2",
                                                    "backward"),
}
"""Where a kernel was measured at one sequence length, whose fit its half keys come from."""
DERIVED_FROM = {"h100-sxm": ("h100-pcie", "h20", "h200-sxm", "h800-sxm"),
                "a100-sxm-80gb": ("a100-sxm-40gb", "a100-pcie-40gb", "a100-pcie-80gb"),
                "rtx-4090": ("l40s", "rtx-5090"),
                "b200": ("b300",),
                "mi355x": ("mi300x", "mi325x", "mi250x")}
"""Presets without attention measurements, by the measured GPU whose kernel path they run:
their architecture's, or the RTX 4090's FlashAttention-2 (sm80 kernels), which
FlashAttention-2 also runs on consumer Blackwell (sm120) GPUs (`DERIVED_NOTES`)."""
DERIVED_NOTES = {
    "l40s": "the RTX 4090's measured FlashAttention-2 law on the same Ada design (AD102, "
            "sm89), at the L40S's lower clocks and 350 W",
    "rtx-5090": "FlashAttention-2 runs its sm80 kernels on consumer Blackwell (sm120), which "
                "has none of the B200's sm100 tensor memory or 2-CTA products, so the RTX "
                "4090's law (the same kernels on the consumer Ada part), not the B200's; "
                "cuDNN's sm120 kernels are unmeasured",
    "b300": "the B200's measured law (cuDNN 9.13.1, FlashAttention-2, torch SDPA's flash "
            "backend) on the same Blackwell design (Blackwell Ultra, sm103)",
    "mi300x": "no kernel-level attention data of a CDNA3 GPU was found: the MI355X's (CDNA4) "
              "AITER law, one generation apart (CDNA4 doubles the matrix rate per CU and "
              "changes the LDS), so expect at least +-25%",
    "mi325x": "no kernel-level attention data of a CDNA3 GPU was found: the MI355X's (CDNA4) "
              "AITER law, one generation apart (CDNA4 doubles the matrix rate per CU and "
              "changes the LDS), so expect at least +-25%",
    "mi250x": "no kernel-level attention data of a CDNA2 GPU was found: the MI355X's (CDNA4) "
              "AITER law, two generations apart; AITER's assembly kernels target gfx942 and "
              "gfx950 only, so on gfx90a the Composable Kernel or Triton code runs: expect "
              "+-40% or more",
}
"""Why each derived preset takes its measured GPU's law, and how far to trust it."""


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


def _line(rows: Sequence[Row], peak: float, w: float,
          keys_half: float | None = None) -> tuple[float, float, float]:
    """(e, h, sum of squared relative residuals) of the line at half width `w` (and at
    half keys `keys_half` where given: one sequence length leaves h free)."""
    keys = np.array([r.keys for r in rows])
    width = np.array([min(1.0, r.head_dim * (WIDTH + w) / (WIDTH * (r.head_dim + w)))
                      for r in rows])
    inverse = 1 / (np.array([r.executed_tflops for r in rows]) / peak / width)
    if keys_half is not None:
        x = 1 + keys_half / keys
        a = float(x @ inverse / (x @ x))
        return 1 / a, keys_half, float(np.sum((a * x / inverse - 1) ** 2))
    design = np.vstack([np.ones_like(keys), 1 / keys]).T
    (a, b), *_ = np.linalg.lstsq(design, inverse, rcond=None)
    residual = float(np.sum(((design @ np.array([a, b])) / inverse - 1) ** 2))
    return 1 / float(a), float(b) / float(a), residual


def fit(gpu: str, kernel: str, direction: str, rows: Sequence[Row], peak: float,
        widths: Iterable[float] = WIDTHS, keys_half: float | None = None) -> Fit:
    """The least-squares law of `rows`, its half width the best of `widths`; its share
    capped at the whole stated peak (`AttentionKernelRate.compute_efficiency` is a share of
    it: bars above it say the preset's peak is understated, and the law stays below them)."""
    best = min(((_line(rows, peak, w, keys_half), w) for w in widths),
               key=lambda found: found[0][2])
    (e, h, _), w = best
    return Fit(gpu=gpu, kernel=kernel, direction=direction,
               compute_efficiency=min(1.0, round(e, 3)), half_keys=float(round(h)),
               half_width=float(w), rows=tuple(rows), peak_tflops=peak)


def _fitted_rows(data: dict, kernel: dict, direction: str) -> tuple[Row, ...]:
    """The rows of `direction` the law is fitted on: from `fit_min_sequence` on, where the
    data file states one (shorter calls are bound by their host and launch time), and
    none of a series the file marks `fitted = false` (its comment says why)."""
    low = data.get("fit_min_sequence", 0)
    kept = {**kernel, "rows": [row for row in kernel["rows"] if row.get("fitted", True)]}
    return tuple(r for r in rows_of(data, kept, direction) if r.sequence >= low)


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
    for name in FILES[2:]:
        data = table(name)
        for kernel in data["kernel"]:
            for direction in ("forward", "backward"):
                rows = _fitted_rows(data, kernel, direction)
                widths: Iterable[float] = WIDTHS
                if all(r.head_dim >= WIDTH for r in rows):
                    gpu, theirs, pass_ = CARRIED_WIDTH[(data["gpu"], kernel["name"], direction)]
                    (source,) = [f for f in found if (f.gpu, f.kernel, f.direction)
                                 == (gpu, theirs, pass_)]
                    widths = (source.half_width,)
                keys_half = None
                if len({r.sequence for r in rows}) == 1:
                    gpu, theirs, pass_ = CARRIED_KEYS[(data["gpu"], kernel["name"], direction)]
                    (source,) = [f for f in found if (f.gpu, f.kernel, f.direction)
                                 == (gpu, theirs, pass_)]
                    keys_half = source.half_keys
                found.append(fit(data["gpu"], kernel["name"], direction, rows,
                                 data["peak_tflops"], widths=widths, keys_half=keys_half))
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
    path = DERIVED_NOTES.get(gpu, "the same kernel on the same architecture")
    return (f"derived, not measured on this GPU: {measured}'s law for the kernel "
            f"(validation/fit_attention_kernels.py), its share of the peak scaled by this "
            f"preset's matmul_efficiency over {measured}'s ({ours} / {theirs}), {path}; "
            f"expect this preset's efficiency_uncertainty or more")


def derived_rows(found: Sequence[Fit], gpu: str) -> str:
    (measured,) = [m for m, derived in DERIVED_FROM.items() if gpu in derived]
    return toml_rows(found, measured, derived_scale(measured, gpu),
                     derived_source(measured, gpu))


def measured_source(name: str) -> str:
    return (f"validation/published/kernels/{name} ({table(name)['source']}), fitted by "
            f"validation/fit_attention_kernels.py")


def _write_rows(gpu: str, rows: str) -> None:
    """Replace the preset's `[[attention_kernels]]` rows (kept at its end) with `rows`."""
    path = GPUS / f"{gpu}.toml"
    head = path.read_text().split("\n[[attention_kernels]]")[0].rstrip("\n")
    path.write_text(head + "\n\n" + rows.rstrip("\n") + "\n")


def write_derived(found: Sequence[Fit]) -> None:
    """Rewrite the rows of each preset measured by a file after the H100's and A100's
    (whose rows carry their own notes) and of each derived preset."""
    for name in FILES[2:]:
        gpu = table(name)["gpu"]
        _write_rows(gpu, toml_rows(found, gpu, source=measured_source(name)))
    for gpu in (g for derived in DERIVED_FROM.values() for g in derived):
        _write_rows(gpu, derived_rows(found, gpu))


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
