"""Every TOML llmpar writes goes through `llmpar.loading.dump.toml_text` and reads back
with `tomllib` to the table it wrote."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.loading.dump import toml_text

ROOT = Path(__file__).resolve().parent.parent


def test_values_toml_0_10_miswrote_read_back_equal():
    """0.1 + 0.2 keeps its last bit, nested arrays of tables stay tables, control
    characters are escaped (the cases issue 18 lists for toml 0.10.0 and 0.10.2)."""
    table = {
        "sum": 0.1 + 0.2,
        "tiny": 5e-324,
        "text": "tab\there\x01bell\x7f and \"quotes\" and \\",
        "runs": [{"name": "a", "steps": [{"n": 1}, {"n": 2}]}, {"name": "b", "steps": []}],
        "nested": [[1, 2], [3]],
        "outer": {"inner": {"deep": [1.5, -0.0]}},
    }
    assert tomllib.loads(toml_text(table)) == table


def test_none_is_left_out_at_any_depth():
    table = {"a": None, "b": {"c": None, "d": 1}, "e": [{"f": None, "g": 2}], "h": (1, None, 2)}
    assert tomllib.loads(toml_text(table)) == {"b": {"d": 1}, "e": [{"g": 2}], "h": [1, 2]}


@pytest.mark.parametrize("name", ["gpt3-175b-1024-a100", "mixtral-8x7b-ep8-a100",
                                  "llama-3-70b-qlora-2x-l40s", "inference-llama-2-70b-h100"])
def test_shipped_examples_round_trip(name):
    spec = llmpar.load_spec(ROOT / "specs" / "examples" / f"{name}.toml")
    assert llmpar.load_spec(text=llmpar.dump_spec(spec)) == llmpar.load_spec(spec)


def test_no_writer_uses_another_toml_library():
    """One writer: nothing in llmpar imports `toml` or `tomli_w` but the helper's module."""
    for path in (ROOT / "llmpar").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import toml\n" not in text and "toml.dumps" not in text, path
        if path.name != "dump.py" or path.parent.name != "loading":
            assert "tomli_w" not in text, path
