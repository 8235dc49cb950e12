"""The records a Plan holds: derivations, saved tensors, collectives, stages, inference
phases and strategies' notes. Plain data that serializes as is."""

from __future__ import annotations

import attrs

from llmpar.units import format_bytes


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
    """What its hidden part runs behind: "compute" (any of the step's), "attention" (the
    attention products only), "last-backward" (the last micro-batch's backward pass),
    "first-forward" (the first micro-batch's forward pass) or "layers" (each layer's
    passes, a piece behind the neighbouring layer's)."""
    reason: str = ""
    window_seconds: float = 0.0
    """Seconds of that work its hideable part can run behind, after its first piece is
    ready; shared with every collective that hides behind the same work (0 when the
    step time is not modelled)."""
    pieces: float | None = None
    """Pieces its calls run in (gradient buckets, layers), one of which cannot hide;
    None when not in pieces."""
    algorithm: str = ""
    """How one call runs: "ring" (`[hardware] collective_algorithms = "ring"`), NCCL's
    algorithm/protocol ("tree/LL", "ring/Simple", "nvls/Simple", "nvls-tree/Simple")
    under "nccl", "point-to-point" for all-to-all and send-recv, "engine" for a serving
    engine's own all-reduce kernel; "" for a group of one or an unknown link."""


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

    seconds = compute_seconds + memory_seconds + communication_seconds + overhead_seconds,
    where each operation counts as compute or memory by whichever of its FLOPs and bytes
    takes longer.
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
    """"compute", "memory", "communication" or "overhead": the largest of the parts."""
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
    overhead_seconds: float = 0.0
    """The serving engine's host time the GPU waits on (scheduling, sampling, kernel
    launches without CUDA graphs; `llmpar.inference.engine`); 0 without an engine."""


@attrs.frozen(kw_only=True)
class Disaggregation:
    """Disaggregated prefill and decode (`[inference.disaggregated]`;
    `llmpar.inference.disaggregated`): the two pools, the KV transfer between them, and
    which pool limits the request rate."""

    prefill_gpus: int
    decode_gpus: int
    prefill_replicas: int
    """Replicas of the prefill pool (its data degree)."""
    decode_replicas: int
    prefill_seconds: float | None
    """One prefill of `prompts_per_prefill` prompts on a prefill replica."""
    prompts_per_prefill: int
    """Prompts a prefill replica prefills at once: the static batch, or 1 under a request
    rate (each prompt as it arrives)."""
    kv_transfer_bytes_per_gpu: int
    """Cache bytes one GPU sends or receives for those prompts: the larger of a prefill
    GPU's and a decode GPU's share."""
    kv_transfer_seconds: float | None
    """Latency + kv_transfer_bytes_per_gpu / kv_transfer_bandwidth_bytes_per_s, after the
    prefill; None without a bandwidth."""
    kv_transfer_bandwidth_bytes_per_s: float | None
    kv_transfer_link: str
    """Which link the cache crosses, in words."""
    ttft_seconds: float | None
    """Queue wait (under a request rate) + prefill + KV transfer."""
    prefill_max_request_rate_per_s: float | None
    """Requests per second the prefill pool sustains: replicas x prompts / prefill_seconds."""
    decode_max_request_rate_per_s: float | None
    """Requests per second the decode pool sustains at its batch limit; None under static
    batching."""
    prefill_utilization: float | None
    """Request rate over prefill_max_request_rate_per_s; None under static batching."""
    decode_utilization: float | None
    """Request rate over decode_max_request_rate_per_s; None under static batching."""
    rate_limited_by: str | None
    """"prefill" or "decode": the pool whose maximum rate is the smaller; None under
    static batching."""


@attrs.frozen(kw_only=True)
class ContinuousBatching:
    """A serving pool's steady state under continuous batching (`[inference] concurrency`
    or `request_rate_per_s`; `llmpar.inference.continuous`): the running batch, TPOT with
    the prefill chunks mixed into every decode step, TTFT with queueing, throughput."""

    mode: str
    """"concurrency" (a closed loop) or "request rate" (Poisson arrivals)."""
    concurrency: float | None
    """Requests in flight across the pool: the concurrency given, or by Little's law
    request_rate_per_s x latency_seconds; None when overloaded."""
    request_rate_per_s: float
    """Requests per second across the pool: the rate given, or the completions the
    concurrency sustains."""
    batch_size: float
    """Sequences in each replica's running batch, on average."""
    batch_limit: float | None
    """The largest running batch per replica (KV cache, engine max_num_seqs, token
    budget); None: nothing binds."""
    batch_limited_by: str
    """What sets batch_size: "concurrency", the request rate, or the limit in words."""
    token_budget: int | None
    """Tokens one step holds (prefill_chunk_tokens, else the engine's
    max_num_batched_tokens); None: no limit."""
    prefill_tokens_per_step: float
    """Prefill tokens mixed into each step: batch_size x prompt / generated."""
    prefill_steps_per_request: int
    """Steps a prompt's prefill spreads over."""
    prefill_chunk_tokens: float
    """Tokens of one prompt in each of those steps."""
    tpot_seconds: float
    """One steady-state step: a decode token for every running sequence, with the prefill
    tokens mixed in, the exposed communication and the engine's host time."""
    tpot_floor_seconds: float
    """max(FLOPs / peak, bytes / HBM bandwidth) of that step: no implementation is faster."""
    queue_seconds: float | None
    """Mean wait before a request's prefill starts; None when overloaded (the queue
    grows without bound)."""
    ttft_seconds: float | None
    """Mean time to first token: the wait and the prompt's prefill steps."""
    ttft_p90_seconds: float | None
    """TTFT that 90% of requests stay within (the wait's exponential tail)."""
    ttft_p99_seconds: float | None
    """TTFT that 99% of requests stay within."""
    prefill_utilization: float | None
    """Share of the prefill budget the arriving prompts use (M/D/1 rho); None for a
    concurrency."""
    latency_seconds: float | None
    """ttft_seconds + (generated_tokens - 1) x tpot_seconds."""
    tokens_per_second: float
    """Output tokens per second across the pool."""
    tokens_per_second_per_gpu: float
    """tokens_per_second / num_gpus."""
    tokens_per_second_per_user: float
    """1 / tpot_seconds: what a streaming user sees after the first token."""
    max_request_rate_per_s: float
    """Requests per second the pool sustains at its batch limit."""
    flops_per_step: float
    """FLOPs of one steady-state step on one GPU per pipeline stage."""
    stable: bool
    """False when the request rate exceeds max_request_rate_per_s (the queue grows)."""
    queueing_model: str
    """The queueing model of the wait, with its sources."""


