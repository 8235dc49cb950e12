"""Every GPU preset has a time model, and each says where its numbers come from.

validation/published/gemm/matmul_efficiency.toml names, for each preset, how its
`matmul_efficiency` was found: calibrated on published training runs (A100, H100), measured
(the GPU's own best GEMM rate over its peak, scaled from a calibrated GPU measured in the same
table), or taken from a sibling with the same chip and clocks. These tests recompute each
measured value from the committed rows by that rule, hold every preset's `efficiency_source`
to the basis it states, and check that every shipped GPU gives a step time on the shipped
training examples.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

import llmpar
from llmpar.spec import Gpu

GEMM = Path(__file__).resolve().parent.parent / "validation" / "published" / "gemm"
if not GEMM.is_dir():  # an sdist ships no validation/
    pytest.skip("validation/ is not part of this tree", allow_module_level=True)

SESSION = llmpar.Session(load_entry_points=False)
GPUS = SESSION.presets.names("gpus")
DERIVATIONS = {entry["gpu"]: entry for entry in
               tomllib.loads((GEMM / "matmul_efficiency.toml").read_text())["gpus"]}
ROUNDING = 0.0005
"""Presets state matmul_efficiency to 3 decimals."""


def gpu(name: str) -> Gpu:
    return SESSION.load_spec({"model": {"parameters": 1e9},
                              "hardware": {"gpu": name}}).hardware.gpu


def plateau(table: str, name: str, dtype: str) -> float:
    """The best rate of `name`'s rows in `table` for `dtype`, over the share of the preset's
    dense peak the measurement ran on."""
    data = tomllib.loads((GEMM / table).read_text())
    stated = data.get("dtype", dtype)  # a table of one format, or rows that name theirs
    rates = [(row.get("tflops", row.get(f"{dtype}_tflops")), row.get("share_of_gpu", 1.0))
             for row in data["rows"] if row["gpu"] == name and row.get("dtype", stated) == dtype]
    rates = [(tflops, share) for tflops, share in rates if tflops is not None]
    assert rates, f"{table} has no {dtype} row for {name}"
    tflops, share = max(rates)
    peak = gpu(name).peak_flops_per_s(dtype)
    assert peak is not None
    return tflops * 1e12 / (peak * share)


def has_rows(table: str, name: str) -> bool:
    return any(row["gpu"] == name for row in tomllib.loads((GEMM / table).read_text())["rows"])


def scaled(entry: dict[str, Any], table: str) -> float:
    """The rule: the reference's calibrated efficiency x this GPU's plateau over the
    reference's, both from one table (or the primary table's reference when `table` has
    none, as AMD's own numbers do not measure an NVIDIA GPU)."""
    reference = entry["reference"]
    ref_table = table if has_rows(table, reference) else entry["table"]
    ref_efficiency = gpu(reference).matmul_efficiency
    assert ref_efficiency is not None
    return (ref_efficiency * plateau(table, entry["gpu"], entry["dtype"])
            / plateau(ref_table, reference, entry["dtype"]))


def of_basis(basis: str) -> list[str]:
    return [name for name, entry in DERIVATIONS.items() if entry["basis"] == basis]


def test_every_gpu_preset_has_one_stated_basis():
    assert sorted(DERIVATIONS) == sorted(GPUS)
    assert {entry["basis"] for entry in DERIVATIONS.values()} == {
        "calibrated", "measured", "sibling"}
    # Scaled from a calibrated GPU; a sibling of a GPU that has numbers of its own.
    for name in of_basis("measured"):
        assert DERIVATIONS[DERIVATIONS[name]["reference"]]["basis"] == "calibrated", name
    for name in of_basis("sibling"):
        assert DERIVATIONS[DERIVATIONS[name]["sibling"]]["basis"] != "sibling", name


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_preset_states_a_whole_time_model(name):
    preset = gpu(name)
    assert preset.matmul_efficiency is not None and preset.memory_efficiency is not None
    assert preset.matmul_fixed_seconds is not None and preset.hbm_bandwidth_bytes_per_s
    assert preset.efficiency_uncertainty is not None
    assert preset.efficiency_source


@pytest.mark.parametrize("name", of_basis("measured"))
def test_a_measured_efficiency_follows_its_rows_by_the_rule(name):
    entry, preset = DERIVATIONS[name], gpu(name)
    assert preset.matmul_efficiency == pytest.approx(scaled(entry, entry["table"]),
                                                     abs=ROUNDING)
    source = preset.efficiency_source
    assert source.startswith("measured: ")
    assert f"validation/published/gemm/{entry['table']}" in source
    assert f"= {preset.matmul_efficiency:.3f}" in source


