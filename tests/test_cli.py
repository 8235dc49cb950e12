"""The `llmpar` command: reports, JSON, presets, plugins, and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import llmpar
from llmpar.cli.main import main


def example(name: str) -> str:
    return str(llmpar.default_session().presets.path("examples", name))


def test_evaluate_prints_memory_in_gb_and_gib(capsys):
    assert main(["evaluate", example("adam-memory-7b")]) == 0
    out = capsys.readouterr().out
    assert "GB" in out and "GiB" in out
    assert "112.00" in out  # 7B x 16 bytes, decimal GB


def test_evaluate_json_is_the_plan_dict(capsys):
    assert main(["evaluate", example("train-70b-h100"), "--json",
                 "--set", "hardware.num_gpus=1024"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = llmpar.evaluate(example("train-70b-h100"), {"hardware.num_gpus": 1024})
    assert data == json.loads(json.dumps(plan.to_dict()))
    assert data["schema_version"] == 1
    assert data["train_flops"] == pytest.approx(5.88e23)


def test_set_can_override_a_preset_field(capsys):
    assert main(["evaluate", example("qwen3-4b-activations"), "--json",
                 "--set", "model.num_layers=18"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["activations_bytes"] == 30 * 1024 * 18 * 2560 * 2


def test_spec_error_exits_2_without_traceback(tmp_path, capsys):
    spec = tmp_path / "bad.toml"
    spec.write_text('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = 0\n')
    assert main(["evaluate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "$.hardware.num_gpus" in err and str(spec) in err
    assert "Traceback" not in err


def test_console_script_reports_errors_without_traceback(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text("not toml at all [")
    result = subprocess.run([sys.executable, "-m", "llmpar.cli", "evaluate", str(spec)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "not valid TOML" in result.stderr
    assert "Traceback" not in result.stderr


def test_presets_lists_each_kind(capsys):
    assert main(["presets", "models"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen3-4b", "llama-2-70b", "gpt-3-175b", "bert-large", "1b", "7b", "70b"):
        assert name in out
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "gpus:" in out and "h100-sxm" in out and "optimizers:" in out and "adam" in out


def test_plugins_lists_distribution_and_version(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "data" in out and "llmpar" in out


def test_explain_one_field(capsys):
    assert main(["explain", example("qwen3-4b-activations"), "activations_bytes"]) == 0
    out = capsys.readouterr().out
    assert "activations_bytes" in out and "k * b * s * L * h * d" in out


def test_help_names_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("evaluate", "explain", "presets", "plugins"):
        assert command in out
