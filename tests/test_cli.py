"""The `llmpar` command: reports, JSON, presets, plugins, and errors without tracebacks."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.plan import PLAN_SCHEMA_VERSION
from llmpar.report.json_format import llmpar_version

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


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
    assert data.pop("llmpar_version") == llmpar_version()
    assert data == json.loads(json.dumps(plan.to_dict()))
    assert data["schema_version"] == 2
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


# --- questions without a file ------------------------------------------------------------

QUESTION = ["--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq", "8192",
            "--tp", "8", "--pp", "2", "--sp", "--global-batch", "64"]
AS_FILE = """model = "llama-3-70b"
[hardware]
cluster = "dgx-h100"
num_gpus = 64
[training]
sequence_length = 8192
global_batch_size = 64
[parallel.tensor]
degree = 8
[parallel.pipeline]
degree = 2
[parallel.sequence]
"""


def test_flags_ask_what_a_file_would(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(AS_FILE, encoding="utf-8")
    assert main(["evaluate", *QUESTION, "--format", "json"]) == 0
    from_flags = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(spec), "--format", "json"]) == 0
    assert from_flags == json.loads(capsys.readouterr().out)


def test_print_spec_writes_a_file_to_start_from(tmp_path, capsys):
    assert main(["evaluate", *QUESTION, "--print-spec"]) == 0
    printed = capsys.readouterr().out
    assert 'model = "llama-3-70b"' in printed and "[parallel.sequence]" in printed
    (tmp_path / "printed.toml").write_text(printed, encoding="utf-8")
    assert (llmpar.evaluate(tmp_path / "printed.toml").to_dict()
            == llmpar.evaluate(AS_FILE).to_dict())


def test_flags_change_a_spec_and_set_changes_them(capsys):
    assert main(["evaluate", "llama-3-8b-fsdp-8-h100", "--gpus", "16", "--set",
                 "hardware.num_gpus=32", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpus"] == 32


def test_a_shipped_example_is_named_and_stdin_is_a_spec(monkeypatch, capsys):
    assert main(["evaluate", "gpt3-175b-1024-a100", "--format", "json"]) == 0
    by_name = json.loads(capsys.readouterr().out)
    monkeypatch.setattr("sys.stdin", io.StringIO(
        (EXAMPLES / "gpt3-175b-1024-a100.toml").read_text(encoding="utf-8")))
    assert main(["evaluate", "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == by_name


def test_a_question_without_a_model_says_what_it_needs(capsys):
    assert main(["evaluate", "--gpus", "8"]) == 2
    assert "--model and --cluster" in capsys.readouterr().err


def test_search_answers_from_flags(capsys):
    assert main(["search", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--seq", "4096", "--global-batch", "32", "--top", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["results"]) == 2


def test_version_and_python_dash_m():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-m", "llmpar", "--version"],
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"llmpar {version('llmpar')}"


def test_every_command_takes_a_shipped_examples_name(capsys):
    assert main(["explain", "gpt3-175b-1024-a100", "capacity_bytes"]) == 0
    assert "capacity_bytes" in capsys.readouterr().out
    assert main(["diff", "gpt3-175b-1024-a100", "adam-memory-7b"]) == 0
    assert "num_gpus" in capsys.readouterr().out


def test_check_exits_1_when_the_plan_does_not_fit(capsys):
    assert main(["evaluate", "gpt3-175b-1024-a100", "--check"]) == 0
    assert main(["evaluate", "gpt3-175b-1024-a100", "--check",
                 "--set", "hardware.gpu.memory_bytes=\"2 GB\""]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_toml_text_is_given_explicitly(tmp_path, capsys):
    text = (EXAMPLES / "llama-3-8b-fsdp-8-h100.toml").read_text(encoding="utf-8")
    from_file = llmpar.evaluate(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml").to_dict()
    assert llmpar.evaluate(text=text).to_dict() == from_file
    assert llmpar.default_session().evaluate(text=text).to_dict() == from_file
    assert llmpar.load_spec(text=text) == llmpar.load_spec(
        EXAMPLES / "llama-3-8b-fsdp-8-h100.toml")
    # A string that is TOML text keeps being read as before; text= is the documented form.
    assert llmpar.evaluate(text).to_dict() == from_file
    with pytest.raises(llmpar.SpecError, match="not both"):
        llmpar.evaluate(EXAMPLES / "adam-memory-7b.toml", text=text)
    with pytest.raises(llmpar.SpecError, match="not valid TOML"):
        llmpar.evaluate(text="model = ")
    # On the command line: --spec-text, with --set on top, for evaluate, search, explain.
    assert main(["evaluate", "--spec-text", text, "--format", "json"]) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out).items()
            if k != "llmpar_version"} == from_file
    assert main(["evaluate", "--spec-text", text, "--set", "hardware.num_gpus=16",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpus"] == 16
    assert main(["explain", "--spec-text", text, "total_bytes"]) == 0
    assert capsys.readouterr().out.startswith("total_bytes = ")
    assert main(["search", "--spec-text", text, "--top", "1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 1
    assert main(["evaluate", "adam-memory-7b", "--spec-text", text]) == 2
    assert "not both" in capsys.readouterr().err


RESULT_COMMANDS = (
    ["evaluate", "gpt3-175b-1024-a100"],
    ["search", "llama-3-8b-fsdp-8-h100", "--top", "1"],
    ["search", "llama-3-8b-fsdp-8-h100", "--dimensions"],
    ["search", "inference-llama-2-70b-h100", "--top", "1"],
    ["explain", "gpt3-175b-1024-a100", "training.mfu"],
    ["presets", "gpus"],
    ["presets", "show", "h100-sxm"],
    ["plugins"],
)
"""Commands that print a result, each with one --format for text, Markdown, JSON, rich."""


@pytest.mark.parametrize("command", RESULT_COMMANDS, ids=lambda c: " ".join(c))
def test_every_result_has_one_format_option_and_versioned_json(command, capsys):
    assert main([*command, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # a plan carries the plan schema (2: fits on the device peak); other outputs their own
    plan = "fits" in data and "layout" in data
    assert data["schema_version"] == (PLAN_SCHEMA_VERSION if plan else 1)
    assert data["llmpar_version"] == llmpar_version()
    assert main([*command, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    again.pop("seconds", None), data.pop("seconds", None)  # a search's own wall-clock time
    assert again == data
    for fmt in ("text", "markdown"):
        assert main([*command, "--format", fmt]) == 0
        assert capsys.readouterr().out.strip()


def test_rich_format_needs_rich_and_no_color_turns_colour_off(monkeypatch, capsys):
    import importlib.util

    if importlib.util.find_spec("rich") is None:
        assert main(["evaluate", "gpt3-175b-1024-a100", "--format", "rich"]) == 2
        assert "rich extra" in capsys.readouterr().err
        return
    import re

    colour = re.compile(r"\x1b\[(?:\d+;)*(?:3[0-8]|9[0-7])(?:;\d+)*m")  # SGR foreground
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(["evaluate", "gpt3-175b-1024-a100", "--format", "rich"]) == 0
    assert colour.search(capsys.readouterr().out)
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["evaluate", "gpt3-175b-1024-a100", "--format", "rich"]) == 0
    shown = capsys.readouterr().out
    assert "gpt-3-175b" in shown and not colour.search(shown)


def test_every_command_documents_the_same_exit_status(capsys):
    from llmpar.cli.main import build_parser
    from llmpar.cli.output import EXIT_STATUS

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, command in commands.items():
        assert command.epilog == EXIT_STATUS, name
    reference = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md")
    assert reference.read_text(encoding="utf-8").count(EXIT_STATUS) == len(commands)


def test_search_gpus_takes_a_list_of_counts(capsys):
    assert main(["search", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8,16",
                 "--seq", "4096", "--global-batch", "64", "--top", "1", "--format",
                 "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [count["num_gpus"] for count in data["gpu_counts"]] == [8, 16]
    assert main(["evaluate", "--model", "llama-3-8b", "--cluster", "dgx-h100",
                 "--gpus", "16", "--print-spec"]) == 0
    assert "num_gpus = 16" in capsys.readouterr().out


def test_evaluate_refuses_a_list_of_gpu_counts(capsys):
    assert main(["evaluate", "--model", "7b", "--gpu", "h100-sxm", "--gpus", "8,16"]) == 2
    err = capsys.readouterr().err
    assert "$.hardware.num_gpus" in err and "llmpar search" in err
    with pytest.raises(SystemExit) as exit_status:
        main(["evaluate", "--model", "7b", "--gpu", "h100-sxm", "--gpus", "eight"])
    assert exit_status.value.code == 2
    assert "comma-separated list" in capsys.readouterr().err


def test_a_search_without_a_global_batch_names_the_flag(capsys):
    assert main(["search", "--model", "7b", "--gpu", "h100-sxm", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "$.training.global_batch_size" in err and "--global-batch" in err
