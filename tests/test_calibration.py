"""`llmpar calibrate`: fitting a GPU's matmul efficiency (and a profile's host overhead) to
measured runs, checked on the project's own published runs (fit on part, check on the
rest) and on runs made from llmpar's own predictions (where the answer is known)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from validation_scripts import load_script

import llmpar
from llmpar.cli.calibrate import calibration_table
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.loading.presets import builtin_specs_dir
from llmpar.report.tables import render_text

published = load_script("published_throughput")
EXAMPLES = builtin_specs_dir() / "examples"
H100_FILES = ("dgxc_llama31_h100_bf16.toml", "dgxc_gpt3_175b_h100_bf16.toml")


def _published_runs() -> list[dict]:
    """The H100 dense rows of validation/published/ as measured runs: the step time the
    reported TFLOP/s per GPU imply, counting FLOPs as the source does (which no
    efficiency changes)."""
    runs = []
    for name in H100_FILES:
        for row in published.rows(published.PUBLISHED / name):
            plan = llmpar.evaluate(row.spec)
            flops = (plan.hardware_flops_per_step if row.flops_counted == "hardware"
                     else plan.flops_per_step)
            step = flops / plan.num_gpus / (row.reported_tflops_per_gpu * 1e12)
            runs.append({"name": row.label, "spec": row.spec, "step_seconds": step})
    return runs


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return _published_runs()


def test_fitted_on_llama_runs_it_predicts_the_gpt3_runs(runs):
    """Fit on the Llama 3.1 rows, check on the GPT-3 175B rows: the fitted H100 lands
    near the shipped calibration (0.613, fitted on all ten) and predicts the held-out
    runs within the 10% the validation report holds every dense row to."""
    train = [r for r in runs if r["name"].startswith("Llama")]
    held_out = [r for r in runs if r["name"].startswith("GPT-3")]
    assert len(train) == 7 and len(held_out) == 3
    result = llmpar.calibrate({"runs": train})
    efficiency = dict(result.fitted)["matmul_efficiency"]
    assert efficiency == pytest.approx(0.613, abs=0.02)
    gpu_file = result.gpu_toml()
    for run in held_out:
        spec = llmpar.load_spec(run["spec"], overrides={"hardware.gpu": {
            "preset": "h100-sxm", "matmul_efficiency": efficiency}})
        predicted = llmpar.evaluate(spec).step_seconds
        assert abs(predicted / run["step_seconds"] - 1) < 0.10, run["name"]
    assert "matmul_efficiency = 0." in gpu_file


def test_errors_after_the_fit_are_no_worse_than_before(runs):
    """The fit minimizes the mean absolute log error, so it is at most the shipped
    preset's on the same runs; the leave-one-out errors are each run's when fitted on
    the others, never better than after fitting on all (on average)."""
    import math

    result = llmpar.calibrate({"runs": runs})

    def mean_log(attribute: str) -> float:
        return sum(abs(math.log(getattr(r, attribute) / r.measured_step_seconds))
                   for r in result.runs) / len(result.runs)

    assert mean_log("after_step_seconds") <= mean_log("before_step_seconds") + 1e-9
    assert mean_log("left_out_step_seconds") >= mean_log("after_step_seconds") - 1e-9
    assert len(result.left_out_errors) == len(runs)
    assert max(abs(e) for e in result.left_out_errors) < 0.12


def _known_runs(efficiency: float, overhead: float = 0.0) -> list[dict]:
    """Runs 'measured' as llmpar predicts them at `efficiency` with `overhead` seconds per
    micro-batch: a fit must find both again."""
    found = []
    for example, changes in (("llama-3-8b-fsdp-8-h100.toml", {}),
                             ("llama-3-8b-fsdp-8-h100.toml", {"training.micro_batch_size": 2}),
                             ("llama-3-70b-tp8-pp4-cp2.toml", {}),
                             ("llama-3-8b-pp8-a100.toml", {"hardware.gpu": "h100-sxm"})):
        spec = llmpar.load_spec(EXAMPLES / example, overrides=changes)
        gpu = attrs.evolve(spec.hardware.gpu, matmul_efficiency=efficiency)
        plan = llmpar.evaluate(attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu=gpu)))
        found.append({"spec": str(EXAMPLES / example), "set": changes,
                      "step_seconds": plan.step_seconds + overhead * plan.micro_batches_per_step})
    return found


def test_a_known_efficiency_and_overhead_are_found_again():
    result = llmpar.calibrate({"runs": _known_runs(0.5)})
    assert dict(result.fitted)["matmul_efficiency"] == pytest.approx(0.5, abs=0.002)
    assert all(abs(r.error(r.after_step_seconds)) < 0.003 for r in result.runs)
    both = llmpar.calibrate({"runs": _known_runs(0.55, overhead=0.02),
                             "fit": ["matmul_efficiency", "micro_batch_overhead_seconds"]})
    fitted = dict(both.fitted)
    assert fitted["matmul_efficiency"] == pytest.approx(0.55, abs=0.005)
    assert fitted["micro_batch_overhead_seconds"] == pytest.approx(0.02, rel=0.05)
    assert both.framework is not None
    assert both.framework.micro_batch_overhead_seconds == fitted[
        "micro_batch_overhead_seconds"]


def test_the_cli_writes_presets_that_load(tmp_path: Path, capsys):
    runs = _known_runs(0.5, overhead=0.01)
    spec_file = tmp_path / "run.toml"
    spec_file.write_text((EXAMPLES / "llama-3-8b-fsdp-8-h100.toml").read_text())
    lines = ['fit = ["matmul_efficiency", "micro_batch_overhead_seconds"]']
    for index, run in enumerate(runs[:2]):
        sets = ", ".join(f'"{k}" = {v}' for k, v in run["set"].items())
        lines += ["[[runs]]", f'name = "run {index}"', 'spec = "run.toml"',
                  f"set = {{ {sets} }}", f"step_seconds = {run['step_seconds']!r}"]
    (tmp_path / "runs.toml").write_text("\n".join(lines) + "\n")
    gpu, framework = tmp_path / "gpu.toml", tmp_path / "framework.toml"
    assert main(["calibrate", str(tmp_path / "runs.toml"), "--output", str(gpu),
                 "--framework-output", str(framework)]) == 0
    out = capsys.readouterr().out
    assert "run 0" in out and "left out" in out and "leave-one-out error" in out
    plan = llmpar.evaluate(spec_file, overrides={
        "hardware.gpu": {"file": str(gpu)}, "training.framework": {"file": str(framework)}})
    assert plan.gpu == "h100-sxm-calibrated"
    assert plan.training is not None and plan.training.framework == "megatron-core-calibrated"
    assert plan.step_seconds == pytest.approx(runs[0]["step_seconds"], rel=0.01)
    assert "fitted to measured runs by llmpar calibrate" in plan.training.step_time_trust
    # As JSON, stdout holds the JSON alone (what was written is said on stderr).
    assert main(["calibrate", str(tmp_path / "runs.toml"), "--output", str(gpu),
                 "--json"]) == 0
    said = capsys.readouterr()
    data = json.loads(said.out)
    assert data["schema_version"] == 1 and data["tables"][0]["rows"][0]["run"] == "run 0"
    assert "wrote GPU preset" in said.err


def _problems(table: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        llmpar.calibrate(table)
    return [str(p) for p in caught.value.problems]


def test_bad_runs_files_name_the_key_path():
    spec = str(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml")
    problems = _problems({"fit": ["matmul_eficiency"], "runs": [
        {"spec": spec},
        {"spec": spec, "step_seconds": -1},
        {"spec": spec, "step_seconds": 1, "stepseconds": 2},
        {"spec": "missing.toml", "step_seconds": 1},
        {"spec": spec, "set": {"training.micro_batch_size": 0}, "step_seconds": 1},
        {"spec": spec, "step_seconds": 1, "name": 7}]})
    joined = "\n".join(problems)
    assert "$.fit: cannot fit 'matmul_eficiency' (did you mean 'matmul_efficiency'?)" in joined
    assert "$.runs[0]: give step_seconds or tokens_per_second" in joined
    assert "$.runs[1].step_seconds: must be a finite number > 0, got -1" in joined
    assert "$.runs[2].stepseconds: unknown key" in joined
    assert "$.runs[3].spec:" in joined and "missing.toml" in joined
    assert ("$.runs[4].spec: " in joined and "llama-3-8b-fsdp-8-h100.toml: "
            "$.training.micro_batch_size: must be a finite number > 0" in joined)
    assert "$.runs[5].name: expected a label (a string), got 7" in joined


def test_runs_on_two_gpus_are_refused():
    spec = str(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml")
    (problem,) = _problems({"runs": [
        {"spec": spec, "step_seconds": 10},
        {"spec": spec, "set": {"hardware.gpu": "a100-sxm-80gb"}, "step_seconds": 10}]})
    assert problem.startswith("$.runs[1].spec: every run must be on one GPU")


def test_a_gpu_without_an_efficiency_gets_one(session):
    """A GPU table that states no matmul_efficiency (nor an achievable MFU) has no step
    time before the fit; the fit gives it one."""
    gpu = {k: v for k, v in session.presets.read("gpus", "h100-sxm").items()
           if k not in ("matmul_efficiency", "achievable_mfu", "achievable_mfu_source")}
    gpu["name"] = "our-h100"
    runs = []
    for batch in (1, 2):
        spec = {"model": "llama-3-8b", "hardware": {"gpu": gpu, "num_gpus": 8},
                "training": {"sequence_length": 4096, "micro_batch_size": batch,
                             "global_batch_size": 32},
                "parallel": {"data": {"zero": 3}}}
        known = llmpar.evaluate(spec, {"hardware.gpu.matmul_efficiency": 0.5})
        runs.append({"spec": spec, "step_seconds": known.step_seconds})
    result = llmpar.calibrate({"runs": runs})
    assert [r.before_step_seconds for r in result.runs] == [None, None]
    assert dict(result.fitted)["matmul_efficiency"] == pytest.approx(0.5, abs=0.002)
    assert result.gpu.name == "our-h100-calibrated"
    assert "-" in render_text(calibration_table(result))
