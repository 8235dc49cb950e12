"""`[search] num_gpus` and the `gpus` objective on training specs: how many GPUs a run
needs. The best of a larger set of candidate counts is never worse than the best of a
subset; the count chosen is the smallest that fits and meets the limits, checked by
searching one GPU fewer exactly (every layout evaluated one by one)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_specs import small_spec

import llmpar
from llmpar.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
QLORA = str(EXAMPLES / "llama-3-70b-qlora-how-many-gpus.toml")
NO_DEADLINE = {"search.train_seconds_max": None}


def _search(counts, objective="gpus", **changes):
    return llmpar.search(QLORA, {"search.num_gpus": counts, **changes}, objective=objective)


@pytest.fixture(scope="module")
def qlora() -> llmpar.SearchResult:
    return llmpar.search(QLORA)


# --- [search] num_gpus as written ---------------------------------------------------------

@pytest.mark.parametrize(("written", "counts"), [
    ([8, 2, 4, 2], (2, 4, 8)),
    ({"min": 1, "max": 4}, (1, 2, 3, 4)),
    ({"min": 8, "max": 32, "step": 8}, (8, 16, 24, 32)),
])
def test_counts_are_a_list_or_a_range(written, counts):
    spec = llmpar.load_spec({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                             "search": {"num_gpus": written}})
    assert spec.search.num_gpus == counts
    assert spec.hardware.num_gpus == 1  # the spec's own count stays the default


@pytest.mark.parametrize(("written", "says"), [
    ({"min": 4}, "a range is"), ({"min": 4, "max": 2}, "1 <= min <= max"),
    ({"min": 1, "max": 8, "every": 2}, "a range is"), ("8", "expected an array"),
    ([0, 8], "must list GPU counts >= 1"), ([2.5], "expected an integer"),
    ({"min": 1, "max": 10**6}, "over the limit of 1,024"),
])
def test_bad_counts_name_the_key(written, says):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.load_spec({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                          "search": {"num_gpus": written}})
    problem = error.value.problems[0]
    assert problem.path == "$.search.num_gpus" and says in problem.message


def test_a_deadline_needs_the_run_length():
    with pytest.raises(llmpar.SpecError) as error:
        _search([4], **{"training.tokens": None})
    assert [p.path for p in error.value.problems] == ["$.search.train_seconds_max"]


# --- training ---------------------------------------------------------------------------

TINY = small_spec(training={"sequence_length": 512, "global_batch_size": 24, "tokens": 1e9},
                  search={"micro_batch_sizes": [1, 2], "recompute": ["none", "full"],
                          "memory_limit_bytes": "20 MiB"})
"""A tiny model whose layouts fit in 20 MiB on 4, 6 and 8 GPUs only."""
OBJECTIVES = ("gpus", "step_time", "cost", "tokens_per_second_per_gpu")


def _value(objective, result):
    """The best layout's objective, lower is better."""
    if not result.results:
        return float("inf")
    plan, gpus = result.best.plan, result.best.spec.hardware.num_gpus
    return {"gpus": gpus, "step_time": plan.step_seconds, "cost": gpus * plan.step_seconds,
            "tokens_per_second_per_gpu": gpus * plan.step_seconds}[objective]


@functools.cache
def _alone(count, objective):
    """The best layout on `count` GPUs, searched as the spec's own count."""
    try:
        result = llmpar.search(TINY, {"hardware.num_gpus": count,
                                      "hardware.gpu_hour_cost": 1.0}, objective=objective)
    except llmpar.SpecError:
        return float("inf")
    return _value(objective, result)


@settings(max_examples=12, deadline=None)
@given(counts=st.sets(st.integers(1, 8), min_size=1, max_size=4),
       more=st.sets(st.integers(1, 8), max_size=3), objective=st.sampled_from(OBJECTIVES))
def test_the_best_of_a_set_is_the_best_count_searched_alone(counts, more, objective):
    def best(of):
        try:
            return _value(objective, llmpar.search(
                TINY, {"search.num_gpus": sorted(of), "hardware.gpu_hour_cost": 1.0},
                objective=objective))
        except llmpar.SpecError:  # no count of the set holds a layout
            return float("inf")

    fewer, larger = best(counts), best(counts | more)
    assert larger <= fewer  # more candidates never give a worse best
    assert fewer == min(_alone(n, objective) for n in counts)


