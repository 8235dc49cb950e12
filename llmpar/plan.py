"""The result of evaluating a spec: a Plan, plain data that serializes as is."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.units import format_bytes

PLAN_SCHEMA_VERSION = 1
"""Version of the Plan's field names and meanings (`to_dict()` carries it)."""


@attrs.frozen(kw_only=True)
class Derivation:
    """How one number of a plan was produced."""

    quantity: str
    """The Plan field (or intermediate) this explains."""
    value: float | int | bool | None
    unit: str
    rule: str
    """The formula, in the symbols of `inputs`."""
    source: str
    """Paper and equation, datasheet, or spec key the rule comes from."""
    inputs: dict[str, float | int | str] = attrs.field(factory=dict, hash=False)

    def render(self) -> str:
        """A few lines: quantity = value, rule, inputs and source."""
        value = self.value
        if self.unit == "bytes" and isinstance(value, (int, float)):
            shown = format_bytes(value)
        elif isinstance(value, float):
            shown = f"{value:.6g} {self.unit}".rstrip()
        else:
            shown = f"{value} {self.unit}".rstrip()
        lines = [f"{self.quantity} = {shown}", f"  rule:   {self.rule}"]
        if self.inputs:
            listed = ", ".join(f"{k} = {_short(v)}" for k, v in self.inputs.items())
            lines.append(f"  inputs: {listed}")
        lines.append(f"  source: {self.source}")
        return "\n".join(lines)


def _short(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@attrs.frozen(kw_only=True)
class SavedTensorRow:
    """One activation tensor as it lands on a GPU, after splits."""

    name: str
    reason: str
    shape: str
    bytes_per_element: float
    bytes: float
    """Bytes of one instance (one layer's, or the single one outside layers)."""
    layer_kind: str
    """The kind of layer that keeps it ("dense", "moe", ...), or "" outside the layers."""
    layers: int
    """How many layers keep one each (1 outside the layers)."""

    @property
    def per_layer(self) -> bool:
        return bool(self.layer_kind)


@attrs.frozen(kw_only=True)
class CollectiveCost:
    """One kind of communication in a step, costed on the links its group spans."""

    strategy: str
    operation: str
    """all-reduce, all-gather, reduce-scatter, all-to-all or send-recv."""
    name: str = ""
    """The strategy's public name for it ("tensor.layer-output"): what another strategy's
    `Transform.replaces` names."""
    buffer_bytes: int
    """Bytes each GPU contributes to one call."""
    group_size: int
    tier: str
    """The slowest link the group spans: "intra-node" or "inter-node"."""
    calls_per_step: float
    seconds: float
    """All calls of one step together, on one GPU."""
    exposed_seconds: float
    """The part not hidden behind compute."""
    hides_behind: str = "compute"
    """What its hidden part runs behind: "compute" (any of the step's) or "attention"
    (the attention products only)."""
    reason: str = ""


@attrs.frozen(kw_only=True)
class StageMemory:
    """Memory of one pipeline stage's GPUs (one stage when there is no pipeline)."""

    stage: int
    layers: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    buffers_bytes: int
    total_bytes: int
    micro_batches_in_flight: float
    host_bytes: int = 0
    """Model states of one GPU kept in host memory instead (offloaded); not in total_bytes."""


@attrs.frozen(kw_only=True)
class InferencePhase:
    """One phase of serving, prefill or decode: one step on one GPU, by roofline.

    seconds = compute_seconds + memory_seconds + communication_seconds, where each
    operation counts as compute or memory by whichever of its FLOPs and bytes takes longer.
    """

    name: str
    """"prefill" (the prompts, up to the first token) or "decode" (one output token)."""
    seconds: float
    """Prefill: time to first token. Decode: one step, at the average context."""
    floor_seconds: float
    """max(FLOPs / peak, bytes / HBM bandwidth) at 100% efficiency, no communication:
    no implementation is faster."""
    compute_seconds: float
    """Time of the operations whose FLOPs take longer than their bytes."""
    memory_seconds: float
    """Time of the operations whose bytes take longer than their FLOPs."""
    communication_seconds: float
    """Collectives and pipeline hand-offs on the critical path."""
    bound: str
    """"compute", "memory" or "communication": the largest of the three parts."""
    flops: float
    """FLOPs of the phase on one GPU per pipeline stage (summed along the pipeline)."""
    bytes: float
    """Bytes moved to and from HBM in the phase (weights, KV cache, activations), one GPU
    per pipeline stage."""
    tokens: int
    """New tokens per sequence in the phase (prefill: the prompt; decode: 1)."""
    context_tokens: float
    """Tokens attended at the end of the phase (decode: the average over the steps)."""
    steps: int
    """Forward passes in the phase (prefill: chunks; decode: 1)."""


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
    fits: bool
    host_bytes: int = 0
    """Model states one GPU keeps in host memory instead of its own (offloaded), on the
    stage that offloads the most; not in total_bytes."""

    parameters: int
    active_parameters: int
    """Parameters one token passes through (MoE: only its routed experts)."""
    parameters_by_group: dict[str, int] = attrs.field(hash=False)

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
    """Model FLOPs plus recomputation."""

    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    hfu: float | None
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
    peak_stage: int = 0
    """The pipeline stage whose GPUs need the most memory; memory fields are its."""
    stages: tuple[StageMemory, ...] = ()

    workload: str = "training"
    """"training" or "inference": which of the fields below the plan fills."""
    kv_cache_bytes: int | None = None
    """Inference: the key/value cache on one GPU at the end of generation."""
    runtime_overhead_bytes: int | None = None
    """Inference: CUDA context, communication buffers and allocator headroom on one GPU
    (also counted in buffers_bytes)."""
    max_batch_size: int | None = None
    """Inference: the most sequences per replica that fit at the spec's context."""
    max_batch_size_limited_by: str | None = None
    max_context_tokens: int | None = None
    """Inference: the longest prompt + generated tokens that fits at the spec's batch."""
    max_context_tokens_limited_by: str | None = None
    prefill_seconds: float | None = None
    """Inference: time to first token (the prefill of the batch)."""
    tpot_seconds: float | None = None
    """Inference: time per output token after the first (one decode step)."""
    latency_seconds: float | None = None
    """Inference: prefill_seconds + (generated_tokens - 1) * tpot_seconds."""
    tokens_per_second_per_gpu: float | None = None
    tokens_per_second_per_user: float | None = None
    decode_compute_bound_batch_size: int | None = None
    """Inference: the smallest batch at which a decode step is compute-bound, if any."""
    phases: tuple[InferencePhase, ...] = ()

    warnings: tuple[str, ...] = ()
    derivations: tuple[Derivation, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (dicts, lists, numbers, strings, None)."""
        from llmpar.loading.dump import plain_converter

        return plain_converter().unstructure(self)

    def derivation(self, quantity: str) -> Derivation:
        """How `quantity` was derived; KeyError if the plan has no record of it."""
        for item in self.derivations:
            if item.quantity == quantity:
                return item
        raise KeyError(quantity)

    def explain(self, quantity: str | None = None) -> str:
        """Each number with the rule and source that produced it (or just one)."""
        items = [self.derivation(quantity)] if quantity else list(self.derivations)
        return "\n\n".join(item.render() for item in items)
