"""The memory peak of a training step as the framework allocates it: a few moments per
kind of stage, in closed form, each the stage's steady state (its `total_bytes`, or its
model states and buffers where no activations are alive) plus the transient buffers
alive then.

    start                 states + buffers (+ persistent stack buffers)
    warm-up end           states + buffers + activations of the micro-batches in flight
    loss forward          ... + the logits and their fp32 copies (last stage)
    loss backward         ... + the loss's gradients (last stage)
    output layer backward ... + the logits' gradient, the output layer's weight gradient
    layer backward        ... + one layer's recomputed tensors and backward working set
    cool-down end         states + buffers + one micro-batch's activations
    optimizer step        states + buffers + the optimizer's temporaries

allocated = max over stages and moments (`torch.cuda.max_memory_allocated()`);
reserved  = what is alive then, each block rounded as PyTorch's caching allocator
            rounds it (`max_memory_reserved()`);
device    = reserved + NCCL's buffers per communicator (`nvidia-smi`, a lower bound).

Steady state <= allocated <= steady state + every transient of the stage (tests hold
it). Computed once per plan, never in the search: plans' schema-1 `total_bytes` and
`fits` keep their meaning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import StageKinds
from llmpar.evaluation.memory import bytes_per_parameter
from llmpar.evaluation.stages import hybrid_kinds, layer_kinds, recomputed_layers
from llmpar.footprint.activations.common import FP32_BYTES, INSIDE_TP, OUTSIDE_TP
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.inventory import SPLIT_TENSOR, SavedTensor
from llmpar.plan_records import (
    CollectiveCost,
    Derivation,
    LiveBuffer,
    MemoryPeak,
    SavedTensorRow,
    StageMemory,
)
from llmpar.spec import Spec
from llmpar.spec.framework import KERNEL_ACTIVATION_MODELS
from llmpar.strategy import Stage

MiB = 2**20
K_MIN_BLOCK_BYTES = 512
"""PyTorch's caching allocator rounds every request up to a multiple of 512 bytes
(kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp)."""
K_MIN_LARGE_ALLOC_BYTES = 10 * MiB
"""Requests between 1 MiB (kSmallSize) and 10 MiB (kMinLargeAlloc) share 20 MiB segments
(kLargeBuffer), smaller ones 2 MiB segments (kSmallBuffer); larger requests get a
segment of their own, rounded up to 2 MiB (kRoundLarge): same file."""
K_ROUND_LARGE_BYTES = 2 * MiB
NCCL_BUFFSIZE_BYTES = 4 * MiB
"""NCCL_BUFFSIZE's default, 4194304 bytes: the buffer of one channel towards one peer
(NCCL User Guide, Environment Variables, NCCL_BUFFSIZE)."""
NCCL_RING_PEERS = 2
"""A ring connects each rank to the rank before it and the one after it."""
NCCL_MIN_CHANNELS = 1
"""Channels per communicator counted: one, so that device memory is a lower bound (NCCL
opens more on NVLink and InfiniBand topologies, chosen at run time)."""

LOSS_SOURCE = (
    "PyTorch tools/autograd/derivatives.yaml: _log_softmax saves its result and backward "
    "allocates _log_softmax_backward_data(grad, result) (aten/src/ATen/native/SoftMax.cpp); "
    "nll_loss_backward allocates a gradient of its input's size; logits.float() "
    "(_to_copy) keeps no tensor, its backward casts the gradient back")
VOCAB_PARALLEL_SOURCE = (
    "Megatron-Core megatron/core/tensor_parallel/cross_entropy.py: "
    "_VocabParallelCrossEntropy subtracts the max into a new fp32 tensor, exponentiates "
    "in place and saves it; backward turns the saved softmax into the gradient in place")
FUSED_SOURCE = ("a fused cross-entropy (Megatron-Core cross_entropy_loss_fusion) keeps the "
                "softmax in the logits' dtype and writes the gradient in place")
WGRAD_SOURCE = ("torch.autograd AccumulateGrad: a micro-batch's weight gradient is computed "
                "into a new tensor of the weight's size, then added to .grad")
TE_SOURCE = ("Transformer Engine transformer_engine/pytorch/module/base.py get_dummy_wgrad: "
             "with fuse_wgrad_accumulation each linear returns a cached empty tensor per "
             "(shape, dtype) to autograd, alive from the first backward on")
RECOMPUTE_SOURCE = ("torch.utils.checkpoint / Megatron-Core CheckpointFunction: backward "
                    "reruns one layer's forward, whose saved tensors live through that "
                    "layer's backward (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 5)")
WORKING_SET_SOURCE = ("a layer's backward holds the gradient arriving at its output and the "
                      "one it passes to its input (residual stream, b*s*h each) and the "
                      "gradient of its largest saved tensor")
FOREACH_SOURCE = ("torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = "
                  "torch._foreach_sqrt(exp_avg_sqs) copies the second moments of every "
                  "parameter the GPU updates (one parameter group holding them all)")
ALLOCATOR_SOURCE = ("PyTorch c10/cuda/CUDACachingAllocator.cpp: requests rounded to 512 B "
                    "(kMinBlockSize); a request above 10 MiB (kMinLargeAlloc) gets its own "
                    "segment rounded to 2 MiB (kRoundLarge); smaller ones are packed in 2 MiB "
                    "and 20 MiB segments (kSmallBuffer, kLargeBuffer), whose slack and any "
                    "fragmentation are not counted")
NCCL_SOURCE = ("NCCL User Guide, Environment Variables: NCCL_BUFFSIZE (default 4 MiB) per "
               "channel and peer; one communicator per strategy's process group, two ring "
               "peers, one channel (a lower bound)")
STATE_NAMES = (("weights", "weights_bytes"), ("gradients", "gradients_bytes"),
               ("optimizer states", "optimizer_bytes"))


@attrs.frozen(kw_only=True)
class MemoryMoment:
    """The allocated memory of one stage's GPUs at one modelled moment of a step."""

    stage: int
    moment: str
    """"start", "warm-up end", "loss forward", "loss backward", "output layer
    backward", "layer backward", "cool-down end" or "optimizer step"."""
    allocated_bytes: int



