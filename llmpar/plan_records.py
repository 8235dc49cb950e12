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
    """Predicted `torch.cuda.max_memory_reserved()`: what is alive at the peak, each
    block rounded as PyTorch's caching allocator rounds it (no fragmentation allowance)."""
    device_bytes: int
    """Predicted device memory in use (`nvidia-smi`): reserved plus NCCL's buffers of
    each communicator; the CUDA context and library workspaces are not counted."""
    nccl_bytes: int
    """NCCL's buffers of the process groups one GPU belongs to."""
    moment: str
    """The moment of the peak: "start", "warm-up end", "loss forward", "loss backward",
    "output layer backward", "layer backward", "cool-down end" or "optimizer step"."""
    stage: int
    """The pipeline stage whose GPUs reach it."""
    steady_bytes: int
    """That stage's `total_bytes`: the sum of its steady-state components."""
    alive: tuple[LiveBuffer, ...] = ()
    """What is alive at the peak: the steady-state components, then the transients."""
