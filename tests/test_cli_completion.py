"""`llmpar completion bash`: the script completes every command and option the parser
has, the choices of options, and shipped examples' names, as bash runs it."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from llmpar.cli.completion import bash_script
from llmpar.cli.main import build_parser, main

if shutil.which("bash") is None:
    pytest.skip("needs bash", allow_module_level=True)


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("completion") / "llmpar.bash"
    path.write_text(bash_script(build_parser(), ["gpt3-175b-1024-a100", "train-70b-h100"]))
    return path


def complete(script, *words: str) -> list[str]:
    """What bash offers for the command line `llmpar WORDS...` (the last word is being
    typed)."""
    quoted = " ".join(f"'{w}'" for w in ("llmpar", *words))
    shown = subprocess.run(
        ["bash", "-c", f'source "{script}"; COMP_WORDS=({quoted}); '
                       'COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _llmpar; '
                       'printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, check=True, timeout=30).stdout
    return [line for line in shown.splitlines() if line]


def test_the_script_is_bash(script):
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def test_every_command_and_option_completes(script):
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(complete(script, "")) == sorted([*commands.choices, "-h", "--help",
                                                   "--version"])
    for name, sub in commands.choices.items():
        options = {o for a in sub._actions for o in a.option_strings}
        assert set(complete(script, name, "-")) == options, name


def test_choices_and_examples_complete(script):
    assert complete(script, "sea") == ["search"]
    assert complete(script, "search", "--objective", "") == [
        "step_time", "tokens_per_second_per_gpu", "cost", "memory", "gpus"]
    assert complete(script, "evaluate", "gpt3") == ["gpt3-175b-1024-a100"]
    assert "waterfall" in complete(script, "plot", "")


def test_the_command_prints_the_script(capsys):
    assert main(["completion", "bash"]) == 0
    assert "complete -o filenames -F _llmpar llmpar" in capsys.readouterr().out