@attrs.frozen(kw_only=True)
class StrategyNote:
    """What a strategy says it did (`Transform.notes`), for reports."""

    strategy: str
    text: str


@attrs.frozen(kw_only=True)
class RunGoodput:
    """Checkpoints and interruptions over the whole run (`[training.goodput]`): the share
    of wall-clock time that trains, and the wall-clock time it implies."""

    checkpoint_bytes: float
    """Bytes of one checkpoint: every weight in its format and the optimizer's states of
    every trainable parameter (gradients are not saved)."""
    checkpoint_write_seconds: float
    """Writing one checkpoint to storage (and reading it back after an interruption)."""
    checkpoint_blocking_seconds: float
    """How long training stops for each checkpoint: the whole write, or for an
    asynchronous one each GPU's copy of its states to host memory."""
    checkpoint_interval_seconds: float | None
    """Training time between checkpoints (given or Young's optimum); None where no
    interruption is expected and none is given."""
    seconds_between_interruptions: float | None
    """Mean time between interruptions of the whole job; None where none is expected."""
    lost_seconds_per_interruption: float
    """Restart, reading the checkpoint back, and on average half an interval of work
    since the last checkpoint."""
    goodput_fraction: float
    """Share of wall-clock time that advances training."""
    interruptions: float | None = None
    """Interruptions expected over the run (None without a step time)."""
    wall_seconds: float | None = None
    """`train_seconds` / `goodput_fraction`: the run with its checkpoints and restarts
    (None without a step time, or where the run makes no progress)."""


@attrs.frozen(kw_only=True)
class LiveBuffer:
    """One thing alive on a GPU at the memory peak: a steady-state component or a
    transient buffer."""

    name: str
    bytes: int
    source: str
    """Where its size and its lifetime come from."""
    transient: bool = False
    """Alive only around the peak's moment (not in the stage's `total_bytes`)."""


@attrs.frozen(kw_only=True)
class MemoryPeak:
    """The memory peak of a training step as the framework allocates it: the largest
    of a few closed-form moments per stage, with the transient buffers alive then, and
    the three numbers a user can check on a GPU."""

    allocated_bytes: int
    """Predicted `torch.cuda.max_memory_allocated()`: the peak over the step's moments."""
    reserved_bytes: int
    """Predicted `torch.cuda.max_memory_reserved()`: the largest over the moments of what
    is alive, each block rounded as PyTorch's caching allocator rounds it (no
    fragmentation allowance)."""
    device_bytes: int
    """Predicted device memory in use (`nvidia-smi`): reserved (the cuBLAS workspaces'
    segments included) plus NCCL's buffers of each communicator and the CUDA context.
    `fits` is decided on it (schema 2)."""
    nccl_bytes: int
    """NCCL's buffers of the process groups one GPU belongs to."""
    moment: str
    """The moment of the peak: "start", "warm-up end", "loss forward", "loss backward",
    "output layer backward", "output layer reduce-scatter", "layer backward",
    "embeddings reduce-scatter", "cool-down end" or "optimizer step"."""
    stage: int
    """The pipeline stage whose GPUs reach it."""
    steady_bytes: int
    """That stage's `total_bytes`: the sum of its steady-state components."""
    alive: tuple[LiveBuffer, ...] = ()
    """What is alive at the peak: the steady-state components, then the transients."""
    cuda_context_bytes: int = 0
    """The framework profile's CUDA context (`cuda_context_bytes`), in `device_bytes`; 0
    in plans written before it was counted."""
    workspace_bytes: int = 0
    """The caching-allocator segments of the cuBLAS workspaces: PyTorch's (the profile's
    `blas_workspace_bytes` for the GPU's architecture) and, under a profile with
    `transformer_engine_workspace`, Transformer Engine's; taken at the first GEMM and
    kept, so counted in `allocated_bytes` (their bytes) and `reserved_bytes` (these
    segments), and so in `device_bytes`; 0 in plans written before it was counted."""
    fp8_weight_copies_bytes: int = 0
    """The fp8 copies of the layers' linear weights (as they are and transposed) that the
    peak stage's GPUs keep through the step beside the weights, in `allocated_bytes`:
    Transformer Engine's weight workspaces under a profile with `fp8_weight_cache`
    (megatron-core, nemo), with `[precision] linear` in an fp8 format; 0 otherwise."""
