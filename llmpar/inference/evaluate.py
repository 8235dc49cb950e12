"""The Plan of an `[inference]` spec: memory per GPU, the largest batch, context and
prompt that fit, prefill and decode times, throughput, and the derivation of each."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.deferred import deferred
from llmpar.evaluation.evaluate import strategy_notes, transforms_of
from llmpar.evaluation.stages import stages_of
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.parameters import count_parameters
from llmpar.inference import derivations as d
from llmpar.inference.capacity import (
    Limit,
    max_batch_size,
    max_context_tokens,
    max_prompt_tokens,
)
from llmpar.inference.communication import step_collectives, unknown_links
from llmpar.inference.continuous import continuous_batching, token_budget
from llmpar.inference.engine import ENGINE_TRUST, engine_label, engine_warnings
from llmpar.inference.formats import expert_matmul_dtype, format_warnings, matmul_dtype
from llmpar.inference.memory import ServingMemory, fixed_parts, peak_memory
from llmpar.inference.operations import (
    count_layer_kinds,
    operation_constants,
    weights_by_group,
)
from llmpar.inference.overhead import runtime_overhead
from llmpar.inference.phases import (
    PhaseResult,
    compute_bound_batch,
    decode,
    decode_step,
    prefill,
    prefill_step,
)
from llmpar.inference.serving import Serving
from llmpar.inference.speculative import draft_spec
from llmpar.plan import Derivation, Plan, ServingPool
from llmpar.positions import SERVED_POSITIONS, position_limit_warning
from llmpar.roofline import DEFAULT_SOURCE, Rates, rates_of
from llmpar.spec import Spec
from llmpar.strategy import Layout
from llmpar.trust import SERVING_TRUST

if TYPE_CHECKING:
    from llmpar.evaluation.cache import EvaluationCache
    from llmpar.strategy import Strategy

WARNED_STRATEGIES = ("tensor", "expert")
"""Strategies whose warnings hold for serving (the others' concern training steps)."""


def serving_of(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy[Any]],
               cache: EvaluationCache | None = None) -> Serving:
    """The spec, its layout, the unsplit parameters (kept by a session's `cache` by the
    model) and the strategies' shards and stages."""
    footprint = Footprint(parameters=(count_parameters(spec.model) if cache is None
                                      else cache.parameters(spec.model)),
                          forward_flops_per_sequence=None, activations=None,
                          activations_unavailable="serving keeps no activations for backward")
    transforms = tuple(transforms_of(spec, footprint, layout, strategies))
    serving = Serving(spec=spec, layout=layout, footprint=footprint, transforms=transforms,
                      stages=stages_of(spec, transforms), strategies=strategies)
    serving = attrs.evolve(serving, weights_by_group=weights_by_group(serving),
                           layer_counts=count_layer_kinds(serving))
    serving = attrs.evolve(serving, constants=operation_constants(serving))
    if serving.inference.speculative is not None:  # the draft head, a model of its own
        serving = attrs.evolve(serving, draft=serving_of(*draft_spec(spec, layout),
                                                         strategies, cache))
    return attrs.evolve(serving, fixed=fixed_parts(serving))


def untimed(serving: Serving) -> str | None:
    """Why the GPU's numbers cannot time the phases, or None when they can."""
    spec = serving.spec
    gpu = spec.hardware.gpu
    if gpu.hbm_bandwidth_bytes_per_s is None:
        return f"GPU {gpu.name!r} states no hbm_bandwidth_bytes_per_s; no prefill or decode time"
    dtypes = {matmul_dtype(serving.inference, spec.precision.activations, gpu),
              spec.precision.activations}
    if serving.inference.expert_weights is not None:
        dtypes.add(expert_matmul_dtype(serving.inference, spec.precision.activations, gpu))
    for dtype in dtypes:
        if gpu.peak_flops_per_s(dtype) is None:
            return f"GPU {gpu.name!r} states no {dtype} peak; no prefill or decode time"
    return None


@attrs.frozen(kw_only=True)
class Timing:
    prefill: PhaseResult
    decode: PhaseResult
    rates: Rates
    serving: Serving
    found: dict[str, int | None] = attrs.field(factory=dict, eq=False, repr=False)
    """What `compute_bound_batch` found, searched once on first read (this evaluation's)."""

    @property
    def compute_bound_batch(self) -> int | None:
        """The decode step's compute-bound batch (`phases.compute_bound_batch`), searched
        on first read: only the plan's report and explanation read it."""
        if "batch" not in self.found:
            self.found["batch"] = compute_bound_batch(self.serving, self.rates)
        return self.found["batch"]

    def latency(self, generated: int) -> float:
        return self.prefill.phase.seconds + (generated - 1) * self.decode.phase.seconds

    def floor(self, generated: int) -> float:
        return self.prefill.phase.floor_seconds + (generated - 1) * self.decode.phase.floor_seconds

    def flops_per_gpu(self, generated: int) -> float:
        """FLOPs of the whole request batch along the pipeline (one GPU per stage)."""
        return self.prefill.phase.flops + (generated - 1) * self.decode.phase.flops