def test_the_count_chosen_is_the_smallest_that_fits_and_meets_the_deadline(qlora):
    best = qlora.best
    count = best.spec.hardware.num_gpus
    assert best.objective == count and count > 1
    assert best.plan.fits and best.plan.train_seconds <= 36 * 3600
    # One GPU fewer, every layout checked and evaluated one by one: none fits and meets it.
    fewer = llmpar.search(QLORA, {"hardware.num_gpus": count - 1, "search.num_gpus": None},
                          exact=True)
    assert fewer.ranked == 0 and not fewer.results
    assert fewer.evaluated > 0  # layouts were evaluated, not ruled out unseen
    # Without the deadline fewer GPUs fit: the deadline is what asked for more.
    fits = llmpar.search(QLORA, {"search.train_seconds_max": None, "search.num_gpus": None,
                                 "hardware.num_gpus": count - 1}, exact=True)
    assert fits.results
    assert fits.best.plan.train_seconds > 36 * 3600


def test_counts_table_and_every_result_is_its_evaluated_plan(qlora):
    assert [c.num_gpus for c in qlora.gpu_counts] == list(range(1, 9))
    assert qlora.considered == sum(c.considered for c in qlora.gpu_counts)
    assert qlora.ranked == sum(c.ranked for c in qlora.gpu_counts)
    assert qlora.considered == qlora.ranked + sum(qlora.rejected.values())
    first = min(c.num_gpus for c in qlora.gpu_counts if c.ranked)
    assert qlora.best.spec.hardware.num_gpus == first
    for ranked in qlora.results:
        assert llmpar.evaluate(llmpar.load_spec(ranked.to_toml())) == ranked.plan
        assert ranked.plan.train_seconds <= 36 * 3600
    keys = [(r.spec.hardware.num_gpus, r.plan.step_seconds) for r in qlora.results]
    assert keys == sorted(keys)  # fewest GPUs, ties broken by step time


def test_gpus_front_trades_gpus_for_time(qlora):
    front = qlora.gpus_pareto
    assert front[0].num_gpus == qlora.best.spec.hardware.num_gpus
    assert front[0].step_seconds == qlora.best.plan.step_seconds
    gpus = [p.num_gpus for p in front]
    seconds = [p.step_seconds for p in front]
    assert gpus == sorted(set(gpus)) and seconds == sorted(seconds, reverse=True)
    assert len(set(seconds)) == len(seconds)
    for count in qlora.gpu_counts:  # the best of each count, if it beats fewer GPUs
        if count.num_gpus in gpus:
            assert seconds[gpus.index(count.num_gpus)] == count.best_step_seconds
    plan = llmpar.evaluate(front[-1].spec)
    assert plan.step_seconds == front[-1].step_seconds
    assert plan.total_bytes == front[-1].total_bytes


@pytest.mark.parametrize("objective", ["gpus", "step_time", "cost", "tokens_per_second_per_gpu"])
def test_more_candidates_never_give_a_worse_best(objective):
    price = {"hardware.gpu_hour_cost": 0.5}
    nested = [[5], [4, 5], [3, 4, 5, 6], {"min": 1, "max": 8}]
    bests = []
    for counts in nested:
        result = _search(counts, objective, **price, **NO_DEADLINE)
        plan, spec = result.best.plan, result.best.spec
        value = {"gpus": spec.hardware.num_gpus, "step_time": plan.step_seconds,
                 "cost": result.best.objective,
                 "tokens_per_second_per_gpu": -plan.tokens_per_second
                 / spec.hardware.num_gpus}[objective]
        bests.append(value)
    assert all(later <= earlier for earlier, later in zip(bests, bests[1:])), bests


