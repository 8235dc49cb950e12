"""`llmpar search`: text, JSON, --emit, exit status, and the progress line."""

from __future__ import annotations

import io
import json

from search_specs import small_spec

import llmpar
from llmpar.cli.main import main
from llmpar.loading.dump import toml_text
from llmpar.search.progress import terminal_progress


def write_spec(tmp_path, **sections) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(toml_text(small_spec(**sections)))
    return str(path)


def test_json_has_counts_and_ranked_plans(tmp_path, capsys):
    assert main(["search", write_spec(tmp_path), "--json", "--top", "3"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["considered"] == data["ranked"] + sum(data["rejected"].values())
    assert data["evaluated"] > 0 and data["seconds"] > 0
    assert [r["rank"] for r in data["results"]] == [1, 2, 3]
    assert data["results"][0]["plan"]["fits"] is True
    assert captured.err == ""


def test_text_lists_rejections_best_layouts_and_the_front(tmp_path, capsys):
    assert main(["search", write_spec(tmp_path), "--top", "2",
                 "--set", "search.tensor_within_node=true"]) == 0
    out = capsys.readouterr().out
    assert "layouts considered" in out and "Rejected" in out
    assert "Best layouts by step_time" in out and "Pareto front" in out


def test_emit_writes_a_spec_that_evaluates_to_the_best_plan(tmp_path, capsys):
    best = tmp_path / "best.toml"
    assert main(["search", write_spec(tmp_path), "--emit", str(best), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert llmpar.evaluate(str(best)).to_dict() == data["results"][0]["plan"]


def test_no_layout_fits_exits_1(tmp_path, capsys):
    spec = write_spec(tmp_path, search={"memory_limit_bytes": 1000})
    assert main(["search", spec]) == 1
    assert "memory" in capsys.readouterr().out


def test_spec_error_exits_2(tmp_path, capsys):
    assert main(["search", write_spec(tmp_path, training={"sequence_length": 512})]) == 2
    assert "$.training.global_batch_size" in capsys.readouterr().err


def test_progress_draws_only_on_a_terminal():
    assert terminal_progress(io.StringIO()) is None

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    show = terminal_progress(stream)
    show("estimating", 5, 10)
    show("evaluating", 10, 10)
    assert "evaluating [" in stream.getvalue() and "10/10 layouts" in stream.getvalue()
