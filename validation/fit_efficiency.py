#!/usr/bin/env python3
"""Refit the calibrated GPUs' `matmul_efficiency` on their published runs.

Two GPUs carry an efficiency fitted on run-level data (validation/published/, the data the
project may fit on): the A100 SXM 80GB on the 20 rows of Narayanan et al. 2021 Table 1,
Korthikanti et al. 2022 Table 5 and BLOOM-176B, the H100 SXM on the ten NVIDIA
dgxc-benchmarking rows (Llama 3.1 8B/70B/405B, GPT-3 175B). Each row's spec states the
attention kernel its run used (`activation_model`: Megatron-LM's unfused core attention
for the A100 rows, Transformer Engine's fused attention for the H100 ones), so a change of
the default framework profile cannot move the fit. Every other shipped GPU scales one of
these two by GEMM-level measurements (its preset's `efficiency_source`).

The rule is minimax: the efficiency that makes the largest |predicted / reported - 1| of
the GPU's rows smallest. Predicted TFLOP/s per GPU grows with the efficiency, so the
optimum is where the most optimistic row's error equals minus the most pessimistic
row's; it is found by bisection and rounded to three digits, as the presets state it.

The GPUs scaled from them follow in their presets' own words, which this script reads and
rewrites: "matmul_efficiency = B x m / c = V" (B the calibrated GPU's efficiency, m and c the
GEMM-level measurements of this GPU and of the calibrated one), "derived from NAME: ... its
matmul_efficiency V" (NAME's), and `fp8_matmul_efficiency_source`'s "matmul_efficiency x
f / b" (the fp8 and bf16 MAMF shares measured on the GPU).

Usage:
  python validation/fit_efficiency.py           # print each fit and its rows' errors
  python validation/fit_efficiency.py --check   # exit 1 where a preset differs from its fit
  python validation/fit_efficiency.py --write   # set the presets to the fits
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validation"))

from published_throughput import PUBLISHED, Row, predicted_tflops_per_gpu, rows  # noqa: E402

import llmpar  # noqa: E402

CALIBRATION_ROWS: dict[str, tuple[str, ...]] = {
    "a100-sxm-80gb": ("narayanan2021_table1.toml", "korthikanti2022_table5.toml",
                      "bloom176b_jeanzay_a100.toml"),
    "h100-sxm": ("dgxc_llama31_h100_bf16.toml", "dgxc_gpt3_175b_h100_bf16.toml"),
}
"""The published tables each calibrated GPU's efficiency is fitted on."""
GPUS = ROOT / "specs" / "gpus"
CALIBRATED_NAMES = {"H100 SXM": "h100-sxm", "A100 SXM": "a100-sxm-80gb"}
"""How the scaled presets name the GPU they scale ("against the calibrated H100 SXM's")."""
SCALED = re.compile(r"matmul_efficiency = (?P<base>[0-9.]+) x (?P<measured>[0-9.]+) / "
                    r"(?P<calibrated>[0-9.]+) = (?P<value>[0-9.]+)")
AGAINST = re.compile(r"(?P<measured>[0-9.]+) of (?P<peak>[0-9.]+)(?: x (?P<share>[0-9.]+))? "
                     r"TFLOP/s = [0-9.]+, against the calibrated (?P<name>[A-Z0-9 ]+?)'s "
                     r"(?P<calibrated>[0-9.]+) / (?P<calibrated_peak>[0-9.]+) = ")
"""The GEMM-level measurements a scaled preset states, unrounded: this GPU's best rate of
its peak (times the share of the package it ran on), and the calibrated GPU's."""
DERIVED = re.compile(r"derived from (?P<name>[a-z0-9-]+):(?P<between>[^;]*?)"
                     r"matmul_efficiency (?P<value>[0-9.]+)")
FP8 = re.compile(r"matmul_efficiency x (?P<fp8>[0-9.]+) / (?P<bf16>[0-9.]+)")
DIGITS = 3
BISECTION_STEPS = 30
"""Halvings of [0.3, 0.95]: to 6e-10, far below the rounding."""


@attrs.frozen(kw_only=True)
class Fit:
    gpu: str
    efficiency: float
    """The minimax efficiency, unrounded."""
    preset: float
    """What the preset states."""
    errors: tuple[tuple[str, float], ...]
    """Each row's error at the rounded fit."""

    @property
    def rounded(self) -> float:
        return round(self.efficiency, DIGITS)


def calibration_rows(gpu: str) -> list[Row]:
    return [row for name in CALIBRATION_ROWS[gpu] for row in rows(PUBLISHED / name)]


def row_errors(found: Sequence[Row], efficiency: float | None = None) -> list[float]:
    """predicted / reported - 1 of each row, at `efficiency` (None: the preset's)."""
    errors = []
    for row in found:
        spec = llmpar.load_spec(row.spec)
        if efficiency is not None:
            spec = attrs.evolve(spec, hardware=attrs.evolve(
                spec.hardware, gpu=attrs.evolve(spec.hardware.gpu, matmul_efficiency=efficiency)))
        plan = llmpar.evaluate(spec)
        errors.append(predicted_tflops_per_gpu(plan, row.flops_counted)
                      / row.reported_tflops_per_gpu - 1)
    return errors


