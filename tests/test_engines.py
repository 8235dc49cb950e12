"""Serving engine profiles (`[inference] engine`): their constants follow from the kernel
measurements committed under validation/published/kernels/, each mechanism adds what
llmpar.inference.engine says, and without an engine the plan is the roofline alone."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

import llmpar
from llmpar.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "specs" / "examples"
KERNELS = ROOT / "validation" / "published" / "kernels"
SERVING_EXAMPLES = sorted(str(p) for p in EXAMPLES.glob("inference-*.toml"))
LLAMA_70B = str(EXAMPLES / "inference-llama-2-70b-h100.toml")
QWEN_INT4 = str(EXAMPLES / "inference-qwen3-4b-int4-l40s.toml")
H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet: 3.35 TB/s (specs/gpus/h100-sxm.toml)."""
NULL_ENGINE = {"name": "null", "version": "0", "source": "a profile that adds nothing",
               "step_overhead_seconds": 0.0}
"""A profile with no measured kernel, no custom all-reduce and no host time."""


def _engine(name: str) -> dict:
    return tomllib.loads((ROOT / "specs" / "engines" / f"{name}.toml").read_text())


def _without(table, keys=("engine", "overhead_seconds", "time_trust", "warnings")):
    if isinstance(table, dict):
        return {k: _without(v, keys) for k, v in table.items() if k not in keys}
    if isinstance(table, list):
        return [_without(v, keys) for v in table]
    return table


# --- no engine: the roofline alone ---------------------------------------------------------

@pytest.mark.parametrize("example", SERVING_EXAMPLES, ids=lambda p: Path(p).stem)
@pytest.mark.parametrize("batch", [1, 16])
def test_a_profile_that_adds_nothing_leaves_the_plan_as_without_an_engine(example, batch):
    plain = llmpar.evaluate(example, {"inference.batch_size": batch})
    null = llmpar.evaluate(example, {"inference.batch_size": batch,
                                     "inference.engine": NULL_ENGINE})
    assert plain.serving[0].engine is None and null.serving[0].engine == "null 0 (CUDA graphs)"
    assert all(p.overhead_seconds == 0.0 for p in plain.phases)
    assert _without(null.to_dict()) == _without(plain.to_dict())
    assert null.tpot_seconds == plain.tpot_seconds  # exactly, not approximately


# --- constants from kernel measurements ----------------------------------------------------

def test_weight_efficiencies_are_the_measured_gemv_bandwidths():
    table = tomllib.loads((KERNELS / "weight_gemv_h100.toml").read_text())
    for name in ("vllm", "sglang"):
        engine = _engine(name)
        assert engine["weight_memory_efficiency_gpu"] == table["gpu"] == "h100-sxm"
        for kernel in table["kernel"]:
            # m = 1: one multiply-accumulate (2 FLOPs) per weight read once.
            reached = kernel["tflops"] * 1e12 * kernel["bytes_per_weight"] / 2
            efficiency = round(reached / H100_BANDWIDTH, 3)
            assert engine["weight_memory_efficiency"][kernel["weights"]] == efficiency
        # fp8 from another harness: its ratio to bf16 there, times bf16's here.
        for row in table["relative"]:
            ratio = (row["tflops"] * row["bytes_per_weight"]
                     / (row["reference_tflops"] * row["reference_bytes_per_weight"]))
            reference = engine["weight_memory_efficiency"][row["reference_weights"]]
            assert engine["weight_memory_efficiency"][row["weights"]] == round(
                reference * ratio, 3)


def _custom_all_reduce_rows(name: str):
    table = tomllib.loads((KERNELS / "custom_all_reduce_h100.toml").read_text())
    for kernel in table["kernel"]:
        if kernel["name"] == name:
            for size, us in zip(table["bytes"], kernel["microseconds"], strict=True):
                yield kernel["group_size"], size, us * 1e-6


@pytest.mark.parametrize(("engine", "kernel", "worst"), [
    ("vllm", "vllm", 0.21), ("sglang", "trt-llm", 0.28), ("trt-llm", "trt-llm", 0.28)])