@attrs.frozen(kw_only=True)
class KindTransients:
    """The transient buffers of one kind of stage, bytes on one GPU, by moment."""

    persistent: tuple[LiveBuffer, ...]
    """Buffers the stack allocates once and keeps (alive at every moment)."""
    by_moment: Mapping[str, tuple[LiveBuffer, ...]]


def allocator_rounded(size: float) -> int:
    """One request's share of reserved memory under PyTorch's caching allocator."""
    if size <= 0:
        return 0
    unit = K_ROUND_LARGE_BYTES if size > K_MIN_LARGE_ALLOC_BYTES else K_MIN_BLOCK_BYTES
    return int(-(-int(round(size)) // unit) * unit)


def _buffer(name: str, size: float, source: str) -> LiveBuffer:
    return LiveBuffer(name=name, bytes=int(round(size)), source=source, transient=True)


def _split(composition: Composition, tensors: Sequence[SavedTensor]) -> float:
    return float(sum(t.bytes / composition.tag_divisor(t.splits) for t in tensors))


def _counted_loss_bytes(composition: Composition, fixed: Sequence[SavedTensor]) -> float:
    """What the activation model already keeps of the loss: the head's vocabulary-wide
    tensors other than soft-capping's tanh output."""
    return _split(composition, [t for t in fixed if t.placement == "head" and "tanh" not in
                                t.name and any(symbol == "V" for symbol, _ in t.shape)])


def _loss_buffers(spec: Spec, composition: Composition, counted: float
                  ) -> dict[str, tuple[LiveBuffer, ...]]:
    """The loss's tensors beyond what the inventory counts, at the loss's forward and
    backward (bytes per element of tokens x vocabulary / shards)."""
    model, training, profile = spec.model, spec.training, spec.training.profile
    assert model.vocab_size is not None
    d = bytes_per_element(spec.precision.activations)
    elements = (training.micro_batch_size * training.sequence_length * model.vocab_size
                / composition.tag_divisor(INSIDE_TP))
    Parts = tuple[tuple[str, float, str], ...]
    forward: Parts
    backward: Parts
    if profile.fused_cross_entropy:
        forward = (("logits", d, FUSED_SOURCE), ("softmax (kept)", d, FUSED_SOURCE))
        backward = (("softmax turned gradient (kept)", d, FUSED_SOURCE),)
    elif profile.loss_kernel == "vocab-parallel":
        forward = (("logits", d, VOCAB_PARALLEL_SOURCE),
                   ("logits.float()", FP32_BYTES, VOCAB_PARALLEL_SOURCE),
                   ("softmax (fp32, kept)", FP32_BYTES, VOCAB_PARALLEL_SOURCE))
        backward = (("softmax turned gradient (fp32, kept)", FP32_BYTES, VOCAB_PARALLEL_SOURCE),
                    ("gradient of the logits", d, VOCAB_PARALLEL_SOURCE))
    else:
        forward = (("logits", d, LOSS_SOURCE), ("logits.float()", FP32_BYTES, LOSS_SOURCE),
                   ("log-probabilities (fp32, kept)", FP32_BYTES, LOSS_SOURCE))
        backward = (("log-probabilities (fp32, kept)", FP32_BYTES, LOSS_SOURCE),
                    ("gradient of the log-probabilities (fp32)", FP32_BYTES, LOSS_SOURCE),
                    ("gradient of logits.float() (fp32)", FP32_BYTES, LOSS_SOURCE))

    def beyond(parts: Parts) -> tuple[LiveBuffer, ...]:
        """The parts, less the bytes the inventory already counts (taken off the kept
        tensor first)."""
        left, found = counted, []
        for name, size, source in parts:
            total = elements * size
            if "kept" in name:
                taken = min(left, total)
                total, left = total - taken, left - taken
            if total > 0:
                found.append(_buffer(name, total, source))
        return tuple(found)

    return {"loss forward": beyond(forward), "loss backward": beyond(backward)}


def _linear_shapes(spec: Spec, footprint: Footprint, stage: Stage) -> float:
    """Parameters of one layer's distinct linear weights on one GPU, of each kind of layer
    the stage holds (one routed expert's for MoE layers)."""
    model = spec.model
    groups = footprint.parameters_by_group
    layers = model.num_layers or 1
    dense, moe = layer_kinds(spec, stage)
    found = 0.0
    if model.mixer_pattern is not None:  # each token mixer the stage's layers have
        held, total = (model.mixers_in(stage.first_layer, stage.num_layers),
                       model.mixers_in(0, layers))
        found += sum(groups.get(kind, 0.0) / total[kind] for kind in held)
    elif dense or moe:
        found += groups.get("attention", 0.0) / layers
    if dense and model.num_dense_layers:
        found += groups.get("mlp", 0.0) / model.num_dense_layers
    if moe and model.moe is not None and model.num_moe_layers:
        per_layer = groups.get("experts", 0.0) / model.num_moe_layers
        found += per_layer / model.moe.num_experts
        found += groups.get("shared_experts", 0.0) / model.num_moe_layers
    return found


def _layer_buffers(spec: Spec, footprint: Footprint, composition: Composition,
                   stage: Stage) -> tuple[LiveBuffer, ...]:
    """One layer's backward: its recomputed tensors (under recomputation) and its working
    set, for the kind of layer of the stage that needs the most."""
    inventory = footprint.activations
    assert inventory is not None and spec.model.hidden_size is not None
    training = spec.training
    d = bytes_per_element(spec.precision.activations)
    hidden = (training.micro_batch_size * training.sequence_length * spec.model.hidden_size * d
              / composition.tag_divisor(OUTSIDE_TP))
    dense, moe = layer_kinds(spec, stage)
    present = {"dense": dense, "moe": moe, "layer": dense + moe}
    mixed = hybrid_kinds(spec, stage)
    if mixed is not None:
        present.update({**{k: 0 for k in inventory.kinds if " " in k}, **mixed})
    scores = scores_materialized(spec)
    best: tuple[LiveBuffer, ...] = ()
    for group in inventory.groups:
        if not present.get(group.kind, group.count):
            continue
        # by split tags: a few sets per layer, each divided once
        total: dict[frozenset[str], float] = {}
        largest: dict[frozenset[str], float] = {}
        attention_scores: dict[frozenset[str], float] = {}
        for t in group.tensors:
            if t.attention_score:
                attention_scores[t.splits] = attention_scores.get(t.splits, 0.0) + t.bytes
                if not scores:
                    continue
            total[t.splits] = total.get(t.splits, 0.0) + t.bytes
            largest[t.splits] = max(largest.get(t.splits, 0.0), t.bytes)
        found = list(_recomputed(spec, group.kind, stage, hidden,
                                 composition.split_bytes(total),
                                 composition.split_bytes(attention_scores) if scores else 0.0))
        found += [_buffer("gradients at the layer's output and input", 2 * hidden,
                          WORKING_SET_SOURCE),
                  _buffer("gradient of the layer's largest saved tensor",
                          max((size / composition.tag_divisor(tags)
                               for tags, size in largest.items()), default=0.0),
                          WORKING_SET_SOURCE)]
        if sum(b.bytes for b in found) > sum(b.bytes for b in best):
            best = tuple(found)
    return best


def scores_materialized(spec: Spec) -> bool:
    """Whether the attention kernel the stack runs writes the s x s scores: a fused
    kernel (FlashAttention, cuDNN, SDPA's flash backend) never does, whatever the
    activation model's accounting keeps (Dao 2023, arXiv:2307.08691)."""
    kernel = spec.training.profile.attention_kernel
    return KERNEL_ACTIVATION_MODELS[kernel] != "fused"


def _recomputed(spec: Spec, kind: str, stage: Stage, checkpoint: float, layer_bytes: float,
                scores_bytes: float) -> tuple[LiveBuffer, ...]:
    mode = spec.training.recompute
    if mode == "full" and recomputed_layers(spec, stage):
        # the checkpoint (the layer's input) stays counted in the steady state
        return (_buffer(f"recomputed {kind} layer's saved tensors",
                        max(0.0, layer_bytes - checkpoint), RECOMPUTE_SOURCE),)
    if mode == "selective" and scores_bytes:
        return (_buffer("recomputed attention scores of one layer", scores_bytes,
                        RECOMPUTE_SOURCE),)
    return ()


def _output_layer_buffers(spec: Spec, composition: Composition,
                          parameters: Mapping[str, float]) -> tuple[LiveBuffer, ...]:
    model, training = spec.model, spec.training
    assert model.vocab_size is not None and model.hidden_size is not None
    d = bytes_per_element(spec.precision.activations)
    tokens = training.micro_batch_size * training.sequence_length
    head = parameters.get("head", 0.0) or (parameters.get("embedding", 0.0)
                                            if model.tie_embeddings else 0.0)
    return (
        _buffer("gradient of the logits", tokens * model.vocab_size * d
                / composition.tag_divisor(INSIDE_TP), LOSS_SOURCE),
        _buffer("output layer's weight gradient", min(head, model.vocab_size
                * model.hidden_size) * d / composition.tag_divisor((SPLIT_TENSOR,)),
                WGRAD_SOURCE),
        _buffer("gradient of the output layer's input", tokens * model.hidden_size * d
                / composition.tag_divisor(OUTSIDE_TP), LOSS_SOURCE),
    )


def _optimizer_buffers(spec: Spec, optimizer_bytes: float) -> tuple[LiveBuffer, ...]:
    if spec.training.profile.optimizer_kernel != "foreach":
        return ()
    per_parameter = bytes_per_parameter(spec)["optimizer"]
    moments = [s for s in spec.optimizer.kept_states(spec.precision.weights) if not s.master]
    if len(moments) < 2 or not per_parameter:
        return ()
    size = bytes_per_element(moments[-1].dtype)
    return (_buffer("foreach copy of the second moments (sqrt)",
                    optimizer_bytes / per_parameter * size, FOREACH_SOURCE),)


def kind_transients(spec: Spec, footprint: Footprint, composition: Composition,
                    stage: Stage, parameters: Mapping[str, float], optimizer_bytes: float,
                    layers: dict[tuple[bool, ...], tuple[LiveBuffer, ...]] | None = None
                    ) -> KindTransients:
    """The transients of the kind of stage `stage` stands for (`layers`: the layer
    backward's buffers already found, by what decides them)."""
    persistent: tuple[LiveBuffer, ...] = ()
    if spec.training.profile.dummy_weight_gradients and stage.num_layers:
        size = (_linear_shapes(spec, footprint, stage) * bytes_per_element(
            spec.precision.activations) / composition.tag_divisor((SPLIT_TENSOR,)))
        persistent = (_buffer("Transformer Engine dummy weight gradients", size, TE_SOURCE),)
    moments: dict[str, tuple[LiveBuffer, ...]] = {}
    inventory = footprint.activations
    if inventory is not None and stage.has_head and spec.model.vocab_size:
        counted = _counted_loss_bytes(composition, inventory.fixed)
        moments.update(_loss_buffers(spec, composition, counted))
        moments["output layer backward"] = _output_layer_buffers(spec, composition, parameters)
    if inventory is not None and stage.num_layers and inventory.groups:
        dense, moe = layer_kinds(spec, stage)
        key = (dense > 0, moe > 0, recomputed_layers(spec, stage) > 0)
        found = None if layers is None else layers.get(key)
        if found is None:
            found = _layer_buffers(spec, footprint, composition, stage)
            if layers is not None:
                layers[key] = found
        moments["layer backward"] = found
    moments["optimizer step"] = _optimizer_buffers(spec, optimizer_bytes)
    return KindTransients(persistent=persistent, by_moment=moments)


ACTIVE_MOMENTS = ("warm-up end", "loss forward", "loss backward", "output layer backward",
                  "layer backward")
"""Moments at which the activations of every micro-batch in flight are alive."""


def _stage_moments(record: StageMemory, transients: KindTransients
                   ) -> list[tuple[str, int, tuple[LiveBuffer, ...]]]:
    fixed = record.total_bytes - (record.activations_bytes or 0)
    persistent = sum(b.bytes for b in transients.persistent)
    in_flight = max(record.micro_batches_in_flight, 1.0)
    one = int((record.activations_bytes or 0) / in_flight)
    found: list[tuple[str, int, tuple[LiveBuffer, ...]]] = [("start", fixed + persistent, ())]
    for moment in ACTIVE_MOMENTS:
        if moment != "warm-up end" and moment not in transients.by_moment:
            continue
        alive = transients.by_moment.get(moment, ())
        found.append((moment, record.total_bytes + persistent + sum(b.bytes for b in alive),
                      alive))
    found.append(("cool-down end", fixed + persistent + one, ()))
    alive = transients.by_moment.get("optimizer step", ())
    found.append(("optimizer step", fixed + persistent + sum(b.bytes for b in alive), alive))
    return found


def _steady_buffers(record: StageMemory, moment: str, activation_source: str
                    ) -> list[LiveBuffer]:
    found = [LiveBuffer(name=name, bytes=getattr(record, field), source="model states "
                        "(ZeRO, Rajbhandari et al. 2020, Sec. 3.1)")
             for name, field in STATE_NAMES]
    if moment in ACTIVE_MOMENTS and record.activations_bytes:
        found.append(LiveBuffer(name="activations", bytes=record.activations_bytes,
                                source=activation_source))
    if record.buffers_bytes:
        found.append(LiveBuffer(name="buffers", bytes=record.buffers_bytes,
                                source="the strategies' communication buffers (gathered "
                                       "weights in flight included)"))
    return found


def _reserved(alive: Sequence[LiveBuffer], rows: Sequence[SavedTensorRow],
              in_flight: float) -> int:
    """Each alive block rounded by the caching allocator; the activations tensor by
    tensor (`rows`: one micro-batch's saved tensors on one GPU)."""
    total = 0
    for item in alive:
        if item.name == "activations" and rows:
            total += int(sum(allocator_rounded(row.bytes) * row.layers for row in rows)
                         * in_flight)
        else:
            total += allocator_rounded(item.bytes)
    return total


def nccl_bytes(collectives: Sequence[CollectiveCost]) -> tuple[int, int]:
    """(communicators, their buffers' bytes) of one GPU: one communicator per strategy
    whose collectives span more than one GPU."""
    groups = {c.strategy for c in collectives if c.group_size > 1}
    return len(groups), len(groups) * NCCL_BUFFSIZE_BYTES * NCCL_RING_PEERS * NCCL_MIN_CHANNELS


def kinds_transients(spec: Spec, footprint: Footprint, composition: Composition,
                     kinds: StageKinds, records: Sequence[StageMemory],
                     parameters: Sequence[Mapping[str, float]]) -> tuple[KindTransients, ...]:
    """Each kind of stage's transients."""
    layers: dict[tuple[bool, ...], tuple[LiveBuffer, ...]] = {}
    return tuple(kind_transients(spec, footprint, composition, kinds.representatives[k],
                                 parameters[k], records[kinds.members[k][0]].optimizer_bytes,
                                 layers)
                 for k in range(len(kinds.members)))


def step_timeline(stages: Sequence[Stage], kinds: StageKinds, records: Sequence[StageMemory],
                  transients: Sequence[KindTransients]) -> tuple[MemoryMoment, ...]:
    """Every stage's allocated memory at each modelled moment of a step."""
    return tuple(MemoryMoment(stage=stage.index, moment=moment, allocated_bytes=int(size))
                 for stage, kind, record in zip(stages, kinds.kind_of, records)
                 for moment, size, _ in _stage_moments(record, transients[kind]))


def peak_candidates(kinds: StageKinds, records: Sequence[StageMemory]) -> tuple[int, ...]:
    """Per kind of stage, the stage with the most micro-batches in flight (the first of
    them): it reaches the kind's largest moments (the moments without activations are
    the same on every stage of a kind)."""
    return tuple(max(members, key=lambda i: (records[i].micro_batches_in_flight, -i))
                 for members in kinds.members)


def memory_peak(spec: Spec, footprint: Footprint, composition: Composition,
                stages: Sequence[Stage], kinds: StageKinds, records: Sequence[StageMemory],
                parameters: Sequence[Mapping[str, float]],
                rows_of: Mapping[int, Sequence[SavedTensorRow]],
                collectives: Sequence[CollectiveCost],
                activation_source: str) -> tuple[MemoryPeak, tuple[Derivation, ...]]:
    """The step's memory peak over every stage; `rows_of` maps a stage index to its saved
    tensors (one micro-batch, after splits) where known. One stage per kind is evaluated
    (`peak_candidates`)."""
    transients = kinds_transients(spec, footprint, composition, kinds, records, parameters)
    best = None
    for kind, index in enumerate(peak_candidates(kinds, records)):
        record = records[index]
        for moment, size, alive in _stage_moments(record, transients[kind]):
            if best is None or size > best[0] or (size == best[0] and index < best[1]):
                best = (size, index, moment, kind, record, alive)
    assert best is not None
    allocated, index, moment, kind, record, alive_transients = best
    alive = tuple(_steady_buffers(record, moment, activation_source)) + (
        transients[kind].persistent + alive_transients)
    reserved = _reserved(alive, rows_of.get(index, ()), record.micro_batches_in_flight)
    communicators, nccl = nccl_bytes(collectives)
    peak = MemoryPeak(allocated_bytes=int(allocated), reserved_bytes=reserved,
                      device_bytes=reserved + nccl, nccl_bytes=nccl, moment=moment,
                      stage=record.stage, steady_bytes=record.total_bytes, alive=alive)
    return peak, _derivations(peak, communicators)


def _derivations(peak: MemoryPeak, communicators: int) -> tuple[Derivation, ...]:
    transient = [b for b in peak.alive if b.transient]
    listed = "; ".join(f"{b.name} {b.bytes:,} B" for b in peak.alive)
    return (
        Derivation(quantity="peak_allocated_bytes", value=peak.allocated_bytes, unit="bytes",
                   rule=(f"max over stages and moments of steady state + transients; the "
                         f"peak: stage {peak.stage} at '{peak.moment}' = {listed}"),
                   source="; ".join(dict.fromkeys(b.source for b in transient))
                   or "the stage's steady state",
                   inputs={"steady_bytes": peak.steady_bytes, "stage": peak.stage,
                           "moment": peak.moment}),
        Derivation(quantity="peak_reserved_bytes", value=peak.reserved_bytes, unit="bytes",
                   rule="sum over what is alive at the peak of each block rounded by the "
                        "caching allocator (activations tensor by tensor)",
                   source=ALLOCATOR_SOURCE, inputs={"allocated_bytes": peak.allocated_bytes}),
        Derivation(quantity="device_bytes", value=peak.device_bytes, unit="bytes",
                   rule="peak_reserved_bytes + communicators * NCCL_BUFFSIZE * ring peers * "
                        "channels (CUDA context and library workspaces not counted)",
                   source=NCCL_SOURCE,
                   inputs={"communicators": communicators, "nccl_bytes": peak.nccl_bytes}),
    )
