"""`llmpar search` on serving specs: every layout it returns multiplies to the GPU count,
fits and meets `[search] ttft_seconds_max` and `tpot_seconds_max`, and each is the plan
`llmpar evaluate` gives for that layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.search.serving import search_serving

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
DONE_WHEN = str(EXAMPLES / "serve-llama-3.1-70b-fp8-vllm-4-h100.toml")
RATE = {"model": "llama-2-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
        "inference": {"engine": "vllm", "request_rate_per_s": 2.0, "prompt_tokens": 2048,
                      "generated_tokens": 256},
        "search": {"ttft_seconds_max": 2.0, "tpot_seconds_max": 0.03}}


def test_every_result_meets_the_limits_and_is_its_evaluated_plan():
    session = llmpar.Session()
    spec = session.load_spec(RATE)
    result = search_serving(session, spec, objective="step_time")
    assert result.results and result.tried == 10  # (t, p, d) splitting 8
    tpots = [c.tpot_seconds for c in result.results]
    assert tpots == sorted(tpots)
    for candidate in result.results:
        degrees = candidate.layout
        assert (degrees.get("tensor", 1) * degrees.get("pipeline", 1)
                * degrees.get("data", 1)) == 8
        assert candidate.ttft_seconds <= 2.0 and candidate.tpot_seconds <= 0.03
        plan = session.evaluate(candidate.table)
        state = plan.serving[0].continuous
        assert plan.fits and state.stable
        assert (state.ttft_seconds, state.tpot_seconds) == (candidate.ttft_seconds,
                                                            candidate.tpot_seconds)
    assert sum(result.rejected.values()) + len(result.results) == result.tried
    assert result.rejected.get("tpot_seconds_max", 0) > 0


def test_a_percentile_limits_the_tail():
    session = llmpar.Session()
    mean = search_serving(session, session.load_spec(
        {**RATE, "search": {"ttft_seconds_max": 0.3}}), objective="step_time")
    tail = search_serving(session, session.load_spec(
        {**RATE, "search": {"ttft_seconds_max": 0.3, "percentile": "p99"}}),
        objective="step_time")
    assert len(tail.results) < len(mean.results)


def test_moe_layouts_spread_experts_over_replicas():
    session = llmpar.Session()
    spec = session.load_spec({"model": "mixtral-8x7b",
                              "hardware": {"cluster": "dgx-h100", "num_gpus": 4},
                              "inference": {"concurrency": 16, "prompt_tokens": 1024,
                                            "generated_tokens": 256}})
    result = search_serving(session, spec, objective="tokens_per_second_per_gpu", top=50)
    assert any(c.layout.get("expert", 1) > 1 for c in result.results)
    for candidate in result.results:
        assert candidate.layout.get("data", 1) % candidate.layout.get("expert", 1) == 0
    scores = [c.score for c in result.results]
    assert scores == sorted(scores, reverse=True)


def test_no_layout_meets_an_impossible_limit(capsys):
    assert main(["search", DONE_WHEN, "--set", "search.tpot_seconds_max=0.001"]) == 1
    assert "no layout fits and meets the limits" in capsys.readouterr().out


def test_cli_searches_a_serving_spec(capsys, tmp_path):
    best = tmp_path / "best.toml"
    assert main(["search", DONE_WHEN, "--objective", "step_time", "--json",
                 "--emit", str(best)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "step_time" and data["results"]
    first = data["results"][0]
    plan = llmpar.evaluate(str(best))
    assert plan.serving[0].continuous.tpot_seconds == first["tpot_seconds"]


def test_cost_needs_a_gpu_hour_price():
    session = llmpar.Session()
    with pytest.raises(llmpar.SpecError) as error:
        search_serving(session, session.load_spec(DONE_WHEN), objective="cost")
    assert error.value.problems[0].path == "$.hardware.gpu_hour_cost"


def test_serving_limits_on_a_training_spec_are_an_error():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(str(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml"),
                      {"search.tpot_seconds_max": 0.05})
    assert "$.search.tpot_seconds_max" in [p.path for p in error.value.problems]
