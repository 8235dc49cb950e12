"""Inference plans: KV cache, weights, memory limits and roofline times, against formulas
worked out by hand from the papers and datasheets the modules cite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
LLAMA_70B = str(EXAMPLES / "inference-llama-2-70b-h100.toml")
DEEPSEEK = str(EXAMPLES / "inference-deepseek-v3-h200.toml")
QWEN_INT4 = str(EXAMPLES / "inference-qwen3-4b-int4-l40s.toml")

H100_BANDWIDTH = 3.35e12
"""H100 SXM5 datasheet: 3.35 TB/s."""
NVLINK_ONE_WAY = 450e9
"""DGX H100: 900 GB/s NVLink per GPU, both directions."""


def serve(model="llama-2-70b", cluster="dgx-h100", num_gpus=8, parallel=None, **inference):
    workload = {"batch_size": 1, "prompt_tokens": 2048, "generated_tokens": 256, **inference}
    return llmpar.evaluate({"model": model, "hardware": {"cluster": cluster,
                                                         "num_gpus": num_gpus},
                            "inference": workload, "parallel": parallel or {}})


# --- KV cache: 2 * layers * kv_heads * head_dim * bytes * batch * tokens ------------------

@pytest.mark.parametrize(("tensor", "kv_heads_per_gpu"), [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_gqa_cache_of_llama_2_70b_split_by_tensor_degree(tensor, kv_heads_per_gpu):
    # Llama-2-70B: 80 layers, 8 KV heads of 128; past t = 8 each rank keeps one KV head.
    plan = serve(num_gpus=tensor, parallel={"tensor": {"degree": tensor}}, batch_size=16)
    assert plan.kv_cache_bytes == 2 * 80 * kv_heads_per_gpu * 128 * 2 * 16 * (2048 + 256)


def test_gqa_cache_split_by_pipeline_and_context():
    plan = serve(num_gpus=8, batch_size=4, parallel={"tensor": {"degree": 2},
                                                     "pipeline": {"degree": 2},
                                                     "context": {"degree": 2}})
    # 40 layers per stage, 4 KV heads per tensor rank, 2304 / 2 tokens per context rank.
    assert plan.kv_cache_bytes == 2 * 40 * 4 * 128 * 2 * 4 * (2304 // 2)


def test_fp8_cache_and_paged_blocks_round_up():
    plan = serve(num_gpus=8, parallel={"tensor": {"degree": 8}}, kv_cache="fp8",
                 prompt_tokens=1000, generated_tokens=10, kv_block_tokens=16)
    assert plan.kv_cache_bytes == 2 * 80 * 1 * 128 * 1 * 1 * 1024  # 1010 -> 64 blocks of 16


def test_mqa_cache_keeps_one_head():
    model = {"preset": "llama-2-7b", "num_kv_heads": 1}
    plan = serve(model=model, num_gpus=1, batch_size=2, prompt_tokens=100, generated_tokens=28)
    assert plan.kv_cache_bytes == 2 * 32 * 1 * 128 * 2 * 2 * 128


def test_mla_cache_of_deepseek_v3_is_the_latent_and_the_rope_key():
    # DeepSeek-V2 Table 1: (d_c + d_h^R) per token and layer, shared by all heads, so
    # tensor parallelism copies it: 61 x (512 + 64) x 2 bytes per token on every rank.
    plan = serve(model="deepseek-v3", cluster="dgx-h200", num_gpus=16, weights="fp8",
                 batch_size=8, prompt_tokens=4000, generated_tokens=96,
                 parallel={"tensor": {"degree": 8}})
    assert plan.kv_cache_bytes == 61 * (512 + 64) * 2 * 8 * 4096
    example = llmpar.evaluate(DEEPSEEK)
    assert example.kv_cache_bytes == 61 * 576 * 2 * 32 * (4096 + 512)


def test_sliding_window_layers_keep_the_window():
    # Gemma 2: every other layer (21 of 42) attends within 4096 tokens; 8 KV heads of 256.
    plan = serve(model="gemma-2-9b", num_gpus=1, prompt_tokens=6000, generated_tokens=144)
    assert plan.kv_cache_bytes == 2 * 8 * 256 * 2 * (21 * 6144 + 21 * 4096)
    whole = serve(model="gemma-2-9b", num_gpus=1, prompt_tokens=6000, generated_tokens=144,
                  sliding_window=False)
    assert whole.kv_cache_bytes == 2 * 42 * 8 * 256 * 2 * 6144


# --- weights under the layout ------------------------------------------------------------

def test_llama_2_70b_weights_split_eight_ways_but_norms():
    plan = llmpar.evaluate(LLAMA_70B)
    norms = plan.parameters_by_group["norms"]
    assert plan.weights_bytes == (plan.parameters - norms) * 2 // 8 + norms * 2


def test_int4_weights_carry_group_scales_and_keep_embeddings_16_bit():
    plan = llmpar.evaluate(QWEN_INT4)
    groups = plan.parameters_by_group
    quantized = groups["attention"] + groups["mlp"]
    per_weight = 0.5 + (2 + 0.5) / 128  # int4 + fp16 scale + 4-bit zero per 128 weights
    expected = quantized * per_weight + (groups["embedding"] + groups["norms"]) * 2
    assert plan.weights_bytes == round(expected)


def test_expert_parallel_splits_routed_experts():
    plan = llmpar.evaluate(DEEPSEEK)
    groups = plan.parameters_by_group
    block = 1 + 4 / 16384  # fp8 and one fp32 scale per 128 x 128 block
    linear = groups["attention"] + groups["mlp"] + groups["shared_experts"]
    expected = (groups["experts"] / 16 * block + linear * block
                + (groups["embedding"] + groups["head"] + groups["norms"]
                   + groups["router"]) * 2)
    assert plan.weights_bytes == pytest.approx(expected, abs=1)


# --- memory limits -------------------------------------------------------------------------

def test_max_batch_size_is_the_edge_of_fitting():
    plan = llmpar.evaluate(LLAMA_70B)
    assert plan.max_batch_size == 283
    assert llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 283}).fits
    assert not llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 284}).fits
    assert plan.max_batch_size_limited_by.startswith("workspace")


def test_max_context_tokens_by_memory_and_by_positions():
    # Qwen3-4B: 36 layers x 8 KV heads x 128 x 2 x 2 bytes = 147,456 bytes a token for all
    # layers, 8 sequences, in blocks of 16 tokens, into what weights, workspace and the
    # runtime allowance leave.
    qwen = llmpar.evaluate(QWEN_INT4)
    free = (qwen.capacity_bytes - qwen.weights_bytes - qwen.activations_bytes
            - qwen.runtime_overhead_bytes)
    assert qwen.max_context_tokens == free // (8 * 147_456 * 16) * 16
    assert qwen.max_context_tokens_limited_by.startswith("kv_cache")
    llama = llmpar.evaluate(LLAMA_70B)
    assert llama.max_context_tokens == 4096
    assert "max_position_embeddings" in llama.max_context_tokens_limited_by


def _qwen_example_bytes(prompt: int) -> int:
    """What the Qwen3-4B int4 example needs with prompts of `prompt` tokens, by hand:
    8 sequences of prompt + 512 tokens in blocks of 16 at 147,456 bytes a token, and the
    prefill of 8 x prompt tokens in one step at (2 x 2560 + 3 x 9728) x 2 bytes a token
    beside 8 fp32 rows of the 151,936-token vocabulary; weights and allowance as the plan
    has them (checked below; 5,904,321,741 = 1 GiB + 10% of the 46,068 MiB an L40S reports)."""
    kv = 147_456 * 8 * -(-(prompt + 512) // 16) * 16
    workspace = 8 * max(prompt, 1) * (2 * 2560 + 3 * 9728) * 2 + 8 * 151_936 * 4
    return 2_665_911_988 + 5_904_321_741 + kv + workspace


def test_max_prompt_tokens_of_the_qwen_example_is_the_edge_of_fitting():
    plan = llmpar.evaluate(QWEN_INT4)
    pool = plan.serving[0]
    assert (plan.weights_bytes, plan.runtime_overhead_bytes) == (2_665_911_988,
                                                                 5_904_321_741)
    assert plan.total_bytes == _qwen_example_bytes(1024)
    assert pool.max_prompt_tokens == 22_627
    assert _qwen_example_bytes(22_627) <= 46_068 * 2**20 < _qwen_example_bytes(22_628)
    assert pool.max_prompt_tokens_limited_by.startswith("kv_cache: at 22,627-token prompts")
    assert "12.42 GB" in pool.max_prompt_tokens_limited_by  # the prefill's workspace
    for prompt, fits in ((22_627, True), (22_628, False)):
        at = llmpar.evaluate(QWEN_INT4, {"inference.prompt_tokens": prompt})
        assert (at.total_bytes, at.fits) == (_qwen_example_bytes(prompt), fits)
    # max_context_tokens counts generated tokens: as a prompt, its 32,688 + 512 tokens need
    # 65.7 GB, the prefill of 8 x 32,688 tokens included.
    assert plan.max_context_tokens == 33_200
    assert round(_qwen_example_bytes(33_200 - 512) / 1e8) == 657
    comments = Path(QWEN_INT4).read_text()
    assert "33,200 tokens" in comments and "22,627 tokens" in comments


def test_max_prompt_tokens_does_not_depend_on_the_spec_prompt_but_max_context_does():
    # A spec whose own prompt does not fit: its prefill's workspace leaves less room for the
    # cache, so max_context_tokens shrinks below max_prompt_tokens + generated_tokens.
    long = llmpar.evaluate(QWEN_INT4, {"inference.prompt_tokens": 32_448})
    assert not long.fits and long.serving[0].max_prompt_tokens == 22_627
    assert long.max_context_tokens < 22_627 + 512 < 32_448 + 512
    short = llmpar.evaluate(QWEN_INT4)
    assert short.max_context_tokens > 22_627 + 512


def test_max_prompt_tokens_by_positions():
    llama = llmpar.evaluate(LLAMA_70B).serving[0]
    assert llama.max_prompt_tokens == 4096 - 256
    assert llama.max_prompt_tokens_limited_by == ("model.max_position_embeddings (4,096) "
                                                  "less generated_tokens (256)")
    none_left = llmpar.evaluate(LLAMA_70B, {"inference.generated_tokens": 4096}).serving[0]
    assert none_left.max_prompt_tokens == 0
    assert "no position for a prompt" in none_left.max_prompt_tokens_limited_by


def test_weights_alone_too_large_leave_no_batch():
    plan = serve(num_gpus=1, parallel={})
    assert plan.max_batch_size == 0 and not plan.fits
    assert "leave no room" in plan.max_batch_size_limited_by
    assert plan.serving[0].max_prompt_tokens == 0
    assert plan.serving[0].max_prompt_tokens_limited_by.startswith("a 1-token prompt needs")


@pytest.mark.parametrize("example", [LLAMA_70B, DEEPSEEK, QWEN_INT4],
                         ids=["llama-2-70b", "deepseek-v3", "qwen3-4b-int4"])
def test_shipped_examples_prompt_limit_lies_within_the_context_limit(example):
    # Each example fits, so its prompt is within max_prompt_tokens, and that prompt with
    # the generated tokens after it is within max_context_tokens (which keeps the example's
    # own, shorter prefill); DeepSeek's prefill is chunked, its steps whole chunks.
    plan = llmpar.evaluate(example)
    longest = plan.serving[0].max_prompt_tokens
    generated = llmpar.load_spec(example).inference.generated_tokens
    assert plan.fits and plan.sequence_length - generated <= longest
    assert longest + generated <= plan.max_context_tokens
    assert llmpar.evaluate(example, {"inference.prompt_tokens": longest}).fits


def test_runtime_allowance_is_stated():
    plan = llmpar.evaluate(LLAMA_70B)
    # 1 GiB context + 256 MiB NCCL buffers (tensor group) + 10% of the 81,559 MiB an
    # H100 reports, as headroom.
    assert plan.runtime_overhead_bytes == 2**30 + 2**28 + round(0.1 * 81_559 * 2**20)
    assert plan.buffers_bytes == plan.runtime_overhead_bytes
    assert plan.total_bytes == (plan.weights_bytes + plan.kv_cache_bytes
                                + plan.activations_bytes + plan.buffers_bytes)


# --- time ----------------------------------------------------------------------------------

def _tensor_all_reduce_seconds(buffer_bytes, n=8):
    return 2 * (n - 1) / n * buffer_bytes / (NVLINK_ONE_WAY * 0.8) + 2 * (n - 1) * 2e-6


def _all_gather_seconds(buffer_bytes, n=8):
    return (n - 1) / n * buffer_bytes / (NVLINK_ONE_WAY * 0.8) + (n - 1) * 2e-6


def test_70b_decode_at_batch_1_on_8_h100_is_memory_bound_above_its_floor():
    plan = llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 1})
    decode = plan.phases[1]
    assert decode.name == "decode" and decode.bound == "memory"
    # Bytes: the weights but the embedding table (only a row is read) and the cache of 80
    # layers at the average context 2048 + 256 / 2 = 2176 tokens, 512 bytes a token; the
    # rest (0.12%) is one token's activations read and written.
    embedding_table = 32000 * 8192 * 2 // 8
    moved = plan.weights_bytes - embedding_table + 80 * 2176 * 512
    assert decode.bytes == pytest.approx(moved, rel=2e-3)
    assert decode.floor_seconds == pytest.approx(decode.bytes / H100_BANDWIDTH, rel=1e-9)
    assert decode.floor_seconds == pytest.approx(5.161e-3, rel=1e-3)
    # 161 latency-bound all-reduces of one token's hidden state (16 kB) and a logits gather.
    communication = 161 * _tensor_all_reduce_seconds(8192 * 2) + _all_gather_seconds(32000 * 2)
    assert decode.communication_seconds == pytest.approx(communication, rel=1e-9)
    assert decode.compute_seconds == 0.0
    assert plan.tpot_seconds == pytest.approx(decode.floor_seconds / 0.8 + communication,
                                              rel=1e-9)
    assert plan.tpot_seconds == pytest.approx(10.99e-3, rel=1e-3)
    assert decode.floor_seconds < plan.tpot_seconds < 2.2 * decode.floor_seconds


def test_70b_example_phases_and_rates():
    plan = llmpar.evaluate(LLAMA_70B)
    prefill, decode = plan.phases
    assert (prefill.bound, decode.bound) == ("compute", "memory")
    assert plan.prefill_seconds == prefill.seconds
    assert plan.latency_seconds == pytest.approx(plan.prefill_seconds
                                                 + 255 * plan.tpot_seconds, rel=1e-12)
    assert plan.tokens_per_second == pytest.approx(16 * 256 / plan.latency_seconds, rel=1e-12)
    assert plan.tokens_per_second_per_gpu == pytest.approx(plan.tokens_per_second / 8)
    assert plan.tokens_per_second_per_user == pytest.approx(256 / plan.latency_seconds)
    # Prefill FLOPs: 2 x matrix weights per token / 8, plus causal attention pairs.
    layer_weights = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    pairs = 16 * 2048 * 2049 / 2
    flops = (2 * 16 * 2048 * 80 * layer_weights / 8 + 80 * pairs * 2 * 8 * 256
             + 2 * 16 * 8192 * 32000 / 8)
    assert prefill.flops == pytest.approx(flops, rel=1e-12)
    assert prefill.seconds >= prefill.floor_seconds


def test_decode_turns_compute_bound_for_a_short_context():
    # Qwen3-4B in bf16 on one H100 with 128 + 128 tokens: the weights dominate, and at
    # the ridge point (989.4e12 x 0.68 / (3.35e12 x 0.8) = 251 FLOPs a byte, 2 bytes a
    # weight) decode turns compute-bound; a 2K context's cache reads keep it memory-bound.
    short = serve(model="qwen3-4b", cluster="dgx-h100", num_gpus=1, prompt_tokens=128,
                  generated_tokens=128)
    batch = short.decode_compute_bound_batch_size
    assert batch is not None and 251 < batch < 400
    at = serve(model="qwen3-4b", cluster="dgx-h100", num_gpus=1, prompt_tokens=128,
               generated_tokens=128, batch_size=batch).phases[1]
    below = serve(model="qwen3-4b", cluster="dgx-h100", num_gpus=1, prompt_tokens=128,
                  generated_tokens=128, batch_size=batch - 1).phases[1]
    assert at.compute_seconds >= at.memory_seconds
    assert below.compute_seconds < below.memory_seconds
    assert llmpar.evaluate(LLAMA_70B).decode_compute_bound_batch_size is None


def test_moe_decode_turns_compute_bound_where_the_operations_say():
    # DeepSeek-V3: the experts a step reads grow along a curve in the batch (uniform
    # routing), so the search's straight lines hold for the other pieces alone; the
    # batch it finds is where the decode phase itself turns compute bound.
    batch = llmpar.evaluate(DEEPSEEK).decode_compute_bound_batch_size
    assert batch is not None and batch > 1
    at, below = (llmpar.evaluate(DEEPSEEK, {"inference.batch_size": b}).phases[1]
                 for b in (batch, batch - 1))
    assert at.compute_seconds >= at.memory_seconds
    assert below.compute_seconds < below.memory_seconds


def test_compute_bound_search_agrees_with_the_search_on_every_operation():
    # The guess from the straight pieces is confirmed on every operation: the answer is
    # the plain search's over the whole step's operations at each batch it tries.
    from llmpar.inference import phases
    from llmpar.inference.capacity import largest_within
    from llmpar.inference.evaluate import serving_of
    from llmpar.inference.operations import counted_pieces
    from llmpar.loading.checks import resolve_layout
    from llmpar.roofline import rates_of

    session = llmpar.Session(load_entry_points=False)
    for path in (DEEPSEEK, LLAMA_70B, QWEN_INT4):
        spec = session.load_spec(path)
        layout, _ = resolve_layout(spec, session.strategies)
        serving = serving_of(spec, layout, session.strategies)
        rates = rates_of(spec.hardware.gpu)
        pieces = counted_pieces(serving)

        def lead(batch, serving=serving, rates=rates, pieces=pieces):
            parts = phases._piece_parts(serving, rates, batch, pieces)
            return phases._compute_lead([part for piece in parts for part in piece])

        below = largest_within(lead, 0.0, phases.COMPUTE_BOUND_SEARCH_LIMIT, strict=True)
        assert phases.compute_bound_batch(serving, rates) == (
            None if below is None else below + 1)
        assert session.evaluate(spec).decode_compute_bound_batch_size == (
            None if below is None else below + 1)


def test_chunked_prefill_takes_steps_and_less_workspace():
    whole = llmpar.evaluate(LLAMA_70B)
    chunked = llmpar.evaluate(LLAMA_70B, {"inference.prefill_chunk_tokens": 8192})
    assert chunked.phases[0].steps == 4
    assert chunked.activations_bytes < whole.activations_bytes / 3
    assert chunked.prefill_seconds > whole.prefill_seconds  # weights read four times


def test_chunked_prefill_workspace_is_a_whole_chunk():
    # 16 prompts of 2048 in chunks of 10,000: four steps of 8,192 tokens on average, but
    # three of them hold 10,000; Llama-2-70B under TP8 keeps 2 x 8192 + 3 x 28672 / 8
    # elements a token, and each step samples up to one row per sequence.
    plan = llmpar.evaluate(LLAMA_70B, {"inference.prefill_chunk_tokens": 10_000})
    assert plan.phases[0].steps == 4
    assert plan.activations_bytes == 10_000 * (2 * 8192 + 3 * 28672 // 8) * 2 + 16 * 32_000 * 4


def test_deepseek_example_prefill_and_decode():
    plan = llmpar.evaluate(DEEPSEEK)
    assert plan.layout == {"data": 16, "expert": 16}
    assert plan.fits and plan.phases[0].steps == 8
    assert all(p.seconds >= p.floor_seconds for p in plan.phases)
    assert plan.tokens_per_second == pytest.approx(16 * 32 * 512 / plan.latency_seconds)


def test_every_headline_number_is_explained():
    plan = llmpar.evaluate(LLAMA_70B)
    for quantity in ("weights_bytes", "kv_cache_bytes", "activations_bytes",
                     "runtime_overhead_bytes", "total_bytes", "max_batch_size",
                     "max_context_tokens", "prefill_seconds", "tpot_seconds",
                     "latency_seconds", "tokens_per_second", "tokens_per_second_per_gpu",
                     "tokens_per_second_per_user", "decode_compute_bound_batch_size"):
        derivation = plan.derivation(quantity)
        assert derivation.source and derivation.rule
        assert derivation.value == getattr(plan, quantity)
    # Fields added since schema 1 live only in the serving pool.
    assert plan.derivation("max_prompt_tokens").value == plan.serving[0].max_prompt_tokens
    assert "floor_seconds" in plan.explain("tpot_seconds")


# --- specs, JSON and the command -----------------------------------------------------------

def test_training_and_inference_together_is_an_error():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate({"model": "llama-2-7b", "hardware": {"gpu": "h100-sxm"},
                         "training": {}, "inference": {"prompt_tokens": 1,
                                                       "generated_tokens": 1}})
    assert [p.path for p in error.value.problems] == ["$.inference"]


@pytest.mark.parametrize(("key", "value", "path"), [
    ("inference.batch_size", 0, "$.inference.batch_size"),
    ("inference.weights", "int3", "$.inference.weights"),
    ("inference.kv_cache", "int4", "$.inference.kv_cache"),
    ("inference.sliding_window", True, "$.inference.sliding_window"),
    ("parallel.data.zero", 3, "$.parallel.data.zero"),
])
def test_bad_inference_input_names_its_key(key, value, path):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, {key: value})
    assert path in [p.path for p in error.value.problems]


def test_missing_workload_fields_are_named():
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate({"model": "llama-2-7b", "hardware": {"gpu": "h100-sxm"},
                         "inference": {"batch_size": 2}})
    paths = {p.path for p in error.value.problems}
    assert paths == {"$.inference.prompt_tokens", "$.inference.generated_tokens"}


def test_inference_spec_round_trips():
    spec = llmpar.load_spec(DEEPSEEK)
    assert llmpar.load_spec(llmpar.dump_spec(spec)) == spec
    assert llmpar.evaluate(spec, {"inference.batch_size": 2}).micro_batch_size == 2


def test_training_plans_leave_inference_fields_empty():
    plan = llmpar.evaluate(str(EXAMPLES / "adam-memory-7b.toml"))
    assert plan.workload == "training" and plan.kv_cache_bytes is None and plan.phases == ()


@pytest.mark.parametrize("example", [LLAMA_70B, DEEPSEEK, QWEN_INT4])
def test_cli_evaluates_the_shipped_examples(example, capsys):
    assert main(["evaluate", example, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == "inference" and data["fits"] is True
    assert [phase["name"] for phase in data["phases"]] == ["prefill", "decode"]
    assert data["latency_seconds"] > data["prefill_seconds"] > 0


def test_expert_ranks_folded_into_the_tensor_ranks_share_its_tokens():
    # Mixtral-8x7B on 4 H100, TP4. Folding EP4 into the tensor ranks (expert tensor degree
    # 1) keeps two whole experts on each GPU instead of a quarter of all eight: in
    # expectation a decode step reads the same expert bytes, and its four ranks route the
    # batch's tokens once, not four times.
    base = {"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
            "inference": {"batch_size": 4, "prompt_tokens": 1024, "generated_tokens": 256}}
    split = llmpar.evaluate({**base, "parallel": {"tensor": {"degree": 4}}})
    folded = llmpar.evaluate({**base, "parallel": {
        "tensor": {"degree": 4}, "sequence": {},
        "expert": {"degree": 4, "tensor_degree": 1}}})
    for phase in ("prefill", "decode"):
        a, b = ([p for p in plan.serving[0].phases if p.name == phase][0]
                for plan in (split, folded))
        assert b.flops == pytest.approx(a.flops)
    decode = [[p for p in plan.serving[0].phases if p.name == "decode"][0].bytes
              for plan in (split, folded)]
    assert decode[1] == pytest.approx(decode[0], rel=1e-3)


def test_folded_expert_ranks_read_the_experts_the_batch_picks_not_e_times_more():
    # The EP-on-TP token count (issue: TP4 + EP4 counted each rank's tokens as distinct).
    # Mixtral-8x7B, batch 4, one decode step: 4 tokens each pick 2 of 8 experts; under
    # uniform routing a given expert is picked by some token with probability
    # 1 - (6/8)^4 (Switch Transformer, arXiv:2101.03961, Sec. 2.2), not 1 - (6/8)^16.
    from llmpar.inference.evaluate import serving_of
    from llmpar.inference.operations import step_ops
    from llmpar.inference.phases import decode_step
    from llmpar.loading.checks import resolve_layout

    session = llmpar.Session()
    expert_bytes = 3 * 4096 * 14336 * 2  # gate, up and down of one expert, bf16
    touched = 1 - (6 / 8) ** 4
    for parallel, held in (({"tensor": {"degree": 4}}, 8 / 4),
                           ({"tensor": {"degree": 4}, "sequence": {},
                             "expert": {"degree": 4, "tensor_degree": 1}}, 2)):
        spec = llmpar.load_spec({"model": "mixtral-8x7b",
                                 "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
                                 "inference": {"batch_size": 4, "prompt_tokens": 1024,
                                               "generated_tokens": 256},
                                 "parallel": parallel})
        layout, _ = resolve_layout(spec, session.strategies)
        serving = serving_of(spec, layout, session.strategies)
        routed = [op for op in step_ops(serving, decode_step(serving))
                  if op.name == "routed experts"][0]
        # `held` whole experts' worth per GPU: all 8 split four ways, or 2 whole ones.
        weights = 32 * held * touched * expert_bytes
        assert routed.bytes == pytest.approx(weights, rel=2e-3)
        assert 15.1e9 < routed.bytes < 15.5e9
