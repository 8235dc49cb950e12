"""llmpar.search: what a search returns, pins, [search] limits, objectives, errors."""

from __future__ import annotations

import math

import pytest
from search_specs import MOE_MODEL, small_spec

import llmpar
from llmpar.search.result import REJECTED_MEMORY


@pytest.fixture(scope="module")
def result() -> llmpar.SearchResult:
    return llmpar.search(small_spec(), top=5)


def test_counts_add_up(result):
    assert result.considered == result.ranked + sum(result.rejected.values())
    assert 0 < result.evaluated < result.considered
    assert result.seconds > 0
    assert len(result.results) == 5


def test_every_result_multiplies_to_the_gpus_fits_and_is_what_evaluate_says(result):
    for ranked in result.results:
        plan = ranked.plan
        product = math.prod(d for name, d in plan.layout.items() if name != "expert")
        assert product == 8
        assert plan.fits and plan.total_bytes <= plan.capacity_bytes
        emitted = llmpar.load_spec(ranked.to_toml())
        assert llmpar.evaluate(emitted) == plan


def test_results_are_ranked_by_step_time_then_memory(result):
    keys = [(r.plan.step_seconds, r.plan.total_bytes) for r in result.results]
    assert keys == sorted(keys)
    assert [r.rank for r in result.results] == [1, 2, 3, 4, 5]
    assert result.best.objective == result.best.plan.step_seconds


def test_pareto_front_trades_memory_for_time(result):
    front = result.pareto
    assert front
    memory = [p.total_bytes for p in front]
    seconds = [p.step_seconds for p in front]
    assert memory == sorted(memory) and len(set(memory)) == len(memory)
    assert seconds == sorted(seconds, reverse=True) and len(set(seconds)) == len(seconds)
    assert front[-1].step_seconds == result.best.plan.step_seconds
    plan = llmpar.evaluate(front[0].spec)
    assert (plan.total_bytes, plan.step_seconds) == (front[0].total_bytes,
                                                     front[0].step_seconds)


def test_rejections_name_the_rule_and_quote_an_example(result):
    assert result.rejected["$.training.global_batch_size"] > 0
    assert "global_batch_size (24) must be a multiple" in result.examples[
        "$.training.global_batch_size"]


def test_memory_limit_rejects_what_does_not_fit():
    tight = llmpar.search(small_spec(search={"memory_limit_bytes": "150 MiB",
                                             "micro_batch_sizes": [1, 2]}), top=3)
    assert tight.rejected[REJECTED_MEMORY] > 0
    assert all(r.plan.total_bytes <= 150 * 2**20 for r in tight.results)


def test_parallel_tables_pin_choices():
    pinned = llmpar.search(small_spec(parallel={"tensor": {"degree": 2},
                                                "pipeline": {"schedule": "gpipe"}}), top=20)
    assert all(r.choices["tensor.degree"] == 2 for r in pinned.results)
    assert all(r.choices["pipeline.schedule"] == "gpipe" for r in pinned.results)


def test_data_degree_minus_one_is_not_a_pin():
    free = llmpar.search(small_spec(parallel={"data": {"degree": -1, "zero": 1}}), top=20)
    assert {r.choices["data.zero"] for r in free.results} == {1}
    assert len({r.choices["data.degree"] for r in free.results}) > 1


def test_search_table_narrows_the_space():
    narrow = llmpar.search(small_spec(), top=50, constraints={
        "tensor_within_node": True, "max_degrees": {"pipeline": 2},
        "values": {"data.zero": [1], "sequence": [True]}})
    full = llmpar.search(small_spec(), top=1)
    assert narrow.considered < full.considered
    for ranked in narrow.results:
        choices = ranked.choices
        assert choices["tensor.degree"] in (1, 2, 4) and choices["pipeline.degree"] <= 2
        assert choices["data.zero"] == 1
        assert choices["sequence"] is (choices["tensor.degree"] > 1)


def test_memory_objective_ranks_by_bytes():
    smallest = llmpar.search(small_spec(), objective="memory", top=5)
    memory = [r.plan.total_bytes for r in smallest.results]
    assert memory == sorted(memory)
    assert memory[0] == smallest.pareto[0].total_bytes