def minimax(errors_at: Callable[[float], list[float]], low: float = 0.3,
            high: float = 0.95) -> float:
    """The efficiency where max(error) + min(error) = 0 (errors grow with it)."""
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        errors = errors_at(middle)
        if max(errors) + min(errors) > 0:
            high = middle
        else:
            low = middle
    return (low + high) / 2


def fit(gpu: str) -> Fit:
    found = calibration_rows(gpu)
    efficiency = minimax(lambda e: row_errors(found, e))
    preset = llmpar.load_spec({"model": "llama-3-8b", "hardware": {"gpu": gpu}}).hardware.gpu
    assert preset.matmul_efficiency is not None
    errors = row_errors(found, round(efficiency, DIGITS))
    return Fit(gpu=gpu, efficiency=efficiency, preset=preset.matmul_efficiency,
               errors=tuple((row.label, e) for row, e in zip(found, errors, strict=True)))


def _number(value: float) -> str:
    return f"{value:.{DIGITS}f}"


def _set(text: str, key: str, value: str) -> str:
    """`text` with the top-level line `key = ...` set to `value` (a TOML literal)."""
    found, count = re.subn(rf"(?m)^{key} = .*$", lambda _: f"{key} = {value}", text, count=1)
    assert count == 1, key
    return found


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def preset_texts(calibrated: dict[str, float]) -> dict[Path, str]:
    """Every GPU preset's text with its efficiencies following `calibrated` (the fitted
    GPUs' matmul_efficiency): the fitted value, the scaled and derived presets' value
    and the sentence that states it, and the fp8 efficiency from its stated ratio."""
    efficiency: dict[str, float] = dict(calibrated)
    texts: dict[Path, str] = {}
    pending = sorted(GPUS.glob("*.toml"))
    while pending:
        waiting = []
        for path in pending:
            text = path.read_text()
            table = tomllib.loads(text)
            if "matmul_efficiency" not in table:
                continue
            source = table.get("efficiency_source", "")
            name = path.stem
            if name in calibrated:
                value = calibrated[name]
            elif (scaled := SCALED.search(source)) and (against := AGAINST.search(source)):
                base = efficiency[CALIBRATED_NAMES[against["name"]]]
                share = float(against["measured"]) / (
                    float(against["peak"]) * float(against["share"] or 1.0))
                value = round(base * share / (float(against["calibrated"])
                                              / float(against["calibrated_peak"])), DIGITS)
                source = source.replace(scaled[0], f"matmul_efficiency = {_number(base)} x "
                                        f"{scaled['measured']} / {scaled['calibrated']} = "
                                        f"{_number(value)}")
            elif derived := DERIVED.search(source):
                if derived["name"] not in efficiency:
                    waiting.append(path)
                    continue
                value = efficiency[derived["name"]]
                source = source.replace(derived[0], derived[0][: -len(derived["value"])]
                                        + _number(value))
            else:
                continue
            efficiency[name] = value
            text = _set(text, "matmul_efficiency", _number(value).rstrip("0"))
            if source != table.get("efficiency_source", ""):
                text = _set(text, "efficiency_source", _quoted(source))
            fp8 = FP8.search(table.get("fp8_matmul_efficiency_source", ""))
            if fp8 is not None and "fp8_matmul_efficiency" in table:
                text = _set(text, "fp8_matmul_efficiency", _number(round(
                    value * float(fp8["fp8"]) / float(fp8["bf16"]), DIGITS)).rstrip("0"))
            texts[path] = text
        if len(waiting) == len(pending):
            raise SystemExit(f"unresolved derivations: {[p.name for p in waiting]}")
        pending = waiting
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 where a preset's matmul_efficiency differs from its fit")
    parser.add_argument("--write", action="store_true", help="set the presets to the fits")
    args = parser.parse_args()
    stale = []
    fits = {}
    for gpu in CALIBRATION_ROWS:
        result = fits[gpu] = fit(gpu)
        worst = max(abs(e) for _, e in result.errors)
        print(f"{gpu}: matmul_efficiency {result.rounded:.{DIGITS}f} (minimax "
              f"{result.efficiency:.5f}; preset {result.preset}); largest |error| {worst:.1%} "
              f"on {len(result.errors)} rows")
        if not args.check:
            for label, error in result.errors:
                print(f"  {error:+6.1%}  {label}")
        if abs(result.rounded - result.preset) > 0.5 * 10**-DIGITS:
            stale.append(gpu)
    for path, text in preset_texts({g: f.rounded for g, f in fits.items()}).items():
        if text != path.read_text():
            if args.write:
                path.write_text(text)
            elif path.stem not in stale:
                stale.append(path.stem)
    if stale and not args.write:
        print(f"stale: {', '.join(stale)} (set matmul_efficiency in specs/gpus/ to the fit)",
              file=sys.stderr)
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
