"""The calibrated GPUs' matmul_efficiency is the minimax fit on their published runs
(validation/fit_efficiency.py), and every GPU scaled from them follows it."""

from __future__ import annotations

import tomllib

import pytest
from validation_scripts import load_script

fit_efficiency = load_script("fit_efficiency")


def _preset_efficiency(gpu: str) -> float:
    path = fit_efficiency.GPUS / f"{gpu}.toml"
    value: float = tomllib.loads(path.read_text())["matmul_efficiency"]
    return value


@pytest.mark.parametrize("gpu", sorted(fit_efficiency.CALIBRATION_ROWS))
def test_each_calibrated_efficiency_is_near_the_minimax_fit_of_its_rows(gpu):
    """The fit is reproducible: the script's minimax efficiency is an optimum (a step of
    the last digit either way makes the largest error no smaller), and the preset's own
    efficiency leaves its rows' largest error within a point of that optimum's
    (`--check` reports a preset that has drifted from its fit: the H100's 0.613 against a
    fit of 0.617 since collectives hide only behind their own windows)."""
    result = fit_efficiency.fit(gpu)
    worst = max(abs(e) for _, e in result.errors)
    rows = fit_efficiency.calibration_rows(gpu)
    for step in (-1e-3, 1e-3):
        moved = fit_efficiency.row_errors(rows, result.rounded + step)
        assert max(abs(e) for e in moved) >= worst - 1e-9
    at_preset = max(abs(e) for e in fit_efficiency.row_errors(rows))
    assert at_preset - worst < 0.01
    assert at_preset < 0.10  # the validation report's promise for the calibration rows


def test_the_scaled_and_derived_presets_follow_the_calibrated_ones():
    """Rewriting every preset from the calibrated efficiencies they state changes nothing:
    each scaled GPU's value, its sentence and its fp8 efficiency agree."""
    calibrated = {gpu: _preset_efficiency(gpu) for gpu in fit_efficiency.CALIBRATION_ROWS}
    texts = fit_efficiency.preset_texts(calibrated)
    assert len(texts) == len(list(fit_efficiency.GPUS.glob("*.toml")))
    stale = [path.name for path, text in texts.items() if text != path.read_text()]
    assert stale == []


def test_a_refit_moves_the_scaled_presets_in_proportion():
    h100 = _preset_efficiency("h100-sxm")
    texts = fit_efficiency.preset_texts({"a100-sxm-80gb": _preset_efficiency("a100-sxm-80gb"),
                                         "h100-sxm": h100 + 0.05})
    for name in ("b200", "mi300x", "h200-sxm"):
        path = fit_efficiency.GPUS / f"{name}.toml"
        before = tomllib.loads(path.read_text())["matmul_efficiency"]
        after = tomllib.loads(texts[path])["matmul_efficiency"]
        assert after / before == pytest.approx((h100 + 0.05) / h100, abs=3e-3)
    h800 = tomllib.loads(texts[fit_efficiency.GPUS / "h800-sxm.toml"])
    assert h800["matmul_efficiency"] == pytest.approx(h100 + 0.05)
