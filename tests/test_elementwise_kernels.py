"""A serving engine's elementwise kernels of their own between its products: the MLPs'
activation and the FP8 quantization of the block-scaled products' inputs, each a
memory-bound pass a compute-bound product does not hide (llmpar.inference.elementwise).
The step's bytes are those of the operations the kernels run: moving the activation out
of the products moves its bytes, never adds them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.inference.elementwise import activation, quantized_bytes_per_value

ROOT = Path(__file__).resolve().parent.parent
H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet: 3.35 TB/s (specs/gpus/h100-sxm.toml)."""
H100_MEMORY = 0.8
"""specs/gpus/h100-sxm.toml's memory_efficiency, what an operation of no kernel reads at."""
NULL_ENGINE = {"name": "null", "version": "0", "source": "a profile that adds nothing",
               "step_overhead_seconds": 0.0}
# Llama-3-8B (config.json): 32 layers, hidden 4,096, gated MLP of 14,336, 8 KV heads.
LLAMA_8B = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "inference": {"batch_size": 4, "prompt_tokens": 2048, "generated_tokens": 256}}
LAYERS, HIDDEN, FFN = 32, 4096, 14336


def _plan(engine: dict, **inference: object) -> llmpar.Plan:
    return llmpar.evaluate({**LLAMA_8B, "inference": {**LLAMA_8B["inference"], **inference,
                                                      "engine": engine}})


def _profile(name: str) -> dict:
    return tomllib.loads((ROOT / "specs" / "engines" / f"{name}.toml").read_text())


def test_the_activation_of_its_own_costs_its_bytes_in_a_compute_bound_prefill_by_hand():
    # 4 prompts of 2,048 tokens: the MLP's products are compute-bound, so their own reads
    # and writes cost nothing beside the FLOPs; the activation as a kernel of its own
    # reads the gate and up outputs and writes their product, 3 x 14,336 values a token
    # in bf16, at the GPU's memory efficiency.
    fused = _plan(NULL_ENGINE).phases[0]
    separate = _plan({**NULL_ENGINE, "activation_kernel": True}).phases[0]
    tokens = 4 * 2048
    moved = LAYERS * tokens * 3 * FFN * 2
    assert separate.memory_seconds - fused.memory_seconds == pytest.approx(
        moved / (H100_BANDWIDTH * H100_MEMORY), rel=1e-9)
    assert separate.compute_seconds == pytest.approx(fused.compute_seconds, rel=1e-12)
    # the bytes move from the products to the activation: the step's total is the same
    assert separate.bytes == pytest.approx(fused.bytes, rel=1e-12)


def test_a_memory_bound_decode_step_reads_the_same_bytes_at_the_same_share():
    # Decode at batch 4: every operation memory-bound at the GPU's share (a null engine
    # states no weight kernels), so moving the activation out of the products changes
    # neither the bytes nor the time.
    fused = _plan(NULL_ENGINE).phases[1]
    separate = _plan({**NULL_ENGINE, "activation_kernel": True}).phases[1]
    assert fused.compute_seconds == separate.compute_seconds == 0.0
    assert separate.bytes == pytest.approx(fused.bytes, rel=1e-12)
    assert separate.seconds == pytest.approx(fused.seconds, rel=1e-12)


def test_quantizing_the_block_fp8_inputs_reads_16_bits_and_writes_8_and_a_scale_by_hand():
    # FP8 weights in 128 x 128 blocks run the sglang profile's DeepGEMM kernel; with its
    # quantization kernel each product's input is quantized first: per token and layer
    # the QKV input (4,096), the output projection's (32 heads x 128), the gate-up input
    # (4,096) and the down input (14,336), each value 2 bytes read, 1 written and 4 / 128
    # of a scale.
    gemm = _profile("sglang")["block_fp8_gemm"]
    engine = {**NULL_ENGINE, "block_fp8_gemm": gemm}
    fp8 = {"weights": "fp8", "weights_group_size": 16384}
    for phase in (0, 1):
        plain = _plan(engine, **fp8).phases[phase]
        quantized = _plan({**engine, "quantization_kernel": True}, **fp8).phases[phase]
        tokens = 4 * 2048 if phase == 0 else 4
        values = LAYERS * tokens * (HIDDEN + 32 * 128 + HIDDEN + FFN)
        assert quantized.bytes - plain.bytes == pytest.approx(values * (2 + 1 + 4 / 128),
                                                              rel=1e-9)
    # without the block kernel nothing is quantized apart
    assert (_plan({**NULL_ENGINE, "quantization_kernel": True}, **fp8).phases[0].bytes
            == _plan(NULL_ENGINE, **fp8).phases[0].bytes)
    assert quantized_bytes_per_value(2) == 3 + 4 / 128


