"""How each headline number of an inference plan was derived (`plan.explain()`)."""

from __future__ import annotations

from llmpar.dtypes import bytes_per_element
from llmpar.inference import continuous, formats, kv_cache, overhead, workspace
from llmpar.inference import speculative as speculative_module
from llmpar.inference.capacity import Limit
from llmpar.inference.formats import quantized_bytes_per_weight
from llmpar.inference.memory import ServingMemory, prefill_peak_shape
from llmpar.inference.overhead import Overhead
from llmpar.inference.phases import PhaseResult, average_decode_context
from llmpar.inference.serving import Serving
from llmpar.inference.speculative import expected_tokens
from llmpar.plan import Derivation
from llmpar.plan_records import ContinuousBatching
from llmpar.roofline import Rates

METRICS_SOURCE = ("NVIDIA NIM LLM benchmarking metrics (docs.nvidia.com/nim/benchmarking/llm): "
                  "TTFT, inter-token latency excluding the first token, e2e latency = TTFT + "
                  "(output tokens - 1) x ITL, output tokens per second")
ROOFLINE_SOURCE = ("roofline per operation (Williams et al. 2009), summed over the layers; "
                   "llmpar.inference.operations")


def memory_derivations(serving: Serving, memory: ServingMemory,
                       allowance: Overhead) -> list[Derivation]:
    spec, inference = serving.spec, serving.inference
    model, t = spec.model, serving.degree("tensor")
    per_token = kv_cache.kv_bytes_per_token(model, inference.kv_cache, t)
    kv_rule = ("batch * sum over the stage's layers of cached_tokens(prompt + generated) * "
               + ("(kv_lora_rank + qk_rope_head_dim) * bytes(kv_cache)" if model.mla is not None
                  else "2 * max(1, num_kv_heads / tensor) * head_dim * bytes(kv_cache)"))
    shape = prefill_peak_shape(serving)
    return [
        Derivation(quantity="weights_bytes", value=memory.weights_bytes, unit="bytes",
                   rule="sum over parameter groups held by the stage of N_g * bytes_g / "
                        "(shards applying to g); quantized formats only in the blocks' "
                        "linear layers, plus one scale (and zero point) per group",
                   source=formats.__doc__.strip().splitlines()[0] + " GPTQ/AWQ layouts",
                   inputs={"weights": inference.weights,
                           "bytes_per_quantized_weight": quantized_bytes_per_weight(inference),
                           "stage": memory.stage}),
        Derivation(quantity="kv_cache_bytes", value=memory.kv_cache_bytes, unit="bytes",
                   rule=kv_rule + "; cached_tokens: the window's tokens at most, / context "
                                  "degree, rounded up to kv_block_tokens",
                   source="DeepSeek-V2 (arXiv:2405.04434) Table 1; PagedAttention (Kwon et al. "
                          "2023, arXiv:2309.06180) blocks",
                   inputs={"batch": inference.batch_size, "tokens": inference.context_tokens,
                           "bytes_per_token_per_layer": per_token,
                           "tensor": t, "context": serving.degree("context"),
                           "pipeline": serving.degree("pipeline")}),
        Derivation(quantity="activations_bytes", value=memory.workspace_bytes, unit="bytes",
                   rule="tokens * (2h + widest block) * bytes(activations) + rows * vocab * 4, "
                        "the larger of the largest prefill step (min(prefill_chunk_tokens, "
                        "batch * prompt) tokens / context, min(batch, tokens) rows) and a "
                        "decode step (batch tokens and rows)",
                   source=workspace.__doc__.strip().splitlines()[0],
                   inputs={"prefill_tokens_per_gpu": shape.tokens, "rows": shape.rows,
                           "block_width": workspace.block_width(model, t)}),
        Derivation(quantity="runtime_overhead_bytes", value=allowance.total_bytes, unit="bytes",
                   rule="CUDA context + NCCL buffers per group + (1 - memory_utilization) * "
                        "memory" + (" (context and buffers from [inference] "
                                    "runtime_overhead_bytes)" if allowance.stated else ""),
                   source=overhead.SOURCE,
                   inputs={"context_bytes": allowance.context_bytes,
                           "communication_bytes": allowance.communication_bytes,
                           "headroom_bytes": allowance.headroom_bytes}),
        Derivation(quantity="total_bytes", value=memory.total_bytes, unit="bytes",
                   rule="weights + kv_cache + workspace + runtime allowance of the peak stage",
                   source="sum of the per-GPU components above",
                   inputs={"capacity_bytes": spec.hardware.gpu.usable_bytes,
                           "peak_stage": memory.stage}),
    ]