def timing_of(serving: Serving) -> Timing:
    rates = rates_of(serving.spec.hardware.gpu)
    return Timing(prefill=prefill(serving, rates), decode=decode(serving, rates), rates=rates,
                  serving=serving)


def _warnings(serving: Serving, memory: ServingMemory, timing: Timing | None,
              why_untimed: str | None) -> list[str]:
    spec, inference = serving.spec, serving.inference
    warnings = [f"{t.strategy}: {text}" for t in serving.transforms
                if t.strategy in WARNED_STRATEGIES for text in t.warnings]
    if "sequence" in spec.parallel:
        warnings.append("sequence parallelism is not modelled for serving: its traffic equals "
                        "tensor parallelism's all-reduces")
    positions = position_limit_warning(spec.model, inference.context_tokens, SERVED_POSITIONS)
    if positions is not None:
        warnings.append(positions)
    capacity = spec.hardware.gpu.usable_bytes
    if memory.total_bytes > capacity:
        warnings.append(f"does not fit: needs {memory.total_bytes / 2**30:,.2f} GiB per GPU, "
                        f"has {capacity / 2**30:,.2f} GiB")
    if why_untimed is not None:
        warnings.append(why_untimed)
    elif timing is not None and timing.rates.source == DEFAULT_SOURCE:
        warnings.append(f"GPU {spec.hardware.gpu.name!r} states no matmul/memory efficiency; "
                        f"assumed {timing.rates.matmul_efficiency} and "
                        f"{timing.rates.memory_efficiency} ({DEFAULT_SOURCE})")
    if timing is not None:
        for step, result in ((prefill_step(serving), timing.prefill),
                             (decode_step(serving), timing.decode)):
            sent = (list(result.sent) if result.step == step  # the phase's own step
                    else step_collectives(serving, step))
            warnings += unknown_links(serving, sent)
        warnings += engine_warnings(serving)
    warnings += format_warnings(inference, spec.precision.activations, spec.hardware.gpu)
    if inference.speculative is not None and inference.continuous:
        warnings.append("speculative decoding is modelled for static batching only: the "
                        "continuous-batching steady state decodes one token a step")
    return list(dict.fromkeys(warnings))


def _time_fields(serving: Serving, timing: Timing) -> dict[str, object]:
    spec, inference = serving.spec, serving.inference
    generated, gpus = inference.generated_tokens, spec.hardware.num_gpus
    latency = timing.latency(generated)
    output_tokens = serving.degree("data") * inference.batch_size * generated
    flops = timing.flops_per_gpu(generated) * gpus / serving.degree("pipeline")
    peak = timing.rates.peak(matmul_dtype(inference, spec.precision.activations,
                                          spec.hardware.gpu))
    utilization = flops / (gpus * peak * latency)
    prefill_phase, decode_phase = timing.prefill.phase, timing.decode.phase
    communication = (prefill_phase.communication_seconds
                     + (generated - 1) * decode_phase.communication_seconds)
    return dict(
        flops_per_step=flops, tokens_per_second=output_tokens / latency, mfu=utilization,
        hfu=utilization,
        communication_seconds=communication, exposed_communication_seconds=communication,
        collectives=timing.prefill.collectives + timing.decode.collectives,
        prefill_seconds=prefill_phase.seconds, tpot_seconds=decode_phase.seconds,
        latency_seconds=latency, tokens_per_second_per_gpu=output_tokens / latency / gpus,
        tokens_per_second_per_user=generated / latency,
        decode_compute_bound_batch_size=deferred(lambda: timing.compute_bound_batch),
        phases=(prefill_phase, decode_phase))


def _time_derivations(serving: Serving, timing: Timing) -> list[Derivation]:
    spec, generated = serving.spec, serving.inference.generated_tokens
    latency = timing.latency(generated)
    output_tokens = serving.degree("data") * serving.inference.batch_size * generated
    dtype = matmul_dtype(serving.inference, spec.precision.activations, spec.hardware.gpu)
    return (d.time_derivations(serving, timing.prefill, timing.decode, timing.rates)
            + d.rate_derivations(serving, latency, timing.floor(generated),
                                 output_tokens / latency)
            + [d.compute_bound_derivation(serving, timing.compute_bound_batch, timing.rates,
                                          dtype)])