@pytest.mark.parametrize("name", [n for n in of_basis("measured")
                                  if "cross_check" in DERIVATIONS[n]])
def test_a_second_measurement_of_the_gpu_agrees_within_its_uncertainty(name):
    entry, preset = DERIVATIONS[name], gpu(name)
    other = scaled(entry, entry["cross_check"])
    assert preset.efficiency_uncertainty is not None and preset.matmul_efficiency is not None
    assert other != pytest.approx(preset.matmul_efficiency, abs=ROUNDING)  # another source
    assert abs(other / preset.matmul_efficiency - 1) <= preset.efficiency_uncertainty


@pytest.mark.parametrize("name", of_basis("sibling"))
def test_a_sibling_takes_the_time_model_of_the_gpu_it_is_derived_from(name):
    preset, sibling = gpu(name), gpu(DERIVATIONS[name]["sibling"])
    assert preset.matmul_efficiency == sibling.matmul_efficiency
    assert preset.memory_efficiency == sibling.memory_efficiency
    assert preset.matmul_fixed_seconds == sibling.matmul_fixed_seconds
    assert preset.efficiency_source.startswith(f"derived from {sibling.name}: ")
    assert preset.hbm_bandwidth_bytes_per_s  # its own, which the model uses


@pytest.mark.parametrize("name", of_basis("calibrated"))
def test_a_calibrated_gpu_names_its_runs_and_their_error(name):
    preset = gpu(name)
    assert "calibrated" in preset.efficiency_source
    assert "validation/published/" in preset.efficiency_source
    assert preset.efficiency_uncertainty is not None
    assert f"within {round(preset.efficiency_uncertainty * 100)}%" in preset.efficiency_source


@pytest.mark.parametrize("name", of_basis("measured") + of_basis("sibling"))
def test_an_uncalibrated_gpu_says_how_far_to_trust_it(name):
    preset = gpu(name)
    assert preset.efficiency_uncertainty is not None
    assert f"expect +-{round(preset.efficiency_uncertainty * 100)}%" in preset.efficiency_source


def training_examples() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name in SESSION.presets.names("examples"):
        table = tomllib.loads(SESSION.presets.path("examples", name).read_text())
        if "inference" not in table:
            found.append((name, table))
    return found


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_gives_a_step_time_on_the_shipped_training_examples(name):
    examples = training_examples()
    assert len(examples) >= 5
    # The examples compute in bf16; a GPU without a bf16 peak (V100) trains in fp16.
    compute = "bf16" if gpu(name).peak_flops_per_s("bf16") else "fp16"
    for example, table in examples:
        overrides: dict[str, Any] = {"hardware.gpu": name}
        if compute != table.get("precision", {}).get("compute", "bf16"):
            overrides["precision.compute"] = compute
        plan = SESSION.evaluate(table, overrides)
        assert plan.step_seconds is not None and math.isfinite(plan.step_seconds), example
        assert plan.step_seconds > 0
        stated_mfu = "mfu" in table.get("training", {})
        assert plan.time_model == ("assumed-mfu" if stated_mfu else "modelled"), example


@pytest.mark.parametrize(("overrides", "name"), [({"hardware.cluster": "dgx-b200"}, "b200"),
                                              ({"hardware.gpu": "mi300x"}, "mi300x")])
def test_the_fsdp_example_is_timed_on_blackwell_and_on_mi300x(overrides, name):
    example = SESSION.presets.path("examples", "llama-3-8b-fsdp-8-h100")
    plan = SESSION.evaluate(example, overrides)
    assert plan.time_model == "modelled" and plan.step_seconds is not None
    step = next(d for d in plan.derivations if d.quantity == "step_seconds")
    preset = gpu(name)
    # Attention runs at the GPU's own kernel rows (cuDNN's on the B200, AITER's on the
    # MI300X), not at the matmul rate with a warning.
    assert step.inputs["attention_kernel"] == {"b200": "cudnn", "mi300x": "aiter"}[name]
    assert not [w for w in plan.warnings if "attention kernel" in w]
    # The products run at this GPU's own rate, not the A100 defaults of llmpar.roofline.
    assert step.inputs["matmul_efficiency"] == preset.matmul_efficiency
    assert step.inputs["memory_efficiency"] == preset.memory_efficiency
    assert preset.efficiency_source in step.source
    matmul = step.inputs["matmul_seconds"]
    assert isinstance(matmul, float) and preset.matmul_efficiency is not None
    at_rate = plan.hardware_flops_per_step / plan.num_gpus / (
        (preset.peak_flops_per_s("bf16") or 0.0) * preset.matmul_efficiency)
    assert at_rate <= matmul <= 1.5 * at_rate  # plus what products lose to their shapes
