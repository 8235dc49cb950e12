"""The result of evaluating a spec: a Plan, plain data that serializes as is.

Every plan has the memory of its busiest GPU, the model and the layout; a training
plan has a `training` part, a serving plan one `serving` pool or more (today one: its
replicas prefill and decode). The fields of schema 1, a flat record for both workloads,
stay readable as properties with their schema-1 meaning, and `to_dict()` keeps every
schema-1 key beside the nested parts (docs/json-schema.md); fields added since live only
in the nested parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar, overload

import attrs

from llmpar.deferred import deferring
from llmpar.plan_records import (
    CollectiveCost,
    ContinuousBatching,
    Derivation,
    Disaggregation,
    InferencePhase,
    LiveBuffer,
    MemoryPeak,
    RunGoodput,
    SavedTensorRow,
    StageMemory,
    StrategyNote,
)

PLAN_SCHEMA_VERSION = 2
"""Version of the Plan's field names and meanings (`to_dict()` carries it). 2: a training
plan's `fits` is decided on the device memory at the step's peak
(`training.memory_peak.device_bytes`), no longer on the steady-state `total_bytes`
(schema 1's verdict: `training.steady_state_fits`, `Plan.steady_state_fits`)."""

__all__ = ["PLAN_SCHEMA_VERSION", "CollectiveCost", "Derivation", "InferencePhase",
           "LiveBuffer", "MemoryPeak", "Plan", "RunGoodput", "SavedTensorRow",
           "ServingPool", "StageMemory", "StrategyNote", "TrainingPart"]


@attrs.frozen(kw_only=True)
class FinetunePart:
    """What `[finetune]` trains and skips (a training plan's `finetune`; absent for full
    training)."""

    method: str
    trainable_parameters: int
    """Parameters with gradients and optimizer states: adapters, trained copies and
    unfrozen groups (PEFT's "trainable params")."""
    adapter_parameters: int
    """Of those, the adapters' (LoRA's A and B, DoRA's magnitudes)."""
    frozen_parameters: int
    """Parameters of the model without gradients or optimizer states."""
    skipped_flops_per_step: float
    """Weight-gradient products of the frozen weights not run, all GPUs: the forward
    FLOPs of their products (hardware_flops_per_step leaves them out)."""
    adapter_flops_per_step: float
    """The adapters' products, forward and backward, all GPUs (in
    hardware_flops_per_step)."""
    transient_bytes: int
    """The largest weight materialized at once in 16-bit (QLoRA's dequantized base
    layer, DoRA's W + BA), in the peak stage's buffers_bytes."""


@attrs.frozen(kw_only=True)
class TrainingPart:
    """What a training plan holds beyond what every plan has."""

    sequence_length: int
    micro_batch_size: int
    global_batch_size: int
    micro_batches_per_step: int
    tokens_per_step: int
    flops_per_step: float
    """Model FLOPs of one step, all GPUs (exact per-operation count, or 6ND for a
    model given only by its size: see `flops_method`)."""
    flops_per_step_6nd: float
    flops_method: str
    hardware_flops_per_step: float
    """The FLOPs the GPUs execute: the model's products with attention as its kernel
    runs it (eager: the full s x s square; fused on a causal model: about half, whatever
    `attention_flops` counts), plus recomputation, plus what strategies add or skip
    (`Transform.extra_flops_per_step`, `skipped_flops_per_step`)."""
    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    """Model FLOPs (attention counted as `attention_flops` says) per second over the peak
    of all GPUs: the only number the convention changes. It may exceed hfu where the
    count includes work no kernel runs: the masked half of the square a fused causal
    kernel skips under "full", FLOPs a strategy skips (then it may even exceed 1)."""
    hfu: float | None
    """Hardware FLOPs (executed by the kernels, recomputation included:
    hardware_flops_per_step) per second over the peak of all GPUs; the same under either
    `attention_flops`, never above 1 (a modelled step runs them at matmul_efficiency at
    best, and an assumed mfu that would put it above 1 is an error)."""
    train_tokens: float | None
    train_steps: float | None
    train_flops: float | None
    train_seconds: float | None
    gpu_hours: float | None
    activation_model: str
    activation_k: float | None
    """The founding document's k: activations / (b * s * L * h * d), no recompute."""
    activation_tensors: tuple[SavedTensorRow, ...] = ()
    time_model: str = "assumed-mfu"
    """"assumed-mfu" (step time from a stated utilization) or "modelled" (compute at
    a shape-dependent efficiency, plus exposed communication, bubble and optimizer)."""
    compute_seconds: float | None = None
    """Per-GPU compute of one step, without waiting or communication."""
    communication_seconds: float = 0.0
    """All communication of one step on one GPU, hidden or not."""
    exposed_communication_seconds: float = 0.0
    bubble_fraction: float = 0.0
    """Pipeline idle time as a share of compute time."""
    bubble_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    offload_seconds: float = 0.0
    """Work of one step on offloaded states outside the GPU (host-link copies, the
    host's optimizer step), hidden behind compute or not."""
    exposed_offload_seconds: float = 0.0
    collectives: tuple[CollectiveCost, ...] = ()
    notes: tuple[StrategyNote, ...] = ()
    """What each strategy did (`Transform.notes`)."""
    step_time_trust: str = ""
    """How far to trust `step_seconds`: the error on the published runs of its validation
    family (GPU and model kind), or what a GPU without runs rests on (`llmpar.trust`);
    then, after a "; ", each mechanism of the plan that rows check on their own
    (`Transform.mechanisms`) with its family's error; empty without a step time."""
    goodput: RunGoodput | None = None
    """Checkpoints and interruptions over the run (`[training.goodput]`); None without
    that table, and then `train_seconds` counts the steps only."""
    framework: str = "megatron-core"
    """The framework profile the plan was made under (`[training] framework`; unset:
    megatron-core)."""
    host_overhead_seconds: float = 0.0
    """The framework profile's exposed host time in one step: per micro-batch and per
    step, and `launch_bound_seconds` (its per-launch `kernel_overhead_seconds` is part of
    compute_seconds)."""
    issue_seconds: float = 0.0
    """Host seconds one GPU's process takes to issue the step's kernels (the profile's
    `host_seconds_per_kernel` and `host_seconds_per_layer`, or its CUDA graph replays;
    `llmpar.evaluation.launches`): hidden behind the kernels while they take longer."""
    launch_bound_seconds: float = 0.0
    """The part of `issue_seconds` the GPU waits for, what issuing takes beyond
    compute_seconds (0 while the GPU's work is the longer); part of
    host_overhead_seconds."""
    finetune: FinetunePart | None = None
    """What `[finetune]` trains and skips; None in full training (no `[finetune]`, or
    `method = "full"`)."""
    memory_peak: MemoryPeak | None = None
    """The step's memory peak with its transient buffers, and the allocator's and the
    device's numbers (`llmpar.evaluation.peak`); the plan's `fits` is its
    `device_bytes` against `capacity_bytes` (schema 2). None without an activation
    estimate."""
    steady_state_fits: bool | None = None
    """Schema 1's `fits`: the peak stage's steady-state sum (`total_bytes`) within
    `capacity_bytes`, without transients, the allocator's rounding, NCCL's buffers, the
    cuBLAS workspace or the CUDA context. None in plans written before schema 2 that
    were not read from schema 1."""


deferring(TrainingPart, "collectives", "notes", "step_time_trust")  # `llmpar.deferred`


@attrs.frozen(kw_only=True)
class ServingPool:
    """GPUs that serve requests under one layout: replicas that prefill and decode (a
    plan may list pools of different roles, such as separate prefill and decode pools)."""

    name: str = "replicas"
    role: str = "prefill+decode"
    """"prefill+decode" (every replica does both), or "prefill" or "decode"."""
    num_gpus: int
    layout: dict[str, int] = attrs.field(hash=False)
    batch_size: int
    """Sequences per replica."""
    global_batch_size: int
    """Sequences of all replicas."""
    context_tokens: int
    """Prompt + generated tokens per sequence."""
    tokens_per_step: int
    """Output tokens of one batch, all replicas."""
    kv_cache_bytes: int | None
    """The key/value cache on one GPU at the end of generation."""
    workspace_bytes: int | None
    """Activations of the largest forward step on one GPU."""
    runtime_overhead_bytes: int | None
    """CUDA context, communication buffers and allocator headroom on one GPU."""
    max_batch_size: int | None
    """The most sequences per replica that fit at the spec's context."""
    max_batch_size_limited_by: str | None
    max_context_tokens: int | None
    """The most tokens per sequence that fit in the KV cache at the end of generation
    (prompt + generated), at the spec's batch, beside the workspace of the spec's own
    prefill: what a longer generation can reach, not a longer prompt (see
    `max_prompt_tokens`)."""
    max_context_tokens_limited_by: str | None
    max_prompt_tokens: int | None = None
    """The longest prompt per sequence that fits at the spec's batch with the spec's
    generated tokens still to come: its prefill's workspace grows with it, beside the
    KV cache of prompt + generated."""
    max_prompt_tokens_limited_by: str | None = None
    time_model: str = "roofline"
    flops_per_step: float = 0.0
    """FLOPs of serving one batch, all GPUs of the pool."""
    flops_per_step_6nd: float = 0.0
    flops_method: str = "roofline-operations"
    prefill_seconds: float | None = None
    """Time to first token (the prefill of the batch)."""
    tpot_seconds: float | None = None
    """Time per output token after the first (one decode step)."""
    latency_seconds: float | None = None
    """prefill_seconds + (generated_tokens - 1) * tpot_seconds."""
    tokens_per_second: float | None = None
    tokens_per_second_per_gpu: float | None = None
    tokens_per_second_per_user: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    communication_seconds: float = 0.0
    exposed_communication_seconds: float = 0.0
    decode_compute_bound_batch_size: int | None = None
    """The smallest batch at which a decode step is compute-bound, if any."""
    phases: tuple[InferencePhase, ...] = ()
    collectives: tuple[CollectiveCost, ...] = ()
    notes: tuple[StrategyNote, ...] = ()
    time_trust: str = ""
    """How far to trust the pool's TTFT, TPOT and throughput (`llmpar.trust`)."""
    continuous: ContinuousBatching | None = None
    """The steady state under continuous batching (`[inference] concurrency` or
    `request_rate_per_s`); None: static batching, one batch served start to end."""
    engine: str | None = None
    """The serving engine profile the times include (`[inference] engine`: name, version,
    CUDA graphs or eager); None: the roofline alone."""
    disaggregation: Disaggregation | None = None
    """Disaggregated prefill and decode (`[inference.disaggregated]`): both pools carry it.
    The decode pool's prefill_seconds is then the TTFT a request sees (queue, the prefill
    pool's prefill, the KV transfer), its tokens_per_second_per_gpu is over the GPUs of
    both pools, and it states no mfu or hfu; the prefill pool has no TPOT or output rate of
    its own."""


T = TypeVar("T")


class _V1(Generic[T]):
    """A schema-1 field of the flat record, read from the plan's part (`training`, or
    the first serving pool); `training` and `serving` name the part's field, or give the
    schema-1 placeholder for the other workload as `(value,)`."""

    def __init__(self, training: str | tuple[Any], serving: str | tuple[Any]):
        self.training, self.serving = training, serving
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @staticmethod
    def spelling(owner: type, name: str, *, training: bool) -> str:
        """The part's field behind the schema-1 field `name`."""
        field = owner.__dict__.get(name)
        if not isinstance(field, _V1):
            raise AttributeError(f"Plan has no field {name!r}")
        spelled = field.training if training else field.serving
        if isinstance(spelled, tuple):
            raise AttributeError(f"{name!r} is a placeholder in a "
                                 f"{'training' if training else 'serving'} plan")
        return spelled

    @overload
    def __get__(self, plan: None, owner: type) -> _V1[T]: ...

    @overload
    def __get__(self, plan: Plan, owner: type) -> T: ...

    def __get__(self, plan: Plan | None, owner: type) -> Any:
        if plan is None:
            return self
        part: Any = plan.training if plan.training is not None else (
            plan.serving[0] if plan.serving else None)
        spelled = self.training if plan.training is not None else self.serving
        if isinstance(spelled, tuple):
            return spelled[0]
        return None if part is None else getattr(part, spelled)


deferring(ServingPool, "decode_compute_bound_batch_size", "notes")  # `llmpar.deferred`


@attrs.frozen(kw_only=True)
class Plan:
    """Per-GPU memory, compute and time of one spec under its layout.

    Memory fields are bytes on the busiest GPU; FLOPs are summed over all GPUs;
    `None` means the spec does not determine the number (the warnings say why).
    """

    schema_version: int = PLAN_SCHEMA_VERSION
    model: str
    gpu: str
    num_gpus: int
    layout: dict[str, int] = attrs.field(hash=False)
    """Degree of every active strategy."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    buffers_bytes: int = 0
    """Communication and other buffers the strategies ask for."""
    total_bytes: int
    capacity_bytes: int
    """Memory one GPU offers: the device's usable memory less `[hardware]
    memory_headroom_bytes` in training."""
    fits: bool
    """Training (schema 2): the device memory at the step's peak
    (`training.memory_peak.device_bytes`) within `capacity_bytes`; schema 1 compared
    `total_bytes` (`steady_state_fits`). Serving: the peak stage's total, runtime
    allowance included, within the GPU's usable memory."""
    host_bytes: int = 0
    """Model states one GPU keeps in host memory instead of its own (offloaded), on the
    stage that offloads the most; not in total_bytes."""

    parameters: int
    active_parameters: int
    """Parameters one token passes through (MoE: only its routed experts)."""
    parameters_by_group: dict[str, int] = attrs.field(hash=False)

    peak_stage: int = 0
    """The pipeline stage whose GPUs need the most memory; memory fields are its."""
    stages: tuple[StageMemory, ...] = ()

    workload: str = "training"
    """"training" or "inference": which part the plan has."""
    training: TrainingPart | None = None
    """The training part (None for a serving plan)."""
    serving: tuple[ServingPool, ...] = ()
    """The serving pools (empty for a training plan)."""

    warnings: tuple[str, ...] = ()
    derivations: tuple[Derivation, ...] = ()

    # --- schema 1's flat fields, read from the parts --------------------------------
    sequence_length = _V1[int]("sequence_length", "context_tokens")
    micro_batch_size = _V1[int]("micro_batch_size", "batch_size")
    global_batch_size = _V1[int]("global_batch_size", "global_batch_size")
    micro_batches_per_step = _V1[int]("micro_batches_per_step", (1,))
    tokens_per_step = _V1[int]("tokens_per_step", "tokens_per_step")
    flops_per_step = _V1[float]("flops_per_step", "flops_per_step")
    flops_per_step_6nd = _V1[float]("flops_per_step_6nd", "flops_per_step_6nd")
    flops_method = _V1[str]("flops_method", "flops_method")
    hardware_flops_per_step = _V1[float]("hardware_flops_per_step", "flops_per_step")
    step_seconds = _V1[float | None]("step_seconds", "latency_seconds")
    tokens_per_second = _V1[float | None]("tokens_per_second", "tokens_per_second")
    mfu = _V1[float | None]("mfu", "mfu")
    hfu = _V1[float | None]("hfu", "hfu")
    train_tokens = _V1[float | None]("train_tokens", (None,))
    train_steps = _V1[float | None]("train_steps", (None,))
    train_flops = _V1[float | None]("train_flops", (None,))
    train_seconds = _V1[float | None]("train_seconds", (None,))
    gpu_hours = _V1[float | None]("gpu_hours", (None,))
    activation_model = _V1[str]("activation_model", ("inference-workspace",))
    activation_k = _V1[float | None]("activation_k", (None,))
    activation_tensors = _V1[tuple[SavedTensorRow, ...]]("activation_tensors", ((),))
    time_model = _V1[str]("time_model", "time_model")
    compute_seconds = _V1[float | None]("compute_seconds", (None,))
    communication_seconds = _V1[float]("communication_seconds", "communication_seconds")
    exposed_communication_seconds = _V1[float]("exposed_communication_seconds",
                                                    "exposed_communication_seconds")
    bubble_fraction = _V1[float]("bubble_fraction", (0.0,))
    bubble_seconds = _V1[float]("bubble_seconds", (0.0,))
    optimizer_seconds = _V1[float]("optimizer_seconds", (0.0,))
    offload_seconds = _V1[float]("offload_seconds", (0.0,))
    exposed_offload_seconds = _V1[float]("exposed_offload_seconds", (0.0,))
    collectives = _V1[tuple[CollectiveCost, ...]]("collectives", "collectives")
    kv_cache_bytes = _V1[int | None]((None,), "kv_cache_bytes")
    runtime_overhead_bytes = _V1[int | None]((None,), "runtime_overhead_bytes")
    max_batch_size = _V1[int | None]((None,), "max_batch_size")
    max_batch_size_limited_by = _V1[str | None]((None,), "max_batch_size_limited_by")
    max_context_tokens = _V1[int | None]((None,), "max_context_tokens")
    max_context_tokens_limited_by = _V1[str | None]((None,),
                                                         "max_context_tokens_limited_by")
    prefill_seconds = _V1[float | None]((None,), "prefill_seconds")
    tpot_seconds = _V1[float | None]((None,), "tpot_seconds")
    latency_seconds = _V1[float | None]((None,), "latency_seconds")
    tokens_per_second_per_gpu = _V1[float | None]((None,), "tokens_per_second_per_gpu")
    tokens_per_second_per_user = _V1[float | None]((None,), "tokens_per_second_per_user")
    decode_compute_bound_batch_size = _V1[int | None]((None,),
                                                           "decode_compute_bound_batch_size")
    phases = _V1[tuple[InferencePhase, ...]](((),), "phases")

    @property
    def steady_state_fits(self) -> bool:
        """Schema 1's verdict: `total_bytes <= capacity_bytes` (the steady-state sum of the
        peak stage, without transients or what the device adds)."""
        return self.total_bytes <= self.capacity_bytes

    @property
    def notes(self) -> tuple[StrategyNote, ...]:
        """What each strategy did, from the plan's part."""
        if self.training is not None:
            return self.training.notes
        return tuple(note for pool in self.serving for note in pool.notes)

    def evolve(self, **changes: Any) -> Plan:
        """A copy with fields changed; a schema-1 name of a part's field (`step_seconds`,
        `collectives`, ...) changes it in the plan's part."""
        own = {f.name for f in attrs.fields(Plan)}
        top = {k: v for k, v in changes.items() if k in own}
        parted = {k: v for k, v in changes.items() if k not in own}
        if parted and self.training is not None:
            top["training"] = attrs.evolve(self.training, **{
                _V1.spelling(Plan, k, training=True): v for k, v in parted.items()})
        elif parted and self.serving:
            first = attrs.evolve(self.serving[0], **{
                _V1.spelling(Plan, k, training=False): v for k, v in parted.items()})
            top["serving"] = (first, *self.serving[1:])
        return attrs.evolve(self, **top)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: every schema-1 key, in schema-1 order, then the
        `training` part and the `serving` pools (docs/json-schema.md)."""
        from llmpar.plan_json import plan_to_dict

        return plan_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The Plan `to_dict()` wrote; a schema-1 dict without the nested parts is read
        from its flat keys."""
        from llmpar.plan_json import plan_from_dict

        return plan_from_dict(data)

    def derivation(self, quantity: str) -> Derivation:
        """How `quantity` was derived; KeyError if the plan has no record of it."""
        for item in self.derivations:
            if item.quantity == quantity:
                return item
        raise KeyError(quantity)

    def explanation(self, quantity: str) -> Derivation:
        """The recorded Derivation of `quantity`, else one made for the field of
        `to_dict()` at that path (see `explain`); KeyError when there is no such field."""
        for item in self.derivations:
            if item.quantity == quantity:
                return item
        from llmpar.plan_explain import explain_field

        return explain_field(self, quantity)

    def explain(self, quantity: str | None = None) -> str:
        """Each number with the rule and source that produced it (or just one); with no
        quantity, what each strategy did too.

        `quantity` is a recorded derivation's name or any field of `to_dict()` by its
        path (`training.mfu`, `stages[0].total_bytes`, `collectives[2].exposed_seconds`,
        `serving[0].tpot_seconds`): its recorded Derivation, else how it relates to the
        plan's other fields or which spec key it copies (`llmpar.plan_explain`).
        KeyError when the plan has no such field."""
        items = [self.explanation(quantity)] if quantity else list(self.derivations)
        text = "\n\n".join(item.render() for item in items)
        if quantity is None and self.notes:
            text += "\n\nstrategies:\n" + "\n".join(f"  {n.strategy}: {n.text}"
                                                   for n in self.notes)
        return text


deferring(Plan, "stages", "derivations")  # built on first read (`llmpar.deferred`)
