"""Hybrid sharding (`[parallel.data] shard_degree`, PyTorch HSDP): states sharded inside
groups of data ranks, replicated across them, with the replicas' gradient shards
all-reduced once per step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from search_specs import MOE_MODEL, agreeing_pairs, small_spec

import llmpar

EXAMPLE = Path(__file__).resolve().parent.parent / "specs" / "examples" / \
    "llama-3-70b-hsdp-256-h100.toml"
SHARD = "$.parallel.data.shard_degree"


def spec_8b(num_gpus: int = 32, **data: Any) -> dict[str, Any]:
    parallel: dict[str, Any] = {"data": {"fsdp": True, **data}}
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": num_gpus},
            "training": {"sequence_length": 4096, "micro_batch_size": 1,
                         "global_batch_size": 128, "recompute": "full", "tokens": 1e12},
            "parallel": parallel}


def _collectives(plan: llmpar.Plan) -> list[tuple[Any, ...]]:
    return [(c.name, c.operation, c.buffer_bytes, c.group_size, c.tier, c.calls_per_step,
             c.seconds, c.exposed_seconds, c.window_seconds, c.pieces)
            for c in plan.collectives]


def test_shard_degree_equal_to_the_data_degree_is_plain_fsdp():
    plain = llmpar.evaluate(spec_8b())
    whole = llmpar.evaluate(spec_8b(shard_degree=32))
    assert _collectives(whole) == _collectives(plain)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                  "buffers_bytes", "total_bytes", "step_seconds", "stages"):
        assert getattr(whole, field) == getattr(plain, field), field


@pytest.mark.parametrize(("context", "data", "shard"), [(1, 32, 4), (1, 32, 1), (2, 16, 4)])
def test_states_divide_by_the_shard_group(context, data, shard):
    parallel = {"context": {"degree": context}} if context > 1 else {}
    unsharded = llmpar.evaluate({**spec_8b(), "parallel": {**parallel,
                                                           "data": {"degree": data}}})
    spec = spec_8b(shard_degree=shard)
    spec["parallel"].update(parallel)
    hybrid = llmpar.evaluate(spec)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert getattr(hybrid, field) == pytest.approx(
            getattr(unsharded, field) / (shard * context), abs=1), field


def test_memory_falls_as_the_shard_group_grows():
    totals = [llmpar.evaluate(spec_8b(shard_degree=s)).total_bytes for s in (1, 2, 8, 32)]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]


def test_llama_3_70b_hsdp_example_hand_check():
    # PP4 x DP64, shard_degree 8: each node's 8 data ranks (consecutive ranks, default
    # order tp-cp-ep-dp-pp) shard the stage's states over NVLink; the 8 replicas of a
    # shard sit 8 ranks apart, one per node, and all-reduce its gradients over InfiniBand.
    plan = llmpar.evaluate(EXAMPLE)
    assert plan.layout == {"pipeline": 4, "data": 64}
    n = plan.parameters
    stage_bf16 = 2 * n / 4  # bf16 weights (and gradients) of one stage, on average
    m = 512 // 64  # micro-batches per step
    by_name = {c.name: c for c in plan.collectives if c.strategy == "data"}
    assert set(by_name) == {"data.dense-grad-reduce-scatter", "data.dense-param-all-gather",
                            "data.dense-grad-replica-all-reduce"}
    scatter = by_name["data.dense-grad-reduce-scatter"]
    gather = by_name["data.dense-param-all-gather"]
    replica = by_name["data.dense-grad-replica-all-reduce"]
    for collective in (scatter, gather):
        assert (collective.group_size, collective.tier) == (8, "intra-node")
        assert collective.buffer_bytes == pytest.approx(stage_bf16, rel=0.02)
    assert (scatter.calls_per_step, gather.calls_per_step) == (m, 2 * m)
    assert (replica.operation, replica.group_size, replica.tier) == ("all-reduce", 8,
                                                                     "inter-node")
    assert replica.calls_per_step == 1
    assert replica.buffer_bytes == pytest.approx(scatter.buffer_bytes / 8, rel=1e-6)
    assert (replica.hides_behind, replica.pieces) == ("last-backward", 20)
    # The states: 16 bytes per parameter (bf16 weights and gradients, Adam's 12 bytes),
    # over the 4 stages and the 8 ranks of the shard group.
    states = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
    assert states == pytest.approx(16 * n / 4 / 8, rel=0.05)


@pytest.mark.parametrize(("data", "fragment"), [
    ({"zero": 2, "shard_degree": 4}, "needs parallel.data.zero = 3 or parallel.data.fsdp"),
    ({"fsdp": True, "shard_degree": 3}, "shard_degree (3) must divide the data degree (32)"),
    ({"fsdp": True, "shard_degree": 64}, "must divide the data degree (32)"),
])
def test_bad_shard_degrees_name_the_key(data, fragment):
    spec = spec_8b()
    spec["parallel"]["data"] = data
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(spec)
    problems = error.value.problems
    assert [p.path for p in problems] == [SHARD]
    assert fragment in problems[0].message


def test_shard_degree_must_be_positive():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(spec_8b(shard_degree=0))
    assert any(p.path == SHARD for p in error.value.problems)


def test_expert_replicas_must_divide_the_expert_data_ranks():
    # Mixtral on 16 GPUs, EP8: the expert-data ranks are 16 / 8 = 2, so 4 replicas
    # (shard_degree 4) cannot shard the expert weights; 2 replicas can.
    def spec(shard: int) -> dict[str, Any]:
        return {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
                "training": {"sequence_length": 4096, "micro_batch_size": 1,
                             "global_batch_size": 16, "recompute": "full"},
                "parallel": {"expert": {"degree": 8},
                             "data": {"fsdp": True, "shard_degree": shard}}}

    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(spec(4))
    assert [p.path for p in error.value.problems] == [SHARD]
    assert "expert-data ranks (2)" in error.value.problems[0].message
    plan = llmpar.evaluate(spec(8))
    replicas = {c.name: c.group_size for c in plan.collectives
                if c.name.endswith("replica-all-reduce")}
    assert replicas == {"data.dense-grad-replica-all-reduce": 2,
                        "data.expert-grad-replica-all-reduce": 2}


HYBRID_SPACES = {
    "dense-fsdp": small_spec(parallel={"data": {"fsdp": True}}),
    "moe-fsdp": small_spec(model=MOE_MODEL, parallel={"data": {"fsdp": True}}),
    "dense-shard-pinned": small_spec(parallel={"data": {"zero": 3, "shard_degree": 2}}),
}


@pytest.mark.parametrize("name", sorted(HYBRID_SPACES))
def test_fast_path_agrees_with_each_layout_alone(name):
    hybrid = 0
    for pair in agreeing_pairs(llmpar.default_session(), HYBRID_SPACES[name]):
        shard = pair.choice.get("data.shard_degree")
        hybrid += shard is not None and shard < pair.degrees["data"]
    assert hybrid > 0


def test_fast_search_finds_what_exhaustive_search_finds_with_shard_degrees():
    spec = HYBRID_SPACES["dense-fsdp"]
    fast = llmpar.search(spec, top=8)
    slow = llmpar.search(spec, top=8, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in slow.results]
    assert (fast.considered, fast.evaluated, fast.ranked) == (
        slow.considered, slow.evaluated, slow.ranked)


def test_shard_degrees_are_tried_only_under_zero_3():
    result = llmpar.search(small_spec(), top=10_000)
    seen = {(r.choices["data.zero"], r.choices["data.shard_degree"]) for r in result.results}
    assert {shard for zero, shard in seen if zero != 3} == {None}
    assert {shard for zero, shard in seen if zero == 3} >= {None, 2}


def test_under_fsdp_each_layout_is_searched_once_as_zero_3():
    # fsdp = true shards as stage 3 whatever `zero` says: stages 0 to 2 would be the same
    # layouts again, each ranked four times
    result = llmpar.search(HYBRID_SPACES["dense-fsdp"], top=10_000)
    sharded = [r for r in result.results
               if r.plan.layout["data"] * r.plan.layout.get("context", 1) > 1]
    assert sharded and {r.choices["data.zero"] for r in sharded} == {3}
    layouts = [(tuple(sorted(r.plan.layout.items())), tuple(sorted(
        (k, str(v)) for k, v in r.choices.items()))) for r in result.results]
    assert len(layouts) == len(set(layouts))
    free = llmpar.search(small_spec(), top=10_000)
    assert {r.choices["data.zero"] for r in free.results} == {0, 1, 2, 3}


def test_search_on_the_example_ranks_hybrid_layouts():
    # The example without its shard degree: the search tries every one at every layout.
    spec = llmpar.load_spec(EXAMPLE)
    data = attrs.evolve(spec.parallel["data"], shard_degree=None)
    free = attrs.evolve(spec, parallel={**spec.parallel, "data": data})
    result = llmpar.search(free, top=50)
    hybrid = [r for r in result.results
              if 1 < (r.choices.get("data.shard_degree") or 0) < r.plan.layout["data"]]
    assert hybrid, [r.choices for r in result.results]
    for ranked in hybrid:
        replicas = ranked.plan.layout["data"] // ranked.choices["data.shard_degree"]
        assert any(c.name == "data.dense-grad-replica-all-reduce" and c.group_size == replicas
                   for c in ranked.plan.collectives)


def test_ranked_hybrid_layouts_read_back_and_say_so():
    from llmpar.search.report import options_text

    result = llmpar.search(HYBRID_SPACES["dense-fsdp"], top=10_000)
    hybrid = next(r for r in result.results if r.choices["data.shard_degree"] is not None)
    whole = next(r for r in result.results if r.choices["data.shard_degree"] is None)
    shard = hybrid.choices["data.shard_degree"]
    assert f"HSDP(s={shard})" in options_text(hybrid.choices)
    assert "HSDP" not in options_text(whole.choices)
    for ranked in (hybrid, whole):
        again = llmpar.evaluate(ranked.to_toml())
        assert (again.total_bytes, again.step_seconds) == (ranked.plan.total_bytes,
                                                            ranked.plan.step_seconds)
    assert "shard_degree = " + str(shard) in hybrid.to_toml()
    assert "shard_degree" not in whole.to_toml()