def test_throughput_and_cost_rank_as_step_time_does(result):
    tokens = 24 * 512
    spec = small_spec()
    spec["hardware"] = {**spec["hardware"], "gpu_hour_cost": 2.0}
    throughput = llmpar.search(spec, objective="tokens_per_second_per_gpu", top=5)
    cost = llmpar.search(spec, objective="cost", top=5)
    for by_rate, by_cost, by_time in zip(throughput.results, cost.results, result.results):
        seconds = by_time.plan.step_seconds
        assert by_rate.choices == by_cost.choices == by_time.choices
        assert by_rate.objective == pytest.approx(tokens / seconds / 8)
        assert by_cost.objective == pytest.approx(2.0 * 8 * seconds / 3600 / tokens * 1e6)


def test_moe_layouts_include_expert_parallelism():
    moe = llmpar.search(small_spec(model=MOE_MODEL), top=50)
    assert any(r.choices["expert.degree"] > 1 for r in moe.results)
    for ranked in moe.results:
        e = ranked.choices["expert.degree"]
        assert (ranked.choices["data.degree"] * ranked.choices["context.degree"]) % e == 0


def test_unmodelled_step_time_ranks_by_memory_and_says_so():
    spec = small_spec()
    spec["training"] = {**spec["training"], "mfu": 0.4}  # assumed, not modelled
    found = llmpar.search(spec, top=3)
    assert any("not modelled" in warning for warning in found.warnings)
    memory = [r.plan.total_bytes for r in found.results]
    assert memory == sorted(memory)


def test_layouts_an_assumed_mfu_cannot_reach_are_rejected_at_the_mfu():
    """mfu 0.95 holds without recomputation (HFU = MFU) but not with it: those layouts
    are rejected, by the fast path and one by one alike, and none is ranked."""
    spec = small_spec()
    spec["training"] = {**spec["training"], "mfu": 0.95}
    fast, slow = (llmpar.search(spec, top=50, exact=exact) for exact in (False, True))
    assert fast.rejected["$.training.mfu"] > 0 and fast.evaluated > 0
    assert (slow.rejected, slow.evaluated) == (fast.rejected, fast.evaluated)
    assert "recompute = 'full'" in fast.examples["$.training.mfu"]
    assert {r.choices["training.recompute"] for r in fast.results} == {"none"}
    assert all(r.plan.hfu <= 1 for r in fast.results)


@pytest.mark.parametrize(("change", "path"), [
    ({"training": {"sequence_length": 512}}, "$.training.global_batch_size"),
    ({"search": {"values": {"data.zeroo": [1]}}}, "$.search.values.data.zeroo"),
    ({"search": {"max_degrees": {"pipe": 2}}}, "$.search.max_degrees.pipe"),
    ({"search": {"objective": "cost"}}, "$.hardware.gpu_hour_cost"),
    ({"search": {"micro_batch_sizes": [0]}}, "$.search.micro_batch_sizes"),
])
def test_bad_input_is_a_spec_error_with_its_key_path(change, path):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(small_spec(**change))
    assert path in [problem.path for problem in error.value.problems]


def test_a_spec_whose_own_layout_is_invalid_can_still_be_searched():
    spec = small_spec(parallel={"data": {"degree": -1}})
    with pytest.raises(llmpar.SpecError):
        llmpar.evaluate({**spec, "training": {**spec["training"], "micro_batch_size": 4},
                         "search": {}})
    assert llmpar.search(spec, top=1).results


def test_to_dict_carries_the_counts_and_the_ranked_plans(result):
    data = result.to_dict()
    assert {"considered", "evaluated", "rejected", "seconds", "results", "pareto"} <= set(data)
    assert data["results"][0]["plan"] == result.best.plan.to_dict()
    assert data["results"][0]["layout"] == result.best.plan.layout


def test_jobs_split_the_space_and_find_the_same(result):
    split = llmpar.search(small_spec(), top=5, jobs=2)
    assert [r.choices for r in split.results] == [r.choices for r in result.results]
    assert [(p.total_bytes, p.step_seconds) for p in split.pareto] == [
        (p.total_bytes, p.step_seconds) for p in result.pareto]
    assert split.considered == result.considered


def test_one_layout_at_a_time_finds_the_same(result):
    slow = llmpar.search(small_spec(), top=5, exact=True)
    assert [r.choices for r in slow.results] == [r.choices for r in result.results]
    assert (slow.evaluated, slow.rejected) == (result.evaluated, result.rejected)
