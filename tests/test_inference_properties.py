"""Physical rules of inference plans that must hold for every valid spec (Hypothesis; the
`ci` profile in conftest.py is deterministic)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import architectures

import llmpar
from llmpar.inference.kv_cache import kv_cache_bytes
from llmpar.spec import Inference
from llmpar.strategy import Layout

GPUS = ("a100-sxm-80gb", "h100-sxm", "h200-sxm", "l40s", "rtx-4090")


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "batch_size": draw(st.integers(1, 64)),
        "prompt_tokens": draw(st.integers(1, 8192)),
        "generated_tokens": draw(st.integers(1, 2048)),
        "weights": draw(st.sampled_from(["bf16", "fp8", "int8", "int4"])),
        "kv_cache": draw(st.sampled_from(["bf16", "fp8"])),
        "kv_block_tokens": draw(st.sampled_from([None, 16, 128])),
        "prefill_chunk_tokens": draw(st.sampled_from([None, 2048, 8192])),
        "prefix_cache_hit_rate": draw(st.sampled_from([0.0, 0.0, 0.5, 0.9])),
    }


def _plain(table: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value is not None}


def tensor_ok(model: dict[str, Any], t: int) -> bool:
    kv = model["num_kv_heads"]
    return (model["num_attention_heads"] % t == 0 and model["ffn_hidden_size"] % t == 0
            and (kv % t == 0 or t % kv == 0))


@given(architectures(), st.integers(1, 32), st.integers(1, 4096), st.integers(1, 8))
def test_kv_cache_is_linear_in_batch_and_tokens(model, batch, tokens, factor):
    spec = llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                             "inference": {"prompt_tokens": tokens, "generated_tokens": 1}})
    inference = Inference(prompt_tokens=tokens, generated_tokens=1)
    layout = Layout(degrees={}, num_gpus=1)
    layers = range(spec.model.num_layers or 0)

    def cache(b: int, n: int) -> int:
        return kv_cache_bytes(spec.model, inference, layout, layers, b, n)

    per_token = 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"] * 2
    assert cache(batch, tokens) == per_token * batch * tokens
    assert cache(batch * factor, tokens) == factor * cache(batch, tokens)
    assert cache(batch, tokens * factor) == factor * cache(batch, tokens)


@given(architectures(), workloads(), st.sampled_from([1, 2, 4]), st.sampled_from(GPUS))
def test_more_tensor_parallelism_never_adds_weights_or_cache_per_gpu(model, workload, t,
                                                                      gpu):
    assume(tensor_ok(model, t) and tensor_ok(model, 2 * t))

    def plan(degree: int) -> llmpar.Plan:
        return llmpar.evaluate({"model": model,
                                "hardware": {"gpu": gpu, "num_gpus": degree,
                                             "intra_node_bandwidth_bytes_per_s": 64e9},
                                "inference": _plain(workload),
                                "parallel": {"tensor": {"degree": degree}}})

    narrow, wide = plan(t), plan(2 * t)
    assert wide.weights_bytes <= narrow.weights_bytes
    assert wide.kv_cache_bytes <= narrow.kv_cache_bytes


@given(architectures(), workloads(), st.sampled_from(GPUS),
       st.sampled_from([{}, {"tensor": {"degree": 2}}, {"pipeline": {"degree": 2}},
                        {"context": {"degree": 2}}, {"data": {"degree": 2}}]))
def test_latency_never_below_its_roofline_floor(model, workload, gpu, parallel):
    assume(tensor_ok(model, parallel.get("tensor", {}).get("degree", 1)))
    assume(model["num_layers"] % parallel.get("pipeline", {}).get("degree", 1) == 0)
    plan = llmpar.evaluate({"model": model,
                            "hardware": {"gpu": gpu, "num_gpus": 2 if parallel else 1,
                                         "intra_node_bandwidth_bytes_per_s": 64e9},
                            "inference": _plain(workload), "parallel": parallel})
    prefill, decode = plan.phases
    for phase in (prefill, decode):
        assert phase.seconds >= phase.floor_seconds > 0
        assert phase.seconds == pytest.approx(phase.compute_seconds + phase.memory_seconds
                                              + phase.communication_seconds, rel=1e-12)
    floor = prefill.floor_seconds + (workload["generated_tokens"] - 1) * decode.floor_seconds
    assert plan.latency_seconds >= floor
    assert plan.prefill_seconds <= plan.latency_seconds


@given(architectures(), workloads(), st.integers(1, 2**17), st.sampled_from(GPUS),
       st.sampled_from([None, 4096, 2**20]),
       st.sampled_from([{}, {"tensor": {"degree": 2}}, {"context": {"degree": 2}}]))
def test_max_prompt_tokens_is_the_edge_of_fitting(model, workload, spec_prompt, gpu,
                                                  positions, parallel):
    """The longest prompt fits and one token more does not (or the positions stop it);
    it does not depend on the spec's own prompt; and prompt + generated at that limit lies
    between the spec's context and max_context_tokens: max_context_tokens keeps the
    workspace of the spec's prefill, so it is the larger when the spec fits (a longer
    prompt's prefill needs more) and the smaller when it does not."""
    assume(tensor_ok(model, parallel.get("tensor", {}).get("degree", 1)))
    if positions is not None:
        model = {**model, "max_position_embeddings": positions}

    def plan(prompt: int) -> llmpar.Plan:
        return llmpar.evaluate({"model": model,
                                "hardware": {"gpu": gpu, "num_gpus": 2 if parallel else 1,
                                             "intra_node_bandwidth_bytes_per_s": 64e9},
                                "inference": _plain({**workload, "prompt_tokens": prompt}),
                                "parallel": parallel})

    generated = workload["generated_tokens"]
    found = plan(spec_prompt)
    pool = found.serving[0]
    longest, context = pool.max_prompt_tokens, found.max_context_tokens
    assert longest is not None and context is not None  # no sliding window: both bind
    by_positions = pool.max_prompt_tokens_limited_by.startswith("model.max_position")
    if by_positions:
        assert positions is not None and longest == max(0, positions - generated)
    if longest > 0:
        at = plan(longest)
        assert at.fits and at.serving[0].max_prompt_tokens == longest
    if not by_positions:
        assert not plan(longest + 1).fits
    asked, reached = spec_prompt + generated, longest + generated
    assert min(asked, context) <= reached <= max(asked, context)
    if positions is None or asked <= positions:
        assert found.fits == (spec_prompt <= longest)