def limit_derivations(serving: Serving, batch: Limit, context: Limit,
                      prompt: Limit) -> list[Derivation]:
    inference = serving.inference
    fits = "whose peak-stage total_bytes <= capacity_bytes (doubling, then bisection)"
    source = "llmpar.inference.capacity"
    shape = {"batch": inference.batch_size, "prompt_tokens": inference.prompt_tokens,
             "generated_tokens": inference.generated_tokens}
    return [
        Derivation(quantity="max_batch_size", value=batch.value, unit="sequences",
                   rule=f"the most sequences per replica at the spec's prompt + generated "
                        f"tokens {fits}", source=source,
                   inputs={"limited_by": batch.limited_by, **shape}),
        Derivation(quantity="max_context_tokens", value=context.value, unit="tokens",
                   rule=f"the most tokens per sequence held in the KV cache at the end of "
                        f"generation (prompt + generated), at the spec's batch and with the "
                        f"workspace of the spec's prefill, {fits}; at most "
                        f"max_position_embeddings", source=source,
                   inputs={"limited_by": context.limited_by, **shape}),
        Derivation(quantity="max_prompt_tokens", value=prompt.value, unit="tokens",
                   rule=f"the longest prompt per sequence, at the spec's batch with "
                        f"generated_tokens still to come, {fits}: the KV cache of prompt + "
                        f"generated and the workspace of that prompt's prefill (batch * "
                        f"prompt tokens, or chunks of prefill_chunk_tokens) grow with it; "
                        f"prompt + generated at most max_position_embeddings",
                   source=source, inputs={"limited_by": prompt.limited_by, **shape}),
    ]


def _phase_inputs(result: PhaseResult) -> dict[str, float | int | str]:
    phase = result.phase
    return {"floor_seconds": phase.floor_seconds, "compute_seconds": phase.compute_seconds,
            "memory_seconds": phase.memory_seconds,
            "communication_seconds": phase.communication_seconds, "bound": phase.bound,
            "flops": phase.flops, "bytes": phase.bytes, "steps": phase.steps}


def time_derivations(serving: Serving, prefill: PhaseResult, decode: PhaseResult,
                     rates: Rates) -> list[Derivation]:
    inference = serving.inference
    effs = (f"; efficiencies matmul {rates.matmul_efficiency}, memory "
            f"{rates.memory_efficiency} ({rates.source})")
    rule = ("sum over operations of max(FLOPs / (peak * matmul_efficiency), bytes / "
            "(HBM bandwidth * memory_efficiency)) + exposed communication")
    return [
        Derivation(quantity="prefill_seconds", value=prefill.phase.seconds, unit="s",
                   rule=rule + f", over {prefill.phase.steps} step(s) of the batch's prompts",
                   source=ROOFLINE_SOURCE + effs,
                   inputs={**_phase_inputs(prefill), "prompt_tokens": inference.prompt_tokens,
                           **({"cached_prompt_tokens": inference.cached_prompt_tokens}
                              if inference.cached_prompt_tokens else {})}),
        _tpot_derivation(serving, decode, rule, effs),
    ]


def _tpot_derivation(serving: Serving, decode: PhaseResult, rule: str,
                     effs: str) -> Derivation:
    inputs = {**_phase_inputs(decode), "context_tokens": average_decode_context(serving)}
    speculative = serving.inference.speculative
    if speculative is None:
        return Derivation(quantity="tpot_seconds", value=decode.phase.seconds, unit="s",
                          rule=rule + ", one decode step at the average context prompt + "
                                      "generated / 2",
                          source=ROOFLINE_SOURCE + effs, inputs=inputs)
    tokens = expected_tokens(speculative)
    return Derivation(
        quantity="tpot_seconds", value=decode.phase.seconds, unit="s",
        rule=rule + ", (a verify step of draft_tokens + 1 tokens per sequence + draft_tokens "
                    "steps of the draft head) / expected tokens per step, at the average "
                    "context prompt + generated / 2",
        source=speculative_module.__doc__.strip().splitlines()[0] + "; Leviathan et al. 2023 "
               "(arXiv:2211.17192) Eq. 1; " + ROOFLINE_SOURCE + effs,
        inputs={**inputs, "draft_tokens": speculative.draft_tokens,
                "acceptance_rate": speculative.acceptance_rate,
                "expected_tokens_per_step": tokens})