def test_cost_and_tokens_per_gpu_pick_the_same_layout_across_counts():
    cost = _search({"min": 2, "max": 8}, "cost", **{"hardware.gpu_hour_cost": 2.0})
    per_gpu = _search({"min": 2, "max": 8}, "tokens_per_second_per_gpu")
    assert cost.best.plan == per_gpu.best.plan
    # The front by cost: fewest GPUs first, each cheaper than those on fewer GPUs; the
    # cheapest of all is its last point.
    costs = [p.cost for p in cost.gpus_pareto]
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] == pytest.approx(cost.best.objective)


def test_a_throughput_floor_rejects_slower_layouts():
    floor = 2000.0
    result = _search({"min": 1, "max": 8}, **{"search.tokens_per_second_min": floor},
                     **NO_DEADLINE)
    assert result.results and result.rejected["$.search.tokens_per_second_min"] > 0
    assert "tokens/s" in result.examples["$.search.tokens_per_second_min"]
    for ranked in result.results:
        assert ranked.plan.tokens_per_second >= floor
    fewer = result.best.spec.hardware.num_gpus - 1
    exact = llmpar.search(QLORA, {"hardware.num_gpus": fewer, "search.num_gpus": None,
                                  "search.tokens_per_second_min": floor, **NO_DEADLINE},
                          exact=True)
    assert not exact.results


def test_counts_no_layout_takes_are_passed_over_and_said():
    # Tensor degree 4 only: counts it does not divide hold no layout.
    four = {"search.values": {"tensor.degree": [4]}}
    result = _search([2, 6, 8], **four, **NO_DEADLINE)
    assert [c.num_gpus for c in result.gpu_counts] == [2, 6, 8]
    assert [c.considered for c in result.gpu_counts[:2]] == [0, 0]
    assert "divides hardware.num_gpus (2)" in result.gpu_counts[0].note
    assert result.best.spec.hardware.num_gpus == 8
    assert result.best.plan.layout["tensor"] == 4
    with pytest.raises(llmpar.SpecError) as error:
        _search([2, 6], **four)
    assert error.value.problems[0].path == "$.search.num_gpus"


def test_without_num_gpus_nothing_changes():
    plain = llmpar.search(QLORA, {"search.num_gpus": None, **NO_DEADLINE})
    assert plain.gpu_counts == () and plain.gpus_pareto == ()
    listed = llmpar.search(QLORA, {"search.num_gpus": [4], **NO_DEADLINE})
    assert [r.plan for r in listed.results] == [r.plan for r in plain.results]
    assert listed.considered == plain.considered and listed.rejected == plain.rejected


def test_cli_reports_counts_and_the_front(capsys, tmp_path):
    best = tmp_path / "best.toml"
    assert main(["search", QLORA, "--emit", str(best)]) == 0
    out = capsys.readouterr().out
    assert "GPU counts tried ([search] num_gpus)" in out
    assert "Pareto front: GPUs versus step time" in out
    assert llmpar.load_spec(str(best)).hardware.num_gpus == 4
    assert main(["search", QLORA, "--json", "--top", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "gpus"
    assert [c["num_gpus"] for c in data["gpu_counts"]] == list(range(1, 9))
    assert data["results"][0]["num_gpus"] == data["gpus_pareto"][0]["num_gpus"] == 4


def test_docs_quote_the_example(qlora):
    text = (Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    best = qlora.best
    assert best.spec.hardware.num_gpus == 4
    assert [c.ranked for c in qlora.gpu_counts if c.num_gpus == 3] == [0]
    fits = _search([1, 2, 3], **NO_DEADLINE)
    assert fits.best.spec.hardware.num_gpus == 3
    hours = fits.best.plan.train_seconds / 3600
    assert "needs 3 GPUs to fit and 4 to finish" in text
    assert f"(3 GPUs take {hours:.0f} h)" in text
    a100 = _search({"min": 1, "max": 8}, **{"hardware.gpu": "a100-pcie-80gb"})
    alone = _search([1], **{"hardware.gpu": "a100-pcie-80gb"}, **NO_DEADLINE)
    assert a100.best.spec.hardware.num_gpus == 2 and alone.results
    assert "on 80 GB A100s one fits and two\nmeet the deadline" in text
