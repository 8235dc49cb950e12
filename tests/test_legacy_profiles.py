"""Profiles that carry the efficiencies they were calibrated with (`[matmul_efficiency]` by
GPU), and the legacy profiles that redo llmpar's numbers from before megatron-core and
nemo switched to fused attention timed by its kernel."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.errors import SpecError
from llmpar.loading.presets import builtin_specs_dir
from llmpar.spec.framework import Framework, profile_gpu

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = builtin_specs_dir() / "examples"
REFERENCE = json.loads((ROOT / "validation" / "data" / "legacy_profiles.json").read_text())
"""Each training example's numbers under megatron-core and nemo before the switch, as
validation/legacy_reference.py recorded them at that commit."""
LEGACY = {"megatron-core": "megatron-core-legacy", "nemo": "nemo-legacy"}
H100_EXAMPLE = EXAMPLES / "llama-3-8b-fsdp-8-h100.toml"


def _numbers(plan: llmpar.Plan) -> dict[str, float | int | None]:
    peak = plan.training.memory_peak
    return {"step_seconds": plan.training.step_seconds, "total_bytes": plan.total_bytes,
            "allocated_bytes": None if peak is None else peak.allocated_bytes,
            "device_bytes": None if peak is None else peak.device_bytes}


@pytest.mark.parametrize(("profile", "example"), [
    (profile, example) for profile in LEGACY for example in REFERENCE["profiles"][profile]])
def test_legacy_profile_reproduces_the_numbers_before_the_switch(profile, example):
    """Exactly: the same floats and bytes the profile gave before the switch."""
    plan = llmpar.evaluate(EXAMPLES / example, {"training.framework": LEGACY[profile]})
    assert _numbers(plan) == REFERENCE["profiles"][profile][example]
    assert plan.training.framework == LEGACY[profile]


def test_the_reference_covers_every_example_that_names_no_framework():
    import tomllib

    unnamed = {p.name for p in EXAMPLES.glob("*.toml")
               if "framework" not in tomllib.loads(p.read_text()).get("training", {"framework": 0})}
    assert set(REFERENCE["profiles"]["megatron-core"]) == unnamed
    assert set(REFERENCE["profiles"]["nemo"]) == unnamed


@pytest.mark.parametrize("name", sorted(LEGACY.values()))
def test_legacy_profiles_keep_the_accounting_they_were_calibrated_under(session, name):
    table = session.presets.read("frameworks", name)
    assert table["activation_model"] == "korthikanti"
    assert table["attention_timing"] == "matmul"
    assert table["matmul_efficiency"]["h100-sxm"] == 0.613
    assert table["matmul_efficiency"]["a100-sxm-80gb"] == 0.675
    assert "2f159f5" in table["source"]


def _with_table(bf16: dict, preset: str = "megatron-core") -> dict:
    return {"training.framework": {"preset": preset, "matmul_efficiency": bf16}}


def test_a_profile_table_replaces_the_named_gpus_efficiency_and_says_so():
    """The profile's entry is the GPU's efficiency for the whole time model: the plan is
    the one of the GPU stated at that efficiency, and the step's derivation names the
    profile as its source."""
    tabled = llmpar.evaluate(H100_EXAMPLE, _with_table({"h100-sxm": 0.5}))
    stated = llmpar.evaluate(H100_EXAMPLE, {"hardware.gpu": {"preset": "h100-sxm",
                                                             "matmul_efficiency": 0.5}})
    assert tabled.training.step_seconds == stated.training.step_seconds
    assert tabled.training.step_seconds > llmpar.evaluate(H100_EXAMPLE).training.step_seconds
    (step,) = [d for d in tabled.derivations if d.quantity == "step_seconds"]
    assert step.inputs["matmul_efficiency"] == 0.5
    assert "matmul_efficiency 0.5 from framework profile 'megatron-core'" in step.source


@pytest.mark.parametrize("stated", [
    {"hardware.gpu.matmul_efficiency": 0.6},
    {"hardware.gpu": {"preset": "h100-sxm", "matmul_efficiency": 0.6}},
])
def test_an_efficiency_the_spec_states_wins_over_the_profile_table(stated):
    """The user's value, then the profile's table, then the GPU preset's: megatron-core-
    legacy names the H100 (0.613), the preset states 0.641, the spec 0.6."""
    legacy = {"training.framework": "megatron-core-legacy"}

    def efficiency(plan: llmpar.Plan) -> object:
        (step,) = [d for d in plan.derivations if d.quantity == "step_seconds"]
        return step.inputs["matmul_efficiency"]

    mine = llmpar.evaluate(H100_EXAMPLE, {**legacy, **stated})
    assert efficiency(mine) == 0.6
    assert efficiency(llmpar.evaluate(H100_EXAMPLE, legacy)) == 0.613
    assert efficiency(llmpar.evaluate(H100_EXAMPLE, stated)) == 0.6
    # Checked again as a Spec object, or written out and read back, it keeps 0.6; the
    # fp8 table's entry, which the spec does not state, still applies.
    spec = llmpar.load_spec(H100_EXAMPLE, {**legacy, **stated})
    assert spec.hardware.gpu.matmul_efficiency == 0.6
    assert "h100-sxm" not in spec.training.profile.matmul_efficiency
    assert "h100-sxm" in spec.training.profile.fp8_matmul_efficiency
    assert llmpar.evaluate(spec).training.step_seconds == mine.training.step_seconds


def test_a_table_that_names_another_gpu_changes_nothing():
    plain = llmpar.evaluate(H100_EXAMPLE).to_dict()
    other = llmpar.evaluate(H100_EXAMPLE, _with_table({"a100-sxm-80gb": 0.5})).to_dict()
    assert other == plain


def test_profile_gpu_is_the_same_object_when_nothing_changes():
    gpu = llmpar.load_spec(H100_EXAMPLE).hardware.gpu
    assert profile_gpu(Framework(), gpu) is gpu
    assert profile_gpu(Framework(matmul_efficiency={"h100-sxm": gpu.matmul_efficiency}),
                       gpu) is gpu
    changed = profile_gpu(Framework(fp8_matmul_efficiency={"h100-sxm": 0.5}), gpu)
    assert changed.fp8_matmul_efficiency == 0.5
    assert changed.matmul_efficiency == gpu.matmul_efficiency
    assert changed.efficiency_source.startswith("fp8_matmul_efficiency 0.5 from")


def test_a_spec_object_gets_its_profiles_efficiency_as_a_loaded_one_does():
    """A Spec built in Python (attrs.evolve of a loaded one) runs at the profile's entry
    too: the session applies the table wherever a spec is checked."""
    spec = llmpar.load_spec(H100_EXAMPLE)
    framework = Framework(name="mine", matmul_efficiency={"h100-sxm": 0.5},
                          **{f: getattr(spec.training.profile, f) for f in (
                              "attention_kernel", "attention_timing", "activation_model",
                              "loss_kernel", "dummy_weight_gradients", "fp8_weight_cache",
                              "fp8_output_layer", "host_seconds_per_kernel")})
    built = attrs.evolve(spec, training=attrs.evolve(spec.training, framework=framework))
    stated = llmpar.evaluate(H100_EXAMPLE, {"hardware.gpu": {"preset": "h100-sxm",
                                                             "matmul_efficiency": 0.5}})
    assert llmpar.evaluate(built).training.step_seconds == stated.training.step_seconds


@pytest.mark.parametrize(("value", "path", "expected"), [
    ({"h100-sxm": 1.5}, "$.training.framework.matmul_efficiency.h100-sxm", "(0, 1]"),
    ({"h100-sxm": 0}, "$.training.framework.matmul_efficiency.h100-sxm", "(0, 1]"),
    ({"h100-sxm": "fast"}, "$.training.framework.matmul_efficiency.h100-sxm", "a number"),
    ({"h100-sxm": True}, "$.training.framework.matmul_efficiency.h100-sxm", "a number"),
    (0.6, "$.training.framework.matmul_efficiency", "a table"),
])
def test_bad_tables_name_the_key_path(value, path, expected):
    with pytest.raises(SpecError) as caught:
        llmpar.evaluate(H100_EXAMPLE, _with_table(value))
    (problem,) = caught.value.problems
    assert problem.path == path
    assert expected in problem.message
    assert "llama-3-8b-fsdp-8-h100.toml" in str(caught.value)


def test_calibration_under_a_profile_table_fits_the_gpu_the_table_names():
    """Runs measured (here: predicted) at 0.5 on an H100, described under a profile whose
    table names the H100: the fit finds 0.5 again, the fitted value replacing the
    profile's entry rather than being overridden by it."""
    runs = []
    for changes in ({}, {"training.micro_batch_size": 2}):
        made = llmpar.evaluate(H100_EXAMPLE, {**changes, **_with_table(
            {"h100-sxm": 0.5}, "megatron-core-legacy")})
        runs.append({"spec": str(H100_EXAMPLE),
                     "set": {**changes, "training.framework": "megatron-core-legacy"},
                     "step_seconds": made.training.step_seconds})
    result = llmpar.calibrate({"runs": runs})
    assert dict(result.fitted)["matmul_efficiency"] == pytest.approx(0.5, abs=0.002)


def test_a_short_profile_name_stands_for_the_profile_not_its_variants():
    """"megatron" begins megatron-core and megatron-core-legacy: the profile, not its
    legacy variant (framework profiles only; a model's short name stays ambiguous)."""
    from llmpar.loading.presets import alias_candidates

    plan = llmpar.evaluate(H100_EXAMPLE, {"training.framework": "megatron"})
    assert plan.training.framework == "megatron-core"
    names = ["megatron-core", "megatron-core-legacy", "nemo", "nemo-legacy"]
    assert alias_candidates("megatron", names, variants=True) == ["megatron-core"]
    assert alias_candidates("megatron", names) == ["megatron-core", "megatron-core-legacy"]
    assert alias_candidates("h100", ["h100-pcie", "h100-sxm"], variants=True) == [
        "h100-pcie", "h100-sxm"]
    with pytest.raises(SpecError):
        llmpar.evaluate(H100_EXAMPLE, {"model": "glm"})
