"""Disaggregated prefill and decode (`[inference.disaggregated]`): two pools, the prompt's
cache sent between them by hand, TTFT as queue + prefill + transfer, decode steps free of
prefill chunks, each pool's utilisation, and the problems of a bad table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.errors import SpecError
from llmpar.plan import Plan

EXAMPLE = Path(__file__).resolve().parent.parent / "specs" / "examples" / \
    "serve-llama-3.1-70b-1p1d-h100.toml"


def raw() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def evaluate(**overrides) -> Plan:
    return llmpar.evaluate(str(EXAMPLE), overrides)


def test_the_plan_lists_a_decode_pool_then_a_prefill_pool():
    plan = evaluate()
    decode, prefill = plan.serving
    assert (decode.role, prefill.role) == ("decode", "prefill")
    assert (decode.num_gpus, prefill.num_gpus, plan.num_gpus) == (8, 8, 16)
    assert decode.layout["tensor"] == prefill.layout["tensor"] == 8
    # The prefill pool holds one prompt's cache (4,096 + 1 tokens in 16-token blocks:
    # 4,112), one KV head per GPU under TP8: 4,112 x 80 layers x 2 x 128 x 2 bytes.
    assert prefill.kv_cache_bytes == 4112 * 80 * 2 * 128 * 2
    assert decode.kv_cache_bytes > 50 * prefill.kv_cache_bytes
    assert prefill.tpot_seconds is None and prefill.tokens_per_second is None


def test_the_transfer_is_one_gpus_share_over_its_nic():
    record = evaluate().serving[0].disaggregation
    # Llama-3.1-70B: 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes per token, split
    # over 8 GPUs; 400 Gb/s = 50 GB/s per GPU (DGX H100 user guide), plus the latency.
    share = 4096 * 80 * 2 * 128 * 2
    assert record.kv_transfer_bytes_per_gpu == share
    assert record.kv_transfer_bandwidth_bytes_per_s == 50e9
    assert record.kv_transfer_seconds == pytest.approx(share / 50e9, rel=0.01)
    stated = evaluate(**{"inference.disaggregated.kv_transfer_bandwidth_bytes_per_s": 5e9})
    slow = stated.serving[0].disaggregation
    assert slow.kv_transfer_seconds - record.kv_transfer_seconds == pytest.approx(
        share / 5e9 - share / 50e9, rel=1e-9)
    assert stated.prefill_seconds - evaluate().prefill_seconds == pytest.approx(
        share / 5e9 - share / 50e9, rel=1e-6)


def test_ttft_is_the_queue_the_prefill_and_the_transfer():
    plan = evaluate()
    decode = plan.serving[0]
    record, state = decode.disaggregation, decode.continuous
    assert state.ttft_seconds == pytest.approx(
        state.queue_seconds + record.prefill_seconds + record.kv_transfer_seconds)
    assert plan.prefill_seconds == state.ttft_seconds
    # M/D/1 at rho = rate x prefill seconds on the one prefill replica.
    rho = 4.0 * record.prefill_seconds
    assert record.prefill_utilization == pytest.approx(rho)
    assert state.queue_seconds == pytest.approx(rho * record.prefill_seconds / (2 * (1 - rho)))
    assert state.ttft_p99_seconds > state.ttft_p90_seconds > record.prefill_seconds
    # `llmpar explain SPEC prefill_seconds` adds up the same three parts.
    derivation = plan.derivation("prefill_seconds")
    assert derivation.value == pytest.approx(sum(derivation.inputs[k] for k in (
        "queue_seconds", "prefill_seconds", "kv_transfer_seconds")))


def test_decode_steps_carry_no_prefill_so_tpot_beats_the_colocated_one():
    disaggregated = evaluate().serving[0].continuous
    colocated_spec = raw()
    del colocated_spec["inference"]["disaggregated"]
    colocated = llmpar.evaluate(colocated_spec).serving[0].continuous
    assert disaggregated.prefill_tokens_per_step == 0
    assert colocated.prefill_tokens_per_step > 0
    assert disaggregated.tpot_seconds >= disaggregated.tpot_floor_seconds
    # Two colocated TP8 replicas run half the batch each, with prefill chunks mixed in;
    # the one decode replica runs the whole batch. Per sequence, its step is cheaper.
    assert disaggregated.tpot_seconds / disaggregated.batch_size < \
        colocated.tpot_seconds / colocated.batch_size


def test_utilisation_grows_with_the_rate_and_the_lower_maximum_limits_it():
    records = [evaluate(**{"inference.request_rate_per_s": rate}).serving[0].disaggregation
               for rate in (1.0, 2.0, 4.0)]
    for low, high in zip(records, records[1:]):
        assert high.prefill_utilization > low.prefill_utilization
        assert high.decode_utilization > low.decode_utilization
    record = records[-1]
    lower = min(record.prefill_max_request_rate_per_s, record.decode_max_request_rate_per_s)
    expected = ("prefill" if record.prefill_max_request_rate_per_s == lower else "decode")
    assert record.rate_limited_by == expected
    over = evaluate(**{"inference.request_rate_per_s": lower * 1.05})
    assert over.serving[0].continuous.stable is False
    assert over.prefill_seconds is None


def test_more_prefill_replicas_raise_the_prefill_pools_maximum():
    one = evaluate().serving[0].disaggregation
    two = evaluate(**{"inference.disaggregated.prefill_layout": {"tensor": 4}}).serving[0]
    assert two.disaggregation.prefill_replicas == 2
    # Each TP4 GPU holds twice the share of a prompt's cache, so the transfer doubles.
    assert two.disaggregation.kv_transfer_bytes_per_gpu == 2 * one.kv_transfer_bytes_per_gpu
    assert two.disaggregation.prefill_max_request_rate_per_s > \
        one.prefill_max_request_rate_per_s


def test_static_batching_prefills_the_batch_and_sends_its_cache():
    spec = raw()
    del spec["inference"]["request_rate_per_s"]
    spec["inference"]["batch_size"] = 8
    plan = llmpar.evaluate(spec)
    decode, prefill = plan.serving
    record = decode.disaggregation
    assert record.prompts_per_prefill == 8 and decode.batch_size == 8
    assert record.kv_transfer_bytes_per_gpu == 8 * 4096 * 80 * 2 * 128 * 2
    assert plan.prefill_seconds == pytest.approx(record.prefill_seconds
                                                 + record.kv_transfer_seconds)
    assert plan.latency_seconds == pytest.approx(plan.prefill_seconds
                                                 + 1023 * plan.tpot_seconds)
    assert record.prefill_utilization is None and record.rate_limited_by is None


def test_the_plan_round_trips_through_json():
    plan = evaluate()
    assert Plan.from_dict(plan.to_dict()) == plan


def test_plans_without_the_table_keep_one_pool():
    spec = raw()
    del spec["inference"]["disaggregated"]
    plan = llmpar.evaluate(spec)
    assert len(plan.serving) == 1 and plan.serving[0].disaggregation is None


@pytest.mark.parametrize(("overrides", "path", "words"), [
    ({"inference.disaggregated.decode_gpus": 4}, "$.inference.disaggregated",
     "prefill_gpus + decode_gpus"),
    ({"inference.disaggregated.decode_layout": {"tensor": 16}},
     "$.inference.disaggregated.decode_layout", "decode pool of 8 GPUs"),
    ({"inference.disaggregated.prefill_layout": {"tensor": 0}},
     "$.inference.disaggregated.prefill_layout.tensor", "positive degree"),
    ({"inference.disaggregated.prefill_layout": {"tensr": 8}},
     "$.inference.disaggregated.prefill_layout.tensr", "no loaded plugin"),
])
def test_bad_tables_name_the_key(overrides, path, words):
    with pytest.raises(SpecError) as error:
        evaluate(**overrides)
    assert any(p.path == path and words in p.message for p in error.value.problems), \
        error.value.problems


def test_a_concurrency_is_refused():
    spec = raw()
    del spec["inference"]["request_rate_per_s"]
    spec["inference"]["concurrency"] = 32
    with pytest.raises(SpecError) as error:
        llmpar.evaluate(spec)
    assert [p.path for p in error.value.problems] == ["$.inference.concurrency"]


def test_the_search_pairs_the_pools_layouts_and_meets_its_limits():
    from llmpar.search.serving import search_serving

    session = llmpar.Session()
    spec = session.load_spec(str(EXAMPLE), {"search.max_degrees.pipeline": 1,
                                            "search.ttft_seconds_max": 0.3})
    result = search_serving(session, spec, objective="step_time")
    assert result.tried == 16  # tensor 1, 2, 4, 8 for each pool of 8 GPUs
    assert result.results and all(c.ttft_seconds <= 0.3 for c in result.results)
    best = result.best
    assert best.layout == {"prefill.tensor": 8, "decode.tensor": 8}
    plan = llmpar.evaluate(best.table)
    assert plan.serving[0].continuous.tpot_seconds == best.tpot_seconds
    # A step per output token in ascending order: the rank is the objective's.
    assert [c.tpot_seconds for c in result.results] == sorted(
        c.tpot_seconds for c in result.results)


def test_an_overloaded_pool_is_named_and_the_plan_stays_finite():
    # Found by the fuzz suite: 8 requests/s is more than either 8-GPU pool sustains.
    from llmpar.report.json_format import strict_json
    table = {"model": "llama-3.1-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
             "inference": {"engine": "vllm", "request_rate_per_s": 8.0, "prompt_tokens": 4096,
                           "generated_tokens": 1024, "weights": "fp8",
                           "disaggregated": {"prefill_gpus": 8, "decode_gpus": 8,
                                             "prefill_layout": {"tensor": 8},
                                             "decode_layout": {"tensor": 8}}},
             "parallel": {"tensor": {"degree": 8}}}
    plan = llmpar.evaluate(table)
    strict_json(plan.to_dict())  # no infinity anywhere, derivations included
    assert any(w.startswith("prefill pool overloaded") for w in plan.warnings)
    assert plan.serving[0].disaggregation.ttft_seconds is None