def test_an_activation_that_quantizes_its_output_writes_it_in_fp8():
    # DeepEP's low-latency decode path: silu_and_mul_masked_post_quant_fwd reads the gate
    # and up outputs in bf16 and writes the down input in FP8 with its scales.
    rows, inner = 10, 2048
    plain = activation("a", rows, 3 * inner, True, 2, "bf16")
    fused = activation("a", rows, 3 * inner, True, 2, "bf16", fused_quantization=True)
    assert plain.bytes == rows * 3 * inner * 2
    assert fused.bytes == rows * (2 * inner * 2 + inner * (1 + 4 / 128))
    ungated = activation("a", rows, 2 * inner, False, 2, "bf16")
    assert ungated.bytes == rows * 2 * inner * 2


def test_deepseek_v3_decode_quantizes_the_routed_experts_in_the_dispatch_and_activation():
    # In decode the routed experts' inputs are quantized inside DeepEP's dispatch and the
    # fused activation: the quantization kernels of their own are the projections' and the
    # shared experts' alone, so a decode step quantizes less than a prefill chunk of its
    # tokens, which also quantizes every (token, expert) pair's down input.
    spec = {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "inference": {"batch_size": 64, "prompt_tokens": 64, "generated_tokens": 2,
                          "weights": "fp8", "weights_group_size": 16384,
                          "prefill_chunk_tokens": 64},
            "parallel": {"expert": {"degree": 16}, "data": {"degree": 16}}}
    gemm = _profile("sglang")["block_fp8_gemm"]

    def phases(**flags: bool) -> tuple[float, float]:
        engine = {**NULL_ENGINE, "block_fp8_gemm": gemm, **flags}
        plan = llmpar.evaluate({**spec, "inference": {**spec["inference"], "engine": engine}})
        return plan.phases[0].bytes, plan.phases[1].bytes

    (p0, d0), (p1, d1) = phases(activation_kernel=True), phases(
        activation_kernel=True, quantization_kernel=True)
    # a 64-token prefill chunk of one prompt and a decode step of 64 sequences process the
    # same 64 tokens; the decode step's quantization moves less
    assert 0 < d1 - d0 < p1 - p0


def test_the_shipped_profiles_state_the_kernels_their_sources_name():
    sglang = _profile("sglang")
    assert sglang["activation_kernel"] and sglang["quantization_kernel"]
    assert sglang["expert_permutation_kernel"]
    assert _profile("vllm")["activation_kernel"] and "quantization_kernel" not in _profile("vllm")
    for name in ("trt-llm", "deepseek-infra"):  # not published: nothing counted
        assert "activation_kernel" not in _profile(name)


def test_a_flag_that_is_not_a_boolean_names_its_key():
    with pytest.raises(llmpar.SpecError) as error:
        _plan({**NULL_ENGINE, "activation_kernel": "often"})
    assert [p.path for p in error.value.problems] == ["$.inference.engine.activation_kernel"]


def test_a_deepep_prefill_permutes_its_routed_tokens_by_hand():
    # DeepSeek-V3 (config.json: hidden 7,168, 8 of 256 experts a token, 58 MoE layers of
    # 61) on 16 GPUs under EP16 behind DeepEP, one 1,024-token prompt a GPU: each GPU
    # computes 1,024 x 8 (token, expert) pairs a layer and receives the distinct tokens
    # among them, pairs x 16 (1 - (15/16)^8) / 8. The scatter reads each received token
    # in FP8 with a 4-byte scale per 128 values and writes a copy per pair; the gather
    # reads each pair's bf16 output and writes each token's sum.
    spec = {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "inference": {"batch_size": 1, "prompt_tokens": 1024, "generated_tokens": 2,
                          "weights": "fp8", "weights_group_size": 16384},
            "parallel": {"expert": {"degree": 16, "dispatcher": "deepep"},
                         "data": {"degree": 16}}}
    engine = {**NULL_ENGINE, "block_fp8_gemm": _profile("sglang")["block_fp8_gemm"]}

    def plan(parallel: dict, **flags: bool) -> llmpar.Plan:
        inference = {**spec["inference"], "engine": {**engine, **flags}}
        return llmpar.evaluate({**spec, "inference": inference, "parallel": parallel})

    deepep = spec["parallel"]
    plain, permuted = plan(deepep), plan(deepep, expert_permutation_kernel=True)
    pairs = 1024 * 8
    received = pairs * 16 * (1 - (15 / 16) ** 8) / 8
    hidden = 7168
    moved = 58 * ((received + pairs) * hidden * (1 + 4 / 128) + (pairs + received) * hidden * 2)
    assert permuted.phases[0].bytes - plain.phases[0].bytes == pytest.approx(moved, rel=1e-9)
    # decode's low-latency dispatch delivers per-expert blocks: nothing permuted
    assert permuted.phases[1].bytes == plain.phases[1].bytes
    # without DeepEP's dispatch the flag does nothing
    nccl = {**deepep, "expert": {"degree": 16}}
    assert (plan(nccl, expert_permutation_kernel=True).phases[0].bytes
            == plan(nccl).phases[0].bytes)