def _memory_fields(serving: Serving, memory: ServingMemory, batch: Limit, context: Limit,
                   prompt: Limit) -> dict[str, object]:
    capacity = serving.spec.hardware.gpu.usable_bytes
    return dict(
        weights_bytes=memory.weights_bytes, gradients_bytes=0, optimizer_bytes=0,
        activations_bytes=memory.workspace_bytes, buffers_bytes=memory.overhead_bytes,
        total_bytes=memory.total_bytes, capacity_bytes=capacity,
        fits=memory.total_bytes <= capacity, kv_cache_bytes=memory.kv_cache_bytes,
        workspace_bytes=memory.workspace_bytes,
        runtime_overhead_bytes=memory.overhead_bytes, peak_stage=memory.stage,
        max_batch_size=batch.value, max_batch_size_limited_by=batch.limited_by,
        max_context_tokens=context.value, max_context_tokens_limited_by=context.limited_by,
        max_prompt_tokens=prompt.value, max_prompt_tokens_limited_by=prompt.limited_by)


def _workload_fields(serving: Serving) -> dict[str, object]:
    spec, inference = serving.spec, serving.inference
    parameters = serving.footprint.parameters
    global_batch = serving.degree("data") * inference.batch_size
    processed = global_batch * (inference.prompt_tokens + inference.generated_tokens - 1)
    return dict(
        model=spec.model.name, gpu=spec.hardware.gpu.name, num_gpus=spec.hardware.num_gpus,
        layout=dict(serving.layout.degrees), parameters=round(parameters.total),
        active_parameters=round(parameters.active),
        parameters_by_group=dict(parameters.by_group), workload="inference",
        context_tokens=inference.context_tokens, batch_size=inference.batch_size,
        global_batch_size=global_batch, tokens_per_step=global_batch * inference.generated_tokens,
        flops_per_step_6nd=2 * parameters.active * processed, notes=deferred(
            lambda: strategy_notes([t for t in serving.transforms
                                    if t.strategy in WARNED_STRATEGIES])))


def _trust(serving: Serving) -> str:
    return SERVING_TRUST if serving.inference.engine is None else ENGINE_TRUST


def build_inference_plan(spec: Spec, layout: Layout,
                         strategies: Mapping[str, Strategy[Any]], *,
                         serving: Serving | None = None,
                         cache: EvaluationCache | None = None) -> Plan:
    """Compose the plan of a validated `[inference]` spec under a resolved layout (from
    `serving`, when the caller holds `serving_of` this spec and layout already; with what
    a session's `cache` keeps of the model)."""
    if spec.inference is not None and spec.inference.disaggregated is not None:
        from llmpar.inference.disaggregated import build_disaggregated_plan

        return build_disaggregated_plan(spec, strategies)
    if serving is None or serving.spec is not spec or serving.layout != layout:
        serving = serving_of(spec, layout, strategies, cache)
    why_untimed = untimed(serving)
    budget = token_budget(serving) if serving.inference.continuous else None
    if budget is not None:  # continuous batching steps the prefill in the token budget
        inference = attrs.evolve(serving.inference, prefill_chunk_tokens=budget)
        serving = attrs.evolve(serving, spec=attrs.evolve(spec, inference=inference))
    batch = max_batch_size(serving)
    continuous = None
    if serving.inference.continuous and why_untimed is None:
        # The steady state first; the static parts then at its batch (memory, phases).
        continuous = continuous_batching(serving, rates_of(spec.hardware.gpu), batch)
        steady = max(1, math.ceil(continuous.batch_size - 1e-9))
        serving = serving.with_batch(min(steady, batch.value or steady) or 1)
    memory = peak_memory(serving)
    context = max_context_tokens(serving)
    prompt = max_prompt_tokens(serving)
    timing = timing_of(serving) if why_untimed is None else None
    fields = {**_workload_fields(serving),
              **_memory_fields(serving, memory, batch, context, prompt)}
    if timing is not None:
        fields.update(_time_fields(serving, timing))
    final = serving

    def derivations() -> tuple[Derivation, ...]:
        # what `explain` shows, from this evaluation's values, on the first read
        built = (d.memory_derivations(final, memory, runtime_overhead(spec, layout))
                 + d.limit_derivations(final, batch, context, prompt))
        if timing is not None:
            built += _time_derivations(final, timing)
        if continuous is not None:
            built += d.continuous_derivations(final, continuous)
        return tuple(built)
    # The Plan's own fields go on the plan; the rest are the serving pool's.
    top = {f.name: fields.pop(f.name) for f in attrs.fields(Plan) if f.name in fields}
    pool = ServingPool(num_gpus=spec.hardware.num_gpus, layout=dict(serving.layout.degrees),
                       time_trust=_trust(serving) if timing is not None else "",
                       engine=engine_label(serving), continuous=continuous,
                       **fields)  # type: ignore[arg-type]
    return Plan(**top, serving=(pool,),  # type: ignore[arg-type]
                warnings=tuple(_warnings(serving, memory, timing, why_untimed)),
                derivations=deferred(derivations))