def test_custom_all_reduce_is_the_least_squares_fit_of_its_measurements(engine, kernel, worst):
    profile = _engine(engine)["custom_all_reduce"]
    limit = 2 * 2**20
    assert llmpar.load_spec({"model": "llama-2-7b", "hardware": {"gpu": "h100-sxm"},
                             "inference": {"prompt_tokens": 1, "generated_tokens": 1,
                                           "engine": engine}}
                            ).inference.engine.custom_all_reduce.one_shot_max_total_bytes == limit
    rows, measured = [], []
    for n, size, seconds in _custom_all_reduce_rows(kernel):
        one_shot = n * size < limit
        rows.append((1, (n - 1) * size) if one_shot else (2, 2 * (n - 1) / n * size))
        measured.append(seconds)
    (latency, per_byte), *_ = np.linalg.lstsq(np.array(rows, dtype=float),
                                              np.array(measured), rcond=None)
    assert float(profile["latency_seconds"].split()[0]) == pytest.approx(latency * 1e6, abs=0.05)
    assert float(profile["bandwidth_bytes_per_s"].split()[0]) == pytest.approx(
        1 / per_byte / 1e9, abs=0.05)
    predicted = np.array(rows) @ np.array([latency, per_byte])
    assert np.max(np.abs(predicted - measured) / measured) < worst


# --- each mechanism, by hand ---------------------------------------------------------------

def _decode(spec, overrides):
    plan = llmpar.evaluate(spec, overrides)
    return plan, [p for p in plan.phases if p.name == "decode"][0]


def test_vllm_decode_of_llama_2_70b_on_8_h100_by_hand():
    plain, base = _decode(LLAMA_70B, {"inference.batch_size": 1})
    plan, decode = _decode(LLAMA_70B, {"inference.batch_size": 1, "inference.engine": "vllm"})
    assert plan.serving[0].engine == "vllm 0.6.4 (CUDA graphs)"
    # Same bytes; the projections and MLP read at cuBLAS's measured 0.687 of HBM bandwidth
    # instead of the preset's 0.8, the cache through FlashAttention-2's paged kernel (0.766
    # of HBM bandwidth and 16.4 us a call, 80 layers), norms and embedding as before.
    assert decode.bytes == base.bytes and decode.floor_seconds == base.floor_seconds
    weights_and_rest = decode.memory_seconds - 80 * 16.4e-6
    assert weights_and_rest > base.memory_seconds * 0.8 / 0.687 * 0.9
    assert weights_and_rest < base.memory_seconds * 0.8 / 0.687
    # 161 all-reduces of 16 KiB through the custom kernel, one-shot (8 x 16 KiB < 2 MiB),
    # and NCCL's all-gather of the logits unchanged.
    gather = [c for c in plain.serving[0].collectives if c.operation == "all-gather"
              and "decode" in c.reason][0].seconds
    one_shot = 8.4e-6 + 7 * 8192 * 2 / 69.5e9
    assert decode.communication_seconds == pytest.approx(161 * one_shot + gather, rel=1e-9)
    # 4 ms of host time per step and 5.9 us for the one sequence.
    assert decode.overhead_seconds == pytest.approx(4e-3 + 5.9e-6, rel=1e-12)
    assert decode.seconds == pytest.approx(decode.compute_seconds + decode.memory_seconds
                                           + decode.communication_seconds
                                           + decode.overhead_seconds, rel=1e-12)
    assert plan.tpot_seconds == decode.seconds


def test_int4_weights_read_at_the_marlin_kernels_bandwidth():
    # Qwen3-4B int4 on one L40S: no collectives; the weights read at Marlin's 0.372 of HBM
    # bandwidth, measured on an H100 (the plan says so).
    _, base = _decode(QWEN_INT4, {"inference.batch_size": 1})
    quiet = {"preset": "vllm", "step_overhead_seconds": 0,
             "step_overhead_per_sequence_seconds": 0}
    plan, decode = _decode(QWEN_INT4, {"inference.batch_size": 1, "inference.engine": quiet})
    assert decode.overhead_seconds == 0.0 and decode.bytes == base.bytes
    assert 1.5 < decode.memory_seconds / base.memory_seconds < 0.8 / 0.372
    assert any("measured on h100-sxm" in w for w in plan.warnings)