MEASURES = {
    "staircase": lambda steps: lambda n: sum(steps[: min(n, len(steps))]) + max(0, n - len(steps)),
    "straight": lambda steps: lambda n: 7 * n + 3,
    "blocks of 16": lambda steps: lambda n: 16 * ((n + 15) // 16),
    "convex": lambda steps: lambda n: n * n // 5,
    "saturating": lambda steps: lambda n: 1000 * n - 256 * 1000 * (1 - (1 - 1 / 256) ** n),
}


@given(st.lists(st.integers(0, 50), min_size=1, max_size=200), st.integers(-5, 20_000),
       st.booleans(), st.integers(1, 3_000), st.sampled_from(sorted(MEASURES)),
       st.one_of(st.none(), st.integers(-5, 3_100)))
def test_largest_within_finds_what_bisection_finds(steps, target, strict, limit, kind, guess):
    """The interpolating search of the serving limits answers as doubling and bisection do,
    on every kind of non-decreasing measure the limits meet, whatever it is told to try
    first (a closed form's guess, right or wrong)."""
    from llmpar.inference.capacity import largest_fitting, largest_within

    measure = MEASURES[kind](steps)
    fits = ((lambda n: measure(n) < target) if strict else (lambda n: measure(n) <= target))
    assert largest_within(measure, target, limit, strict=strict,
                          guess=guess) == largest_fitting(fits, limit)


@given(architectures(layers_multiple_of=2), workloads(), st.sampled_from(GPUS),
       st.sampled_from([None, 4096, 2**20]),
       st.sampled_from([{}, {"tensor": {"degree": 2}}, {"context": {"degree": 2}},
                        {"pipeline": {"degree": 2}}]),
       st.sampled_from([None, (512, 2), (4096, 6)]))
@settings(max_examples=30)  # each example bisects three limits over up to 2^40
def test_serving_limits_are_what_bisection_finds(model, workload, gpu, positions, parallel,
                                                 window):
    """The largest batch, context and prompt, which try the closed forms of their memory
    first (`llmpar.inference.capacity`), are the largest values whose peak memory fits,
    as doubling and bisection over `peak_memory` find them: with blocks, chunks, prefix
    caching, sliding windows, context ranks and pipeline stages."""
    from llmpar.inference.capacity import (
        SEARCH_LIMIT,
        largest_fitting,
        max_batch_size,
        max_context_tokens,
        max_prompt_tokens,
    )
    from llmpar.inference.evaluate import serving_of
    from llmpar.inference.memory import peak_memory
    from llmpar.loading.checks import resolve_layout

    assume(tensor_ok(model, parallel.get("tensor", {}).get("degree", 1)))
    if positions is not None:
        model = {**model, "max_position_embeddings": positions}
    if window is not None:
        model = {**model, "sliding_window": window[0], "sliding_window_pattern": window[1]}
    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec({"model": model,
                              "hardware": {"gpu": gpu, "num_gpus": 2 if parallel else 1,
                                           "intra_node_bandwidth_bytes_per_s": 64e9},
                              "inference": _plain(workload), "parallel": parallel})
    layout, _ = resolve_layout(spec, session.strategies)
    serving = serving_of(spec, layout, session.strategies)
    capacity = spec.hardware.gpu.usable_bytes
    inference = serving.inference

    def bisected(memory: Any, limit: int = SEARCH_LIMIT) -> int | None:
        return largest_fitting(lambda n: memory(n).total_bytes <= capacity, limit)

    context_limit = positions or SEARCH_LIMIT
    prompt_limit = (positions - inference.generated_tokens if positions is not None
                    else SEARCH_LIMIT)
    assert max_batch_size(serving).value == bisected(
        lambda n: peak_memory(serving, batch=n))
    context = bisected(lambda n: peak_memory(serving, n), context_limit)
    assert max_context_tokens(serving).value == (positions if context is None else context)
    if prompt_limit >= 1:
        prompt = bisected(lambda n: peak_memory(serving, prompt=n), prompt_limit)
        assert max_prompt_tokens(serving).value == (positions and prompt_limit
                                                    if prompt is None else prompt)


ENGINES = (None, "vllm", "sglang", "trt-llm")
NULL_ENGINE = {"name": "null", "version": "0", "source": "adds nothing",
               "step_overhead_seconds": 0.0}
LAYOUTS = ({}, {"tensor": {"degree": 2}}, {"data": {"degree": 2}})


def _serving_spec(model: dict[str, Any], workload: dict[str, Any], gpu: str,
                  parallel: dict[str, Any], **inference: Any) -> dict[str, Any]:
    return {"model": model,
            "hardware": {"gpu": gpu, "num_gpus": 2 if parallel else 1,
                         "intra_node_bandwidth_bytes_per_s": 64e9},
            "inference": _plain({**workload, **inference}), "parallel": parallel}


def _continuous(workload: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in workload.items() if key != "batch_size"}


@given(architectures(), workloads(), st.sampled_from(GPUS), st.sampled_from(LAYOUTS),
       st.sampled_from(ENGINES), st.booleans(), st.integers(1, 256))
def test_tpot_never_below_the_bytes_a_step_moves_nor_its_flops_at_peak(
        model, workload, gpu, parallel, engine, graphs, concurrency):
    """Static or continuous, with any engine: a decode step reads at least its weights and
    KV cache at full HBM bandwidth, and runs its FLOPs at most at the GPU's peak."""
    assume(tensor_ok(model, parallel.get("tensor", {}).get("degree", 1)))
    static = llmpar.evaluate(_serving_spec(model, workload, gpu, parallel, engine=engine,
                                           cuda_graphs=graphs))
    rates = llmpar.load_spec({"model": "gpt2", "hardware": {"gpu": gpu},
                              "inference": {"prompt_tokens": 1, "generated_tokens": 1}}
                             ).hardware.gpu
    bandwidth = rates.hbm_bandwidth_bytes_per_s
    peak = max(rates.peak_flops_per_s(d) or 0.0 for d in ("bf16", "fp16", "fp8", "fp32"))
    decode = static.phases[1]
    assert static.tpot_seconds >= decode.bytes / bandwidth
    assert static.tpot_seconds >= decode.flops / peak
    assert decode.seconds == pytest.approx(decode.compute_seconds + decode.memory_seconds
                                           + decode.communication_seconds
                                           + decode.overhead_seconds, rel=1e-12)
    plan = llmpar.evaluate(_serving_spec(model, _continuous(workload), gpu, parallel,
                                         engine=engine, cuda_graphs=graphs,
                                         concurrency=concurrency))
    state = plan.serving[0].continuous
    assert state is not None and 0 < state.batch_size <= concurrency
    assert state.tpot_seconds >= state.tpot_floor_seconds > 0
    # Throughput under the compute roofline: one GPU's FLOPs of a step at most at peak.
    assert state.flops_per_step / state.tpot_seconds <= peak
    replicas = parallel.get("data", {}).get("degree", 1)
    assert state.tokens_per_second == pytest.approx(
        replicas * state.batch_size / state.tpot_seconds, rel=1e-12)


@given(architectures(), workloads(), st.sampled_from(GPUS), st.sampled_from(ENGINES),
       st.floats(0.05, 20), st.floats(1.05, 4))
def test_ttft_grows_with_the_request_rate(model, workload, gpu, engine, rate, factor):
    """A higher arrival rate never shortens the mean, p90 or p99 time to first token."""
    def state(r: float) -> Any:
        return llmpar.evaluate(_serving_spec(model, _continuous(workload), gpu, {},
                                             engine=engine, request_rate_per_s=r)
                               ).serving[0].continuous

    low, high = state(rate), state(rate * factor)
    assume(high.stable)
    assert low.stable and low.batch_size <= high.batch_size
    for field in ("ttft_seconds", "ttft_p90_seconds", "ttft_p99_seconds", "tpot_seconds"):
        assert getattr(low, field) <= getattr(high, field)


@given(architectures(), workloads(), st.sampled_from(GPUS), st.sampled_from(LAYOUTS),
       st.sampled_from([None, 8, 64]))
def test_without_an_engine_the_plan_is_the_roofline_alone(model, workload, gpu, parallel,
                                                           concurrency):
    """An engine profile that adds nothing gives the numbers of no engine at all."""
    assume(tensor_ok(model, parallel.get("tensor", {}).get("degree", 1)))
    shape = workload if concurrency is None else {**_continuous(workload),
                                                  "concurrency": concurrency}
    plain = llmpar.evaluate(_serving_spec(model, shape, gpu, parallel)).to_dict()
    null = llmpar.evaluate(_serving_spec(model, shape, gpu, parallel,
                                         engine=NULL_ENGINE)).to_dict()

    def numbers(table: Any) -> Any:
        if isinstance(table, dict):
            return {k: numbers(v) for k, v in table.items()
                    if k not in ("engine", "time_trust", "warnings")}
        if isinstance(table, list):
            return [numbers(v) for v in table]
        return table

    assert numbers(null) == numbers(plain)
