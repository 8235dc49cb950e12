"""`[search] num_gpus` and the `gpus` objective on serving specs: the fewest GPUs that
serve a request rate under TTFT and TPOT limits. The layout chosen sustains the rate, its
replicas times what one replica alone sustains reach the rate, and one GPU fewer (every
layout of it evaluated) serves it within the limits in no layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.search.serving import search_serving

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
SERVE = str(EXAMPLES / "serve-llama-3.1-70b-10-rps-h100.toml")


@pytest.fixture(scope="module")
def serving():
    session = llmpar.Session()
    spec = session.load_spec(SERVE)
    return session, spec, search_serving(session, spec)


def _one_replica(session, candidate):
    """The candidate's layout with one replica, on its tensor x pipeline GPUs."""
    layout = candidate.layout
    gpus = layout.get("tensor", 1) * layout.get("pipeline", 1)
    parallel = {name: {"degree": layout[name]} for name in ("tensor", "pipeline")
                if name in layout}
    table = {**candidate.table, "parallel": parallel,
             "hardware": {**candidate.table["hardware"], "num_gpus": gpus}}
    return session.evaluate(table).serving[0].continuous


def test_serving_layouts_sustain_the_rate_with_their_replicas(serving):
    session, _, result = serving
    assert result.results
    for candidate in result.results:
        assert candidate.request_rate_per_s == 10.0
        assert candidate.max_request_rate_per_s >= 10.0
        assert candidate.replicas == candidate.layout.get("data", 1)
        one = _one_replica(session, candidate)
        # The replicas share the arrivals: together they sustain what one does, times them.
        assert candidate.replicas * one.max_request_rate_per_s >= 10.0
        assert candidate.replicas * one.max_request_rate_per_s == pytest.approx(
            candidate.max_request_rate_per_s)
        assert candidate.ttft_seconds <= 2.0 and candidate.tpot_seconds <= 0.05
        assert candidate.num_gpus == (candidate.layout.get("tensor", 1)
                                      * candidate.layout.get("pipeline", 1)
                                      * candidate.replicas)


def test_serving_count_is_the_smallest_that_serves_the_rate(serving):
    session, spec, result = serving
    count = result.best.num_gpus
    assert result.best.score == count
    assert [c.num_gpus for c in result.gpu_counts] == list(range(4, 33, 4))
    assert all(c.kept == 0 for c in result.gpu_counts if c.num_gpus < count)
    # One GPU fewer (every layout of it evaluated): none serves the rate within the limits.
    fewer = search_serving(session, session.load_spec(
        SERVE, {"search.num_gpus": [count - 1]}))
    assert fewer.tried > 0 and not fewer.results
    counts = [c.num_gpus for c in result.results]
    assert counts == sorted(counts)


def test_serving_front_and_more_candidates(serving):
    session, _, result = serving
    front = result.gpus_pareto
    assert front[0] == result.best
    tpots = [c.tpot_seconds for c in front]
    assert tpots == sorted(tpots, reverse=True)
    assert [c.num_gpus for c in front] == sorted({c.num_gpus for c in front})
    narrower = search_serving(session, session.load_spec(
        SERVE, {"search.num_gpus": [result.best.num_gpus + 4, 32]}))
    assert narrower.best.num_gpus >= result.best.num_gpus


def test_serving_counts_refuse_training_limits_and_disaggregated_pools():
    session = llmpar.Session()
    with pytest.raises(llmpar.SpecError) as error:
        search_serving(session, session.load_spec(
            SERVE, {"search.train_seconds_max": 3600.0}))
    assert error.value.problems[0].path == "$.search.train_seconds_max"
    pools = session.load_spec(str(EXAMPLES / "serve-llama-3.1-70b-1p1d-h100.toml"),
                              {"search.num_gpus": [8, 16]})
    with pytest.raises(llmpar.SpecError) as error:
        search_serving(session, pools)
    assert error.value.problems[0].path == "$.search.num_gpus"


def test_serving_cli_json(capsys):
    assert main(["search", SERVE, "--json", "--top", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["results"][0]
    assert first["replicas"] * 1 >= 1 and first["max_request_rate_per_s"] >= 10.0
    assert data["gpus_pareto"][0]["num_gpus"] == first["num_gpus"]
    assert len(data["gpu_counts"]) == 8


def test_docs_quote_the_example(serving):
    session, _, result = serving
    best = result.best
    assert (best.num_gpus, best.replicas, best.layout.get("tensor")) == (20, 5, 4)
    sixteen = search_serving(session, session.load_spec(SERVE, {
        "search.num_gpus": [16], "search.ttft_seconds_max": None,
        "search.tpot_seconds_max": None, "inference.request_rate_per_s": 1.0}), top=50)
    most = max(c.max_request_rate_per_s for c in sixteen.results)
    text = (Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    assert (f"needs 20 H100s (five TP4 replicas, sustaining "
            f"{best.max_request_rate_per_s:.1f} requests/s; 16 GPUs\nsustain at most "
            f"{most:.2f})") in text