def test_without_cuda_graphs_the_launches_bound_a_small_models_step():
    # GPT-2 (124M) on one H100 at batch 1: 12 layers x 12 kernels x 4.8 us = 0.69 ms of
    # launches outlast its kernels' 0.1 ms, so the step waits for the host.
    base = {"model": "gpt2", "hardware": {"gpu": "h100-sxm"},
            "inference": {"prompt_tokens": 128, "generated_tokens": 128,
                          "engine": {"preset": "vllm", "step_overhead_seconds": 0,
                                     "step_overhead_per_sequence_seconds": 0}}}
    graphs = llmpar.evaluate(base).phases[1]
    eager_spec = {**base, "inference": {**base["inference"], "cuda_graphs": False}}
    eager = llmpar.evaluate(eager_spec).phases[1]
    launches = 12 * 12 * 4.8e-6
    gpu = graphs.seconds
    assert graphs.overhead_seconds == 0.0 and gpu < launches
    assert eager.seconds == pytest.approx(launches, rel=1e-12)
    assert eager.bound == "overhead"
    # A large batch's kernels outlast the launches: eager costs nothing more.
    big = {**eager_spec, "inference": {**eager_spec["inference"], "batch_size": 256}}
    assert llmpar.evaluate(big).phases[1].overhead_seconds == 0.0


def test_no_custom_all_reduce_across_nodes_or_above_its_limit():
    # 16 GPUs in tensor parallel span two nodes: NCCL; prefill's 537 MB buffers are above
    # 8 MiB: NCCL too.
    spec = {"model": "llama-2-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "inference": {"prompt_tokens": 2048, "generated_tokens": 256, "batch_size": 16},
            "parallel": {"tensor": {"degree": 16}}}
    nccl = llmpar.evaluate(spec)
    vllm = llmpar.evaluate({**spec, "inference": {**spec["inference"], "engine": "vllm"}})
    assert vllm.serving[0].collectives == nccl.serving[0].collectives
    prefill = [c for c in llmpar.evaluate(LLAMA_70B, {"inference.engine": "vllm"}
                                          ).serving[0].collectives if "prefill" in c.reason]
    same = [c for c in llmpar.evaluate(LLAMA_70B).serving[0].collectives
            if "prefill" in c.reason]
    assert prefill == same


def test_a_profile_without_step_overhead_is_warned():
    plan = llmpar.evaluate(LLAMA_70B, {"inference.engine": "trt-llm"})
    assert any("states no step_overhead_seconds" in w for w in plan.warnings)
    assert all(p.overhead_seconds == 0.0 for p in plan.phases)


# --- specs, JSON and report ----------------------------------------------------------------

@pytest.mark.parametrize(("value", "path"), [
    ("vlm", "$.inference.engine"),
    (3, "$.inference.engine"),
    ({"preset": "vllm", "weight_memory_efficiency": {"int3": 0.5}},
     "$.inference.engine.weight_memory_efficiency.int3"),
    ({"preset": "vllm", "weight_memory_efficiency": {"int4": 1.5}},
     "$.inference.engine.weight_memory_efficiency.int4"),
    ({"preset": "vllm", "step_overhead_seconds": -1}, "$.inference.engine.step_overhead_seconds"),
    ({"preset": "vllm", "custom_all_reduce": {"latency_seconds": 0}},
     "$.inference.engine.custom_all_reduce.latency_seconds"),
])
def test_bad_engine_input_names_its_key(value, path):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, {"inference.engine": value})
    assert [p.path for p in error.value.problems] == [path]


def test_unknown_engine_suggests_the_preset():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, {"inference.engine": "vlm"})
    assert "did you mean 'vllm'" in error.value.problems[0].message


def test_engine_spec_round_trips():
    spec = llmpar.load_spec(LLAMA_70B, {"inference.engine": "sglang",
                                        "inference.cuda_graphs": False})
    assert llmpar.load_spec(llmpar.dump_spec(spec)) == spec


def test_report_and_json_name_the_engine_profile(capsys):
    assert main(["evaluate", LLAMA_70B, "--set", "inference.engine=vllm"]) == 0
    text = capsys.readouterr().out
    assert "engine profile: vllm 0.6.4 (CUDA graphs)" in text and "engine host" in text
    assert main(["evaluate", LLAMA_70B]) == 0
    assert "engine profile: none" in capsys.readouterr().out
    assert main(["evaluate", LLAMA_70B, "--set", "inference.engine=vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["serving"][0]["engine"] == "vllm 0.6.4 (CUDA graphs)"
    assert data["phases"][1]["overhead_seconds"] > 0
