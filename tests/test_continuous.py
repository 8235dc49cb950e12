"""Continuous batching (`[inference] concurrency` or `request_rate_per_s`): the steady
state's batch, the step with prefill mixed in, TTFT with queueing, against hand counts,
Little's law and a simulation of the queue (validation/queueing_md1.py)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from validation_scripts import load_script

import llmpar
from llmpar.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
LLAMA_70B = str(EXAMPLES / "inference-llama-2-70b-h100.toml")
DONE_WHEN = str(EXAMPLES / "serve-llama-3.1-70b-fp8-vllm-4-h100.toml")
QUEUE = load_script("queueing_md1")


def steady(spec=LLAMA_70B, **inference):
    overrides = {f"inference.{key}": value for key, value in inference.items()}
    plan = llmpar.evaluate(spec, {"inference.batch_size": 1, **overrides})
    return plan, plan.serving[0].continuous


def test_static_batching_stays_the_default():
    plan = llmpar.evaluate(LLAMA_70B)
    assert plan.serving[0].continuous is None and plan.micro_batch_size == 16


def test_a_step_carries_the_batch_decode_and_its_share_of_prefill_by_hand():
    # Llama-2-70B, TP8, 32 requests of 2048 in and 256 out, no token budget: each step
    # decodes 32 tokens and prefills 32 x 2048 / 256 = 256 tokens.
    _, state = steady(concurrency=32)
    assert state.batch_size == 32 and state.prefill_tokens_per_step == 256
    assert state.batch_limited_by == "concurrency" and state.token_budget is None
    tokens = 32 + 256
    layer_weights = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    pair_flops = 2 * (64 / 8) * (128 + 128)  # both products, 8 heads a GPU
    decode_pairs = 32 * (2048 + 256 / 2)  # each sequence attends its average context
    prefill_pairs = 256 / 2048 * 2048 * 2049 / 2  # an eighth of a prompt's causal pairs
    flops = (80 * (2 * tokens * layer_weights / 8 + (decode_pairs + prefill_pairs) * pair_flops)
             + 2 * 32 * 8192 * 32000 / 8)
    assert state.flops_per_step == pytest.approx(flops, rel=1e-12)
    # TPOT: slower than a pure decode step at batch 32, never under the step's floor.
    pure = llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 32}).tpot_seconds
    assert state.tpot_seconds > pure and state.tpot_seconds > state.tpot_floor_seconds
    assert state.tokens_per_second == pytest.approx(32 / state.tpot_seconds, rel=1e-12)
    assert state.tokens_per_second_per_user == pytest.approx(1 / state.tpot_seconds)
    assert state.queue_seconds == 0 and state.ttft_seconds == state.ttft_p99_seconds


def test_the_token_budget_spreads_a_prompt_over_steps():
    # vLLM's 512-token budget less 32 decode tokens leaves 480 a step: 2048 / 480 -> 5 steps
    # of 409.6 prompt tokens; the batch limit is 512 / (1 + 2048 / 256) = 56.9.
    plan, state = steady(concurrency=32, engine="vllm")
    assert state.token_budget == 512 and state.prefill_steps_per_request == 5
    assert state.prefill_chunk_tokens == pytest.approx(2048 / 5)
    assert state.batch_limit == pytest.approx(512 / 9)
    assert state.ttft_seconds > 5 * state.tpot_seconds * 0.9
    # The static parts follow the steady state: its batch, prefill in budget-sized steps.
    assert plan.micro_batch_size == 32 and plan.phases[0].steps == 32 * 2048 // 512


def test_concurrency_beyond_the_batch_limit_waits_by_littles_law():
    _, state = steady(concurrency=200, engine="vllm")
    assert state.batch_size == pytest.approx(512 / 9)
    assert state.batch_limited_by.startswith("token budget")
    completions = state.request_rate_per_s
    assert state.queue_seconds == pytest.approx((200 - 512 / 9) / completions, rel=1e-12)
    residence = state.prefill_steps_per_request + 256 - 1
    assert completions * residence * state.tpot_seconds == pytest.approx(512 / 9, rel=1e-12)


def test_a_request_rate_holds_the_batch_littles_law_gives():
    _, state = steady(request_rate_per_s=2.0)
    residence = state.prefill_steps_per_request + 256 - 1
    assert 2.0 * residence * state.tpot_seconds == pytest.approx(state.batch_size, rel=1e-9)
    assert state.tokens_per_second == pytest.approx(2.0 * 256, rel=1e-9)
    assert state.stable and 0 < state.prefill_utilization < 1
    rho, service = state.prefill_utilization, state.ttft_seconds - state.queue_seconds
    assert state.queue_seconds == pytest.approx(rho * service / (2 * (1 - rho)), rel=1e-12)
    assert state.ttft_seconds < state.ttft_p90_seconds < state.ttft_p99_seconds
    assert state.concurrency == pytest.approx(2.0 * state.latency_seconds, rel=1e-12)


@pytest.mark.parametrize("spec, inference", [
    (LLAMA_70B, {"request_rate_per_s": 2.0}),
    (LLAMA_70B, {"request_rate_per_s": 0.05, "prefill_chunk_tokens": 512}),
    (LLAMA_70B, {"request_rate_per_s": 6.0, "prefix_cache_hit_rate": 0.5}),
    (LLAMA_70B, {"request_rate_per_s": 3.0, "engine": "vllm"}),
    (LLAMA_70B, {"request_rate_per_s": 0.7, "engine": "vllm", "prefill_chunk_tokens": 1024}),
])
def test_the_request_rate_fixed_point_is_the_bisections_to_the_last_bit(spec, inference):
    """The fixed point B = rate x residence(B) x step(B) is the one the 40 halvings of
    [0, limit] give, though most of their midpoints are decided by a bracket of the
    crossing instead of a step each (`llmpar.inference.continuous._running_batch`)."""
    from llmpar.inference.continuous import (
        BISECTION_STEPS,
        mixed_step,
        prefill_steps_per_request,
        token_budget,
    )
    from llmpar.inference.evaluate import serving_of
    from llmpar.loading.checks import resolve_layout
    from llmpar.roofline import rates_of

    plan, state = steady(spec, **inference)
    assert state.stable
    loaded = llmpar.load_spec(spec, {"inference.batch_size": 1, **{
        f"inference.{key}": value for key, value in inference.items()}})
    session = llmpar.Session()
    layout, _ = resolve_layout(loaded, session.strategies)
    serving = serving_of(loaded, layout, session.strategies)
    budget = token_budget(serving)
    if budget is not None:  # as the plan steps the prefill in the token budget
        chunked = attrs.evolve(serving.inference, prefill_chunk_tokens=budget)
        serving = attrs.evolve(serving, spec=attrs.evolve(loaded, inference=chunked))
    rates = rates_of(loaded.hardware.gpu)
    out = serving.inference.generated_tokens
    ratio = serving.inference.computed_prompt_tokens / out
    rate = serving.inference.request_rate_per_s / serving.degree("data")
    low, high = 0.0, state.batch_limit
    for _ in range(BISECTION_STEPS):  # the plain bisection, a step at every midpoint
        middle = (low + high) / 2
        residence = prefill_steps_per_request(serving, middle)[0] + out - 1
        if rate * residence * mixed_step(serving, rates, middle, middle * ratio).seconds > middle:
            low = middle
        else:
            high = middle
    assert state.batch_size == high


def test_a_rate_above_capacity_is_overloaded(capsys):
    plan, state = steady(request_rate_per_s=100.0)
    assert not state.stable and state.ttft_seconds is None and state.concurrency is None
    assert state.max_request_rate_per_s < 100
    assert main(["evaluate", LLAMA_70B, "--set", "inference.batch_size=1",
                 "--set", "inference.request_rate_per_s=100"]) == 0
    assert "OVERLOADED" in capsys.readouterr().out


def test_ttft_grows_with_the_request_rate():
    ttfts = [steady(request_rate_per_s=rate)[1].ttft_seconds for rate in (0.5, 1, 2, 4, 6)]
    assert ttfts == sorted(ttfts) and ttfts[0] < ttfts[-1]


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_the_queueing_closed_form_against_a_simulation(rho):
    # M/D/1 by Lindley's recursion: the Pollaczek-Khinchine mean is exact; the exponential
    # tail is within 10% at p90 and errs high (conservative) at p99.
    waits = QUEUE.simulate(rho, 150_000, seed=3)[15_000:]
    mean, p90, p99 = QUEUE.closed_form(rho)
    assert sum(waits) / len(waits) == pytest.approx(mean, rel=0.05)
    assert QUEUE.quantile(waits, 0.90) == pytest.approx(p90, rel=0.10)
    assert QUEUE.quantile(waits, 0.99) <= p99 * 1.02


@pytest.mark.parametrize(("overrides", "path"), [
    ({"inference.batch_size": 1, "inference.concurrency": 4,
      "inference.request_rate_per_s": 1.0},
     "$.inference.request_rate_per_s"),
    ({"inference.concurrency": 4}, "$.inference.batch_size"),
    ({"inference.batch_size": 1, "inference.concurrency": 0}, "$.inference.concurrency"),
    ({"inference.batch_size": 1, "inference.request_rate_per_s": -1},
     "$.inference.request_rate_per_s"),
])
def test_bad_workloads_name_their_key(overrides, path):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, overrides)
    assert path in [p.path for p in error.value.problems]


def test_continuous_spec_round_trips():
    spec = llmpar.load_spec(DONE_WHEN)
    assert spec.inference.concurrency == 32 and spec.inference.engine.name == "vllm"
    assert llmpar.load_spec(llmpar.dump_spec(spec)) == spec


def test_the_shipped_vllm_example_gives_ttft_tpot_and_throughput(capsys):
    # Llama-3.1-70B FP8 on 4 H100, vLLM profile, concurrency 32, 4K in / 1K out.
    plan, state = steady(DONE_WHEN)
    assert plan.fits and plan.serving[0].engine == "vllm 0.6.4 (CUDA graphs)"
    assert state.batch_size == 32 and state.prefill_tokens_per_step == 128
    assert state.ttft_seconds > 0 and state.tpot_seconds > state.tpot_floor_seconds
    assert state.tokens_per_second == pytest.approx(32 / state.tpot_seconds)
    for quantity in ("continuous.ttft_seconds", "continuous.tpot_seconds",
                     "continuous.tokens_per_second", "continuous.batch_size"):
        assert plan.derivation(quantity).value == getattr(state, quantity.split(".")[1])
    assert main(["evaluate", DONE_WHEN]) == 0
    text = capsys.readouterr().out
    assert "Continuous batching (steady state)" in text and "time to first token" in text
    assert main(["evaluate", DONE_WHEN, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["serving"][0]["continuous"]["tpot_seconds"] == state.tpot_seconds


# --- prefix caching ------------------------------------------------------------------------

def test_a_prefix_cache_leaves_the_prefill_the_uncached_tokens_by_hand():
    # Half of each 2048-token prompt is cached: the prefill computes 1024 tokens per
    # sequence, which attend the cached 1024 and each other (pairs(2048) - pairs(1024)).
    plain = llmpar.evaluate(LLAMA_70B)
    plan = llmpar.evaluate(LLAMA_70B, {"inference.prefix_cache_hit_rate": 0.5})
    layer_weights = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    pairs = 16 * (2048 * 2049 / 2 - 1024 * 1025 / 2)
    flops = (2 * 16 * 1024 * 80 * layer_weights / 8 + 80 * pairs * 2 * 8 * 256
             + 2 * 16 * 8192 * 32000 / 8)
    assert plan.phases[0].flops == pytest.approx(flops, rel=1e-12)
    # The cached prefix still sits in the cache; decode does not change.
    assert plan.kv_cache_bytes == plain.kv_cache_bytes
    assert plan.tpot_seconds == plain.tpot_seconds
    assert plan.prefill_seconds < plain.prefill_seconds
    assert plan.derivation("prefill_seconds").inputs["cached_prompt_tokens"] == 1024


def test_a_prefix_cache_mixes_fewer_prefill_tokens_into_each_step():
    _, plain = steady(concurrency=32)
    _, cached = steady(concurrency=32, prefix_cache_hit_rate=0.75)
    assert cached.prefill_tokens_per_step == plain.prefill_tokens_per_step / 4 == 64
    assert cached.tpot_seconds < plain.tpot_seconds
    assert cached.ttft_seconds < plain.ttft_seconds


def test_the_last_prompt_token_is_always_computed():
    spec = llmpar.load_spec(LLAMA_70B, {"inference.prefix_cache_hit_rate": 0.9999})
    assert spec.inference.cached_prompt_tokens == 2047
    assert spec.inference.computed_prompt_tokens == 1


@pytest.mark.parametrize("rate", [1.0, -0.1, 2])
def test_bad_hit_rate_names_its_key(rate):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, {"inference.prefix_cache_hit_rate": rate})
    assert [p.path for p in error.value.problems] == ["$.inference.prefix_cache_hit_rate"]