def rate_derivations(serving: Serving, latency: float, floor: float,
                     per_second: float) -> list[Derivation]:
    inference = serving.inference
    replicas, gpus = serving.degree("data"), serving.spec.hardware.num_gpus
    return [
        Derivation(quantity="latency_seconds", value=latency, unit="s",
                   rule="prefill_seconds + (generated_tokens - 1) * tpot_seconds",
                   source=METRICS_SOURCE,
                   inputs={"generated_tokens": inference.generated_tokens,
                           "latency_floor_seconds": floor}),
        Derivation(quantity="tokens_per_second", value=per_second, unit="tokens/s",
                   rule="replicas * batch * generated_tokens / latency_seconds (one batch "
                        "served start to end; output tokens only)",
                   source=METRICS_SOURCE,
                   inputs={"replicas": replicas, "batch": inference.batch_size}),
        Derivation(quantity="tokens_per_second_per_gpu", value=per_second / gpus,
                   unit="tokens/s", rule="tokens_per_second / num_gpus", source=METRICS_SOURCE,
                   inputs={"num_gpus": gpus}),
        Derivation(quantity="tokens_per_second_per_user",
                   value=inference.generated_tokens / latency, unit="tokens/s",
                   rule="generated_tokens / latency_seconds (a streaming user sees 1 / "
                        "tpot_seconds once the first token is out)",
                   source=METRICS_SOURCE, inputs={}),
    ]


def compute_bound_derivation(serving: Serving, batch: int | None, rates: Rates,
                             matmul_dtype: str) -> Derivation:
    """The decode batch that turns compute-bound, beside the weights-only estimate: the
    projections' intensity 2 * batch / bytes_per_weight reaching the ridge point."""
    ridge = (rates.peak(matmul_dtype) * rates.matmul_efficiency
             / (rates.bandwidth * rates.memory_efficiency))
    weight = quantized_bytes_per_weight(serving.inference)
    return Derivation(
        quantity="decode_compute_bound_batch_size", value=batch, unit="sequences",
        rule="smallest batch with decode compute_seconds >= memory_seconds (None: the KV "
             "cache reads grow with the batch as fast as the FLOPs); weights alone turn "
             "compute-bound at ridge * bytes_per_weight / 2",
        source="roofline ridge point, Williams et al. 2009; llmpar.inference.phases",
        inputs={"ridge_flops_per_byte": ridge, "bytes_per_weight": weight,
                "weights_only_batch": ridge * weight / 2,
                "activation_bytes": bytes_per_element(serving.spec.precision.activations)})


def continuous_derivations(serving: Serving, state: ContinuousBatching) -> list[Derivation]:
    """The steady state under continuous batching (`llmpar.inference.continuous`)."""
    inference = serving.inference
    source = continuous.__doc__.strip().splitlines()[0]
    shape = {"prompt_tokens": inference.prompt_tokens,
             "generated_tokens": inference.generated_tokens,
             "replicas": serving.degree("data")}
    return [
        Derivation(quantity="continuous.batch_size", value=state.batch_size, unit="sequences",
                   rule="concurrency / replicas, or B = rate / replicas x (prefill steps + "
                        "generated - 1) x step(B) (Little's law), at most the batch limit",
                   source="Little 1961, L = lambda W; " + source,
                   inputs={**shape, "batch_limit": state.batch_limit or 0.0,
                           "limited_by": state.batch_limited_by}),
        Derivation(quantity="continuous.tpot_seconds", value=state.tpot_seconds, unit="s",
                   rule="one step of batch decode tokens and batch x prompt / generated "
                        "prefill tokens: sum of operation rooflines + exposed communication "
                        "+ engine host time",
                   source="chunked prefill mixed into decode steps (Sarathi-Serve, "
                          "arXiv:2403.02310); " + ROOFLINE_SOURCE,
                   inputs={"prefill_tokens_per_step": state.prefill_tokens_per_step,
                           "floor_seconds": state.tpot_floor_seconds,
                           "token_budget": state.token_budget or 0}),
        Derivation(quantity="continuous.ttft_seconds", value=state.ttft_seconds, unit="s",
                   rule="mean wait + prefill steps x step of the batch and the prompt's chunk",
                   source=state.queueing_model,
                   inputs={"queue_seconds": state.queue_seconds or 0.0,
                           "prefill_steps": state.prefill_steps_per_request,
                           "utilization": state.prefill_utilization or 0.0,
                           "p90_seconds": state.ttft_p90_seconds or 0.0,
                           "p99_seconds": state.ttft_p99_seconds or 0.0}),
        Derivation(quantity="continuous.tokens_per_second", value=state.tokens_per_second,
                   unit="tokens/s", rule="replicas x batch / tpot_seconds (output tokens)",
                   source=METRICS_SOURCE,
                   inputs={"per_gpu": state.tokens_per_second_per_gpu,
                           "per_user": state.tokens_per_second_per_user,
                           "max_request_rate_per_s": state.max_request_rate_per_s}),
    ]
