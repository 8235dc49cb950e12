"""The memory peak of a training step as the framework allocates it: a few moments per
kind of stage, in closed form, each the stage's steady state (its `total_bytes`, or its
model states and buffers where no activations are alive) plus the transient buffers
alive then (`llmpar.evaluation.transients`).

    start                 states + buffers (+ persistent stack buffers: the cuBLAS
                          workspaces, Transformer Engine's dummy weight gradients and
                          fp8 weight copies)
    warm-up end           states + buffers + activations of the micro-batches in flight
    loss forward          ... + the logits and their fp32 copies (last stage)
    loss backward         ... + the loss's gradients (last stage)
    output layer backward ... + the logits' gradient, the output layer's weight gradient
    output layer reduce-scatter ... + FSDP's reduce-scatter of [norm, output] (torchtitan)
    layer backward        ... + one layer's recomputed tensors and backward working set
    embeddings reduce-scatter   states + buffers + FSDP's reduce-scatter of the unit
                          holding the embeddings (the root unit's, or its own)
    cool-down end         states + buffers + one micro-batch's activations
    optimizer step        states + buffers + the optimizer's temporaries

Under FSDP / ZeRO-3 the buffers hold two transformer blocks' gathered weights (the
running one and the prefetched one); the embeddings' and the output layer's units add
their gathered weights at the moments the stack keeps them (`edge_unit_blocks`).

allocated = max over stages and moments (`torch.cuda.max_memory_allocated()`);
reserved  = max over stages and moments of what is alive, each block rounded as
            PyTorch's caching allocator rounds it (`max_memory_reserved()`);
device    = reserved + NCCL's buffers per communicator + the CUDA context
            (`nvidia-smi`): what `fits` is decided on. The cuBLAS workspaces (PyTorch's,
            and Transformer Engine's under a profile that runs its GEMMs) are taken from
            the caching allocator and kept: counted in allocated and reserved, each in
            the segment it gets (`workspace_blocks`).

Steady state <= allocated <= steady state + every transient of the stage (tests hold
it). Every number may be an array over a search node (`peak_core`, the search's
verdict); `memory_peak` names the moment and what is alive for one layout, from the
same moments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from llmpar.arrays import Value, is_array, logical_or, maximum, minimum, rounded, where
from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.casts import COPIES, WEIGHT_COPY_SOURCE, weight_copy_bytes
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import StageKinds, TrainingFacts
from llmpar.evaluation.memory import MemoryCore, activation_bytes, bytes_per_parameter
from llmpar.evaluation.transients import KindParts, Part
from llmpar.plan_records import Derivation, LiveBuffer, MemoryPeak, StageMemory
from llmpar.spec import Spec
from llmpar.strategy import Stage

MiB = 2**20
K_MIN_BLOCK_BYTES = 512
"""PyTorch's caching allocator rounds every request up to a multiple of 512 bytes
(kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp)."""
K_SMALL_SIZE_BYTES = 1 * MiB
"""Requests up to 1 MiB (kSmallSize) share 2 MiB segments (kSmallBuffer)."""
K_SMALL_BUFFER_BYTES = 2 * MiB
K_MIN_LARGE_ALLOC_BYTES = 10 * MiB
"""Requests between 1 MiB (kSmallSize) and 10 MiB (kMinLargeAlloc) share 20 MiB segments
(kLargeBuffer), smaller ones 2 MiB segments (kSmallBuffer); larger requests get a
segment of their own, rounded up to 2 MiB (kRoundLarge): same file."""
K_LARGE_BUFFER_BYTES = 20 * MiB
K_ROUND_LARGE_BYTES = 2 * MiB
NCCL_BUFFSIZE_BYTES = 4 * MiB
"""NCCL_BUFFSIZE's default, 4194304 bytes: the buffer of one channel towards one peer
(NCCL User Guide, Environment Variables, NCCL_BUFFSIZE)."""
NCCL_RING_PEERS = 2
"""A ring connects each rank to the rank before it and the one after it."""
NCCL_MIN_CHANNELS = 1
"""Channels per communicator counted: one, so that NCCL's share is a lower bound (NCCL
opens more on NVLink and InfiniBand topologies, chosen at run time)."""

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
DEVICE_SOURCE = ("the framework profile's cuda_context_bytes (CUDA context under lazy module "
                 "loading, pytorch/pytorch #109888); the cuBLAS workspaces are in the "
                 "reserved peak (workspace_blocks)")
WORKSPACE_SOURCE = ("PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle "
                    "takes the handle's workspace of getChosenWorkspaceSize() "
                    "(CUBLAS_WORKSPACE_CONFIG; the profile's blas_workspace_bytes) from "
                    "c10::cuda::CUDACachingAllocator at the first GEMM and keeps it per "
                    "handle and stream")
TE_WORKSPACE_SOURCE = ("Transformer Engine transformer_engine/pytorch/module/base.py "
                       "get_workspace: a torch.empty of get_cublas_workspace_size_bytes() "
                       "(cpp_extensions/gemm.py, TE 2.x: 32 MiB from compute capability 9.0, "
                       "4 MiB below) made at the first GEMM and kept in a module global")
STATE_SOURCE = "model states (ZeRO, Rajbhandari et al. 2020, Sec. 3.1)"
BUFFER_SOURCE = "the strategies' communication buffers (gathered weights in flight included)"
STATE_NAMES = (("weights", "weights"), ("gradients", "gradients"),
               ("optimizer states", "optimizer"))
ACTIVE_MOMENTS = ("warm-up end", "loss forward", "loss backward", "output layer backward",
                  "output layer reduce-scatter",
                  "layer backward")
"""Moments at which the activations of every micro-batch in flight are alive."""


@attrs.frozen(kw_only=True)
class MemoryMoment:
    """The allocated memory of one stage's GPUs at one modelled moment of a step."""

    stage: int
    moment: str
    """"start", "warm-up end", "loss forward", "loss backward", "output layer
    backward", "output layer reduce-scatter", "layer backward", "embeddings
    reduce-scatter", "cool-down end" or "optimizer step"."""
    allocated_bytes: int


@attrs.frozen(kw_only=True)
class Block:
    """One thing alive at a moment, bytes on one GPU (a number or an array)."""

    name: str
    size: Value
    source: str
    transient: bool
    reserved: Value
    """Its share of reserved memory under the caching allocator."""


@attrs.frozen(kw_only=True)
class Moment:
    name: str
    allocated: Value
    reserved: Value
    blocks: tuple[Block, ...]
    """What is alive (one layout; under arrays, the first option's buffers)."""


@attrs.frozen(kw_only=True)
class PeakCore:
    """The three numbers of the peak, for one layout or every layout of a search node."""

    allocated: Value
    reserved: Value
    device: Value
    nccl: Value
    communicators: Value
    context: int
    workspace: int


def allocator_rounded(size: Value) -> Value:
    """One request's share of reserved memory under PyTorch's caching allocator."""
    if is_array(size):
        unit = np.where(size > K_MIN_LARGE_ALLOC_BYTES, K_ROUND_LARGE_BYTES, K_MIN_BLOCK_BYTES)
        return np.where(size > 0, np.ceil(np.rint(size) / unit) * unit, 0.0)
    if size <= 0:
        return 0
    block = K_ROUND_LARGE_BYTES if size > K_MIN_LARGE_ALLOC_BYTES else K_MIN_BLOCK_BYTES
    return int(-(-int(round(size)) // block) * block)


EXPANDABLE_SOURCE = ("PyTorch c10/cuda/CUDACachingAllocator.cpp under expandable_segments: "
                     "one segment per pool and stream grows by mapping kLargeBuffer (20 MiB) "
                     "pages (find_expandable_block, map_block) and blocks split to 512 B "
                     "(should_split), so reserved is allocated rounded up to 20 MiB")


def expandable_reserved(allocated: Value) -> Value:
    """Reserved memory under expandable segments: the allocated bytes mapped in 20 MiB
    pages (kLargeBuffer); the small pool's 2 MiB pages and the holes between live blocks
    are not counted."""
    if is_array(allocated):
        return np.ceil(np.asarray(allocated) / K_LARGE_BUFFER_BYTES) * K_LARGE_BUFFER_BYTES
    return int(-(-int(allocated) // K_LARGE_BUFFER_BYTES) * K_LARGE_BUFFER_BYTES)


def segment_bytes(size: int) -> int:
    """The caching allocator's segment for a lone request: 2 MiB up to 1 MiB
    (kSmallBuffer), 20 MiB up to 10 MiB (kLargeBuffer), else the request rounded to 2 MiB
    (c10/cuda/CUDACachingAllocator.cpp)."""
    if size <= 0:
        return 0
    if size <= K_SMALL_SIZE_BYTES:
        return K_SMALL_BUFFER_BYTES
    if size < K_MIN_LARGE_ALLOC_BYTES:
        return K_LARGE_BUFFER_BYTES
    return -(-size // K_ROUND_LARGE_BYTES) * K_ROUND_LARGE_BYTES


def part_bytes(composition: Composition, part: Part) -> Value:
    """A part's bytes on one GPU under the layout's splits."""
    if part.largest:
        found: Value = 0.0
        for tags, size in part.tags.items():
            found = maximum(found, size / composition.tag_divisor(tags))
        return rounded(found)
    return rounded(maximum(composition.split_bytes(part.tags), 0.0))


def loss_bytes(composition: Composition, parts: Sequence[Part],
               counted: Mapping[frozenset[str], float]) -> list[Value]:
    """The loss's parts less what the activation model already counts (taken off the kept
    tensors first)."""
    left = composition.split_bytes(counted)
    found = []
    for part in parts:
        total = composition.split_bytes(part.tags)
        if part.kept:
            taken = minimum(left, total)
            total, left = total - taken, left - taken
        found.append(rounded(total))
    return found


def foreach_share(spec: Spec) -> float:
    """Bytes of the optimizer step's foreach copy per byte of optimizer state: one copy of
    the last non-master state (the second moments) under the "foreach" kernel."""
    if spec.training.profile.optimizer_kernel != "foreach":
        return 0.0
    per_parameter = bytes_per_parameter(spec)["optimizer"]
    moments = [s for s in spec.optimizer.kept_states(spec.precision.weights) if not s.master]
    if len(moments) < 2 or not per_parameter:
        return 0.0
    return bytes_per_element(moments[-1].dtype) / per_parameter


def _block(name: str, size: Value, source: str, transient: bool = True) -> Block:
    return Block(name=name, size=size, source=source, transient=transient,
                 reserved=allocator_rounded(size))


def _parts(composition: Composition, parts: Sequence[Part]) -> list[Block]:
    return [_block(p.name, part_bytes(composition, p), p.source) for p in parts]


def _sum(blocks: Sequence[Block], field: str = "size") -> Value:
    total: Value = 0
    for block in blocks:
        total = total + getattr(block, field)
    return total


def rounded_tensors(composition: Composition, parts: KindParts) -> Value:
    """One micro-batch's saved tensors as the caching allocator holds them: each rounded
    on its own (`allocator_rounded`), summed. Integers, so the same in any order: the
    tensors of one split are rounded in one pass where the numbers are arrays."""
    total: Value = 0
    for tags, (sizes, counts) in parts.tensors_by_tags.items():
        divisor = composition.tag_divisor(tags)
        if isinstance(sizes, tuple) and not is_array(divisor):
            for size, count in zip(sizes, counts):
                total = total + count * allocator_rounded(size / divisor)
            continue
        if isinstance(sizes, tuple):  # numbers, split by an array
            sizes = np.asarray(sizes, dtype=float).reshape((-1,) + (1,) * np.ndim(divisor))
            counts = np.asarray(counts, dtype=float).reshape(sizes.shape)
        total = total + (counts * allocator_rounded(sizes / divisor)).sum(axis=0)
    return total


def unsharded_blocks(spec: Spec, composition: Composition, parameters: Mapping[str, float],
                     pipelined: bool) -> tuple[list[Block], list[Block]]:
    """(weights, gradients) a stage keeps unsharded through the step under a profile
    that does so (`Framework.pipeline_keeps_unsharded`) with pipeline parallelism: the
    stage's weights as the data strategy's ZeRO-3 / FSDP shard gathers them (in the
    format its all-gathers carry, `Precision.weight_gather_under`, as its gather
    buffers are: fp8 under torchao's fp8 all-gather) and their
    gradients accumulated in the gradients' format (its reduce_dtype), where that shard
    applies."""
    if not pipelined or not spec.training.profile.pipeline_keeps_unsharded:
        return [], []
    sharded = composition.held(parameters, 1.0, "weights")
    whole = composition.held(parameters, 1.0, "weights", without="data")
    gathered = where(whole > sharded, whole, 0.0)
    source = ("torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy "
              "(torchtitan 0.2.2: no reshard after forward under pipeline parallelism); "
              "torch/distributed/pipelining/stage.py backward_maybe_with_nosync (PyTorch "
              "2.10: no reshard after backward, gradient sync on the last backward only)")
    return ([_block("unsharded weights of the stage", rounded(gathered * bytes_per_element(
                spec.precision.weight_gather_under(spec.training.profile))), source)],
            [_block("unsharded gradients of the stage, reduce-scattered after the last "
                    "micro-batch", rounded(gathered * bytes_per_element(spec.gradients_dtype)),
                    source)])


FP8_COPIES_NAME = "fp8 weight copies"
WORKSPACE_NAMES = ("cuBLAS workspace (PyTorch)", "cuBLAS workspace (Transformer Engine)")


def workspace_blocks(spec: Spec) -> list[Block]:
    """The cuBLAS workspaces a training process keeps from its first GEMM on, as
    persistent blocks of allocated memory, each reserved in the segment a lone early
    request gets (`segment_bytes`): PyTorch's (`Framework.blas_workspace_for`) and, under
    a profile whose linears run Transformer Engine's GEMMs, Transformer Engine's
    (`Framework.te_workspace_for`); none of a size 0."""
    profile = spec.training.profile
    architecture = spec.hardware.gpu.architecture
    found = []
    blas = profile.blas_workspace_for(architecture) if profile.blas_workspace_allocated else 0
    for name, size, source in (
            (WORKSPACE_NAMES[0], blas, WORKSPACE_SOURCE),
            (WORKSPACE_NAMES[1], profile.te_workspace_for(architecture), TE_WORKSPACE_SOURCE)):
        if size:
            found.append(Block(name=name, size=size, source=source, transient=True,
                               reserved=segment_bytes(size)))
    return found


def fp8_copy_blocks(spec: Spec, composition: Composition,
                    parameters: Mapping[str, float]) -> list[Block]:
    """The fp8 weight copies a stage keeps through the step, as one persistent block
    (`llmpar.evaluation.casts.weight_copy_bytes`); none where there are none."""
    size = weight_copy_bytes(spec, composition, parameters)
    if isinstance(size, (int, float)) and size == 0:
        return []
    return [_block(FP8_COPIES_NAME, size, WEIGHT_COPY_SOURCE)]


EDGE_SOURCE = {
    "root": ("FSDP2 fully_shard on each block and on the model: the root unit (embeddings, "
             "final norm, output layer) is never resharded after forward (torch/distributed/"
             "fsdp/_fully_shard/_fsdp_state.py FSDPState._lazy_init, PyTorch 2.4 on), so it "
             "stays gathered from the first forward to the end of the backward"),
    "separate": ("torchtitan/models/llama3/infra/parallelize.py apply_fsdp (torchtitan "
                 "0.2.0 to 0.2.2): [norm, output] is a unit with reshard_after_forward = "
                 "False under the 'default' policy, gathered from its forward through its "
                 "backward, when the last block's gather is prefetched"),
    "per-module": ("each module gathered around its own forward and backward (DeepSpeed "
                   "ZeRO-3's submodule fetch; Megatron-Core torch_fully_sharded_data_"
                   "parallel.py wraps the output layer with reshard_after_forward): the "
                   "output layer's gather with the last block's prefetched in its backward"),
}
EDGE_GROUPS = ("embedding", "head")
"""The parameter groups outside the transformer blocks that FSDP gathers as units of
their own or the root's."""
EDGE_MOMENTS: Mapping[str, Mapping[str, int]] = {
    # moment -> blocks gathered beside the edge unit then (of the two the buffers count)
    "root": {"warm-up end": 0, "loss forward": 0, "loss backward": 0,
             "output layer backward": 1, "layer backward": 2},
    "separate": {"warm-up end": 0, "loss forward": 0, "loss backward": 0,
                 "output layer backward": 1},
    "per-module": {"output layer backward": 1},
}
"""When each way of wrapping (`Framework.fsdp_edge_units`) holds the edge unit gathered,
and how many blocks are gathered beside it. Under "separate" and "per-module" the
embeddings' gather, prefetched at the first layer's backward beside that layer's, comes
when the micro-batch's other layers' tensors are freed: not counted (below the layer
backward moment wherever the embeddings are smaller than the activations freed)."""


def edge_unit_blocks(spec: Spec, composition: Composition, parameters: Mapping[str, float],
                     parts: KindParts, pipelined: bool) -> dict[str, Block]:
    """The embeddings' and the output layer's gathered weights beyond the two blocks the
    data strategy's buffers count, by moment: edge + k x block - 2 x block where positive
    (k: `EDGE_MOMENTS`), in the weight gathers' format, under the model-parallel splits
    but not the data shard; none where no data shard gathers the weights, or where the
    stage keeps all its weights gathered (`unsharded_blocks`, and `[parallel.data]
    reshard_after_forward = false`, whose held weights the buffers count)."""
    profile = spec.training.profile
    data = spec.parallel.get("data")
    if not parts.layers or (pipelined and profile.pipeline_keeps_unsharded) or not any(
            strategy == "data" and shard.component == "weights"
            for strategy, shard in composition.shards) or (
            getattr(data, "reshard_after_forward", True) is False):
        return {}
    d = bytes_per_element(spec.precision.weight_gather_under(profile))

    def gathered(groups: Sequence[str]) -> Value:
        counts = {g: parameters[g] for g in groups if parameters.get(g)}
        if not counts:
            return 0.0
        whole = composition.held(counts, d, "weights", without="data")
        return where(whole > composition.held(counts, d, "weights"), whole, 0.0)

    units = profile.fsdp_edge_units
    tied = bool(spec.model.tie_embeddings) and not parameters.get("head")
    if units == "root" or (units == "separate" and tied):
        edge, moments = gathered(EDGE_GROUPS), EDGE_MOMENTS["root"]
    elif parts.has_loss:  # the output layer's unit, on the stage that holds it
        edge, moments = gathered(["embedding" if tied else "head"]), EDGE_MOMENTS[units]
    else:
        return {}
    if isinstance(edge, (int, float)) and edge == 0:
        return {}
    block = gathered([g for g in parameters if g not in EDGE_GROUPS]) / parts.layers
    name = ("gathered embeddings and output layer (FSDP root unit)" if moments is
            EDGE_MOMENTS["root"] else "gathered output layer (FSDP unit)")
    return {moment: _block(name, rounded(maximum(edge + (k - 2) * block, 0.0)),
                           EDGE_SOURCE[units])
            for moment, k in moments.items()}


SCATTER_SOURCE = ("FSDP2's post-backward of a unit (foreach_reduce, torch/distributed/fsdp/"
                  "_fully_shard/_fsdp_collectives.py, PyTorch 2.13): the unit's gradients are "
                  "copied into a reduce-scatter input of the whole unit in reduce_dtype "
                  "(foreach_reduce_scatter_copy_in) and reduce-scattered into a new shard "
                  "(reduce_output), added to the sharded gradients where they exist; the "
                  "unit is resharded first (FSDPParamGroup.post_backward); measured with "
                  "validation/measure_peak_fsdp.py")
SCATTER_MOMENTS: Mapping[str, Mapping[str, int]] = {
    # moment -> blocks gathered then (of the two the buffers count)
    "root": {"embeddings reduce-scatter": 0},
    "separate": {"output layer reduce-scatter": 1, "embeddings reduce-scatter": 0},
}
"""The edge units' gradient reduce-scatters under each way of wrapping
(`Framework.fsdp_edge_units`): torchtitan's [norm, output] unit right after the output
layer's backward, beside the last block's prefetched gather; the unit holding the
embeddings (torchtitan's own unit, or the root unit with the output layer) at the end of
the backward, when every block is resharded and the activations are freed. Under
"per-module" (DeepSpeed's bucketed reduce-scatters, Megatron-Core's buffers) none."""


def reduce_scatter_blocks(spec: Spec, composition: Composition,
                          parameters: Mapping[str, float], parts: KindParts, pipelined: bool,
                          freed: Value) -> dict[str, list[Block]]:
    """What an edge unit's gradient reduce-scatter holds beside the moment's steady state
    (`SCATTER_MOMENTS`), by moment, on one GPU under the model-parallel splits: the
    reduce-scatter input, the unit's unsharded parameters in the reduce format (the data
    strategy's `reduce_dtype`, else the gradients'), less the gathered blocks the buffers
    count that FSDP has freed by then; the gradient of the unit's largest weight in the
    compute format (the gathered weights'), which the autograd engine still holds (measured);
    and the new shard in the reduce format where the sharded gradients exist already (a
    later micro-batch, or a profile that keeps them), or where none of the step's are
    counted then (the output layer's, before the blocks'). None under a profile without
    `Framework.reduce_scatter_copy_in`, where `edge_unit_blocks` gives none for want of a
    weight shard, or where the stage keeps its weights gathered."""
    profile = spec.training.profile
    data = spec.parallel.get("data")
    moments = SCATTER_MOMENTS.get(profile.fsdp_edge_units)
    if moments is None or not profile.reduce_scatter_copy_in or not parts.layers or (
            pipelined and profile.pipeline_keeps_unsharded) or not any(
            strategy == "data" and shard.component == "weights"
            for strategy, shard in composition.shards) or (
            getattr(data, "reshard_after_forward", True) is False):
        return {}
    stated = getattr(data, "reduce_dtype", "gradients")
    reduced = bytes_per_element(spec.gradients_dtype if stated == "gradients" else stated)
    compute = bytes_per_element(spec.precision.weight_gather_under(profile))

    def whole(groups: Sequence[str], size: float, sharded: bool = False) -> Value:
        counts = {g: parameters[g] for g in groups if parameters.get(g)}
        if not counts:
            return 0.0
        return composition.held(counts, size, "weights", without=None if sharded else "data")

    block = whole([g for g in parameters if g not in EDGE_GROUPS], compute) / parts.layers
    tied = bool(spec.model.tie_embeddings) and not parameters.get("head")
    units: dict[str, tuple[str, ...]] = {}
    if profile.fsdp_edge_units == "root" or tied:
        units["embeddings reduce-scatter"] = EDGE_GROUPS
    else:
        units["embeddings reduce-scatter"] = ("embedding",)
        if parts.has_loss:
            units["output layer reduce-scatter"] = ("head",)
    found: dict[str, list[Block]] = {}
    for moment, groups in units.items():
        if moment not in moments or not any(parameters.get(g) for g in groups):
            continue
        largest = max((g for g in groups if parameters.get(g)), key=lambda g: parameters[g])
        shard = whole(groups, reduced, sharded=True)
        new = shard if moment == "output layer reduce-scatter" else where(freed, 0.0, shard)
        found[moment] = [
            _block("reduce-scatter input (whole unit, reduce format)", rounded(maximum(
                whole(groups, reduced) - (2 - moments[moment]) * block, 0.0)), SCATTER_SOURCE),
            _block("unit's unsharded gradient (its largest weight)",
                   rounded(whole([largest], compute)), SCATTER_SOURCE),
            _block("reduce-scatter output (new gradient shard)", rounded(new), SCATTER_SOURCE)]
    return found


def gradients_freed(spec: Spec, composition: Composition) -> Value:
    """Whether no gradient is alive at the loss's moments: the profile frees them after
    each step (`Framework.zero_grad_frees_gradients`) and the step runs one micro-batch,
    whose backward allocates them after the loss's (a boolean array over a search
    node)."""
    if not spec.training.profile.zero_grad_frees_gradients:
        return False
    return composition.micro_batches_per_step() == 1


def kind_moments(composition: Composition, states: Mapping[str, Value],
                 per_micro_batch: Value | None, in_flight: Value, buffers: Value,
                 parts: KindParts, share: float, activation_source: str,
                 unsharded: tuple[list[Block], list[Block]] = ([], []),
                 kept: Sequence[Block] = (), freed: Value = False,
                 edges: Mapping[str, Block] | None = None,
                 scatters: Mapping[str, Sequence[Block]] | None = None,
                 head_correction: Value = 0.0) -> list[Moment]:
    """The moments of a stage holding `states` (bytes on one GPU by component), the
    activations of `in_flight` micro-batches of `per_micro_batch` bytes each, and
    `buffers`; `parts` its kind's transients, `share` the optimizer step's foreach copy
    per byte of optimizer state, `unsharded` the weights and gradients it keeps gathered
    through the step (`unsharded_blocks`): the weights from the first forward, the
    gradients from the first backward, both to the cool-down's end; `kept` what the
    stack keeps from one step to the next beside the states (`fp8_copy_blocks`); `freed`
    (`gradients_freed`): the loss's moments hold no gradients (the layer backward keeps
    them all, an upper bound of the layers' gradients made by then); `edges`
    (`edge_unit_blocks`): the embeddings' and output layer's gathered weights by moment;
    `scatters` (`reduce_scatter_blocks`): the edge units' gradient reduce-scatters;
    `head_correction` (`KindMemory.head_correction`): the output layer's tensors of the
    micro-batches in flight the schedule does not hold."""
    edges = edges or {}
    scatters = scatters or {}
    steady = [_block(name, states[key], STATE_SOURCE, transient=False)
              for name, key in STATE_NAMES]
    fixed_blocks = steady + ([_block("buffers", buffers, BUFFER_SOURCE, transient=False)]
                             if not (isinstance(buffers, (int, float)) and buffers == 0) else [])
    persistent = _parts(composition, parts.persistent) + list(kept)
    base = fixed_blocks + persistent
    activations: Value = 0
    if per_micro_batch is not None:
        activations = rounded(per_micro_batch * in_flight)
    held = rounded_tensors(composition, parts) if parts.tensors else 0
    one = activations // maximum(in_flight, 1.0)
    active = base[:len(fixed_blocks)]
    if per_micro_batch is not None:
        active = active + [Block(name="activations", size=activations,
                                 source=activation_source, transient=False,
                                 reserved=maximum(activations, rounded(
                                     in_flight * held + head_correction)))]
    active = active + persistent
    weights, gradients = unsharded
    warming = active + weights
    active = warming + gradients

    sums: dict[int, tuple[Value, Value]] = {}

    def total(blocks: Sequence[Block]) -> tuple[Value, Value]:
        """(allocated, reserved) of `blocks`, once per list (whole numbers: any order)."""
        found = sums.get(id(blocks))
        if found is None:
            found = sums[id(blocks)] = (_sum(blocks), _sum(blocks, "reserved"))
        return found

    def moment(name: str, alive: Sequence[Block], extra: Sequence[Block] = ()) -> Moment:
        if name in edges:
            extra = tuple(extra) + (edges[name],)
        size, reserved = total(alive)
        return Moment(name=name, allocated=size + _sum(extra),
                      reserved=reserved + _sum(extra, "reserved"),
                      blocks=tuple(alive) + tuple(extra))

    found = [moment("start", base), moment("warm-up end", warming)]
    layer_alive = active
    if parts.has_loss:
        forward, backward = ([_block(p.name, size, p.source) for p, size in zip(
            listed, loss_bytes(composition, listed, parts.counted))]
            for listed in (parts.loss_forward, parts.loss_backward))
        loss_alive = active
        if not (isinstance(freed, bool) and not freed):
            # zero_grad(set_to_none=True): none made yet (torch/optim/optimizer.py)
            loss_alive = [attrs.evolve(b, size=where(freed, 0, b.size),
                                       reserved=where(freed, 0, b.reserved))
                          if b.name == "gradients" and not b.transient else b
                          for b in active]
        # The loss's backward has run: autograd has released the tensors it saved
        # (Node::release_variables, torch/csrc/autograd/function.h), the part of one
        # micro-batch's activations the activation model counts of the loss.
        released = rounded(composition.split_bytes(parts.counted)) if parts.counted else 0
        output_alive = [attrs.evolve(b, size=b.size - minimum(released, one),
                                     reserved=b.reserved - minimum(released, one))
                        if b.name == "activations" else b for b in loss_alive]
        if parts.counted:  # and so before every layer's backward that follows
            layer_alive = [attrs.evolve(b, size=b.size - minimum(released, one),
                                        reserved=b.reserved - minimum(released, one))
                           if b.name == "activations" else b for b in active]
        found += [moment("loss forward", loss_alive, forward),
                  moment("loss backward", loss_alive, backward),
                  moment("output layer backward", output_alive,
                         _parts(composition, parts.output_backward))]
        if "output layer reduce-scatter" in scatters:
            found.append(moment("output layer reduce-scatter", output_alive,
                                scatters["output layer reduce-scatter"]))
    if parts.has_layers:
        found.append(_layer_moment(composition, parts, layer_alive, total(layer_alive),
                                   edges.get("layer backward")))
    if "embeddings reduce-scatter" in scatters:
        # a micro-batch's backward is over: the others in flight keep their activations
        others = [] if per_micro_batch is None else [Block(
            name="activations (the other micro-batches in flight)", size=activations - one,
            source=activation_source, transient=False,
            reserved=maximum(activations - one, held * maximum(in_flight - 1, 0.0)))]
        found.append(moment("embeddings reduce-scatter", base[:len(fixed_blocks)] + others
                            + persistent, scatters["embeddings reduce-scatter"]))
    cooled = base[:len(fixed_blocks)]
    if per_micro_batch is not None:
        cooled = cooled + [Block(name="activations (one micro-batch)", size=one,
                                 source=activation_source, transient=False,
                                 reserved=maximum(one, held))]
    found.append(moment("cool-down end", cooled + persistent + weights + gradients))
    step = ([_block("foreach copy of the second moments (sqrt)",
                    rounded(share * states["optimizer"]), FOREACH_SOURCE)] if share else [])
    found.append(moment("optimizer step", base, step))
    return found


def _layer_moment(composition: Composition, parts: KindParts, active: Sequence[Block],
                  sums: tuple[Value, Value], edge: Block | None = None) -> Moment:
    """The layer backward: the option with the most bytes (the first of equals), and
    the edge unit's gathered weights where they are alive then."""
    best_size: Value = 0
    best_reserved: Value = 0
    chosen: tuple[Block, ...] = ()
    for option in parts.layer_options:
        blocks = tuple(_parts(composition, option))
        size, reserved = _sum(blocks), _sum(blocks, "reserved")
        better = size > best_size
        # one layout: the chosen option's buffers; arrays: the first option's (names only)
        if (not chosen) if is_array(better) else better:
            chosen = blocks
        best_reserved = where(better, reserved, best_reserved)
        best_size = where(better, size, best_size)
    every = tuple(active) + chosen
    if edge is not None:
        every += (edge,)
        best_size, best_reserved = best_size + edge.size, best_reserved + edge.reserved
    return Moment(name="layer backward", allocated=sums[0] + best_size,
                  reserved=sums[1] + best_reserved, blocks=every)


def _kind_parts(facts: TrainingFacts, kind: int) -> KindParts:
    return facts.peak_parts[kind] if facts.peak_parts else KindParts()


def communicators(composition: Composition) -> Value:
    """Process groups one GPU communicates in: one per strategy with a collective over
    more than one GPU that runs."""
    runs: dict[str, Value] = {}
    for collective, calls in composition.active_collectives():
        runs[collective.strategy] = logical_or(runs.get(collective.strategy, False), calls > 0)
    total: Value = 0
    for value in runs.values():
        total = total + where(value, 1, 0)
    return total


def device_extras(spec: Spec) -> tuple[int, int, int]:
    """(CUDA context, the cuBLAS workspaces' segments, the part of those segments outside
    the reserved peak) of one GPU, from the framework profile: the workspaces' segments
    are in the reserved peak (`workspace_blocks`) but under a profile that counts
    PyTorch's in device memory only (`Framework.blas_workspace_allocated` false)."""
    profile = spec.training.profile
    segments = sum(int(b.reserved) for b in workspace_blocks(spec))
    outside = 0 if profile.blas_workspace_allocated else segment_bytes(
        profile.blas_workspace_for(spec.hardware.gpu.architecture))
    return int(profile.cuda_context_bytes), segments + outside, outside


def peak_core(spec: Spec, composition: Composition, memory: MemoryCore,
              facts: TrainingFacts, parameters: Sequence[Mapping[str, float]],
              pipelined: bool) -> PeakCore:
    """Allocated, reserved and device peaks over every kind of stage (each at its most
    micro-batches in flight); arrays over a search node where the inputs are.
    `parameters`: each kind's parameters by group; `pipelined`: more than one stage."""
    share = foreach_share(spec)
    freed = gradients_freed(spec, composition)
    workspaces = workspace_blocks(spec)
    allocated: Value = None
    reserved: Value = None
    for position, kind in enumerate(memory.kinds):
        for m in kind_moments(composition, kind.states, kind.activations, kind.in_flight,
                              memory.buffers, _kind_parts(facts, position), share, "",
                              unsharded_blocks(spec, composition, parameters[position],
                                               pipelined),
                              fp8_copy_blocks(spec, composition, parameters[position])
                              + workspaces, freed,
                              edge_unit_blocks(spec, composition, parameters[position],
                                               _kind_parts(facts, position), pipelined),
                              reduce_scatter_blocks(spec, composition, parameters[position],
                                                    _kind_parts(facts, position), pipelined,
                                                    freed),
                              head_correction=kind.head_correction):
            allocated = m.allocated if allocated is None else maximum(allocated, m.allocated)
            reserved = m.reserved if reserved is None else maximum(reserved, m.reserved)
    if spec.training.profile.expandable_segments:
        reserved = expandable_reserved(allocated)
    groups = communicators(composition)
    nccl = groups * NCCL_BUFFSIZE_BYTES * NCCL_RING_PEERS * NCCL_MIN_CHANNELS
    context, workspace, outside = device_extras(spec)
    return PeakCore(allocated=allocated, reserved=reserved,
                    device=reserved + nccl + context + outside, nccl=nccl,
                    communicators=groups, context=context, workspace=workspace)


def peak_candidates(kinds: StageKinds, records: Sequence[StageMemory] | Sequence[Stage]
                    ) -> tuple[int, ...]:
    """Per kind of stage, the stage with the most micro-batches in flight (the first of
    them): it reaches the kind's largest moments (the moments without activations are
    the same on every stage of a kind)."""
    return tuple(max(members, key=lambda i: (records[i].micro_batches_in_flight, -i))
                 for members in kinds.members)


def step_timeline(stages: Sequence[Stage], kinds: StageKinds, memory: MemoryCore,
                  composition: Composition, facts: TrainingFacts, spec: Spec,
                  parameters: Sequence[Mapping[str, float]]) -> tuple[MemoryMoment, ...]:
    """Every stage's allocated memory at each modelled moment of a step (one layout)."""
    share = foreach_share(spec)
    workspaces = workspace_blocks(spec)
    found = []
    for stage, position in zip(stages, kinds.kind_of):
        kind = memory.kinds[position]
        for m in kind_moments(composition, kind.states, kind.activations,
                              stage.micro_batches_in_flight, memory.buffers,
                              _kind_parts(facts, position), share, "",
                              unsharded_blocks(spec, composition, parameters[position],
                                               len(stages) > 1),
                              fp8_copy_blocks(spec, composition, parameters[position])
                              + workspaces, gradients_freed(spec, composition),
                              edge_unit_blocks(spec, composition, parameters[position],
                                               _kind_parts(facts, position), len(stages) > 1),
                              reduce_scatter_blocks(spec, composition, parameters[position],
                                                    _kind_parts(facts, position),
                                                    len(stages) > 1,
                                                    gradients_freed(spec, composition)),
                              head_correction=kind.head_correction):
            found.append(MemoryMoment(stage=stage.index, moment=m.name,
                                      allocated_bytes=int(m.allocated)))
    return tuple(found)


def memory_peak(spec: Spec, composition: Composition, kinds: StageKinds,
                memory: MemoryCore, facts: TrainingFacts, records: Sequence[StageMemory],
                activation_source: str, parameters: Sequence[Mapping[str, float]]
                ) -> tuple[MemoryPeak, tuple[Derivation, ...]]:
    """The step's memory peak over every stage (one layout), the moment it is reached and
    what is alive then; its numbers are `peak_core`'s."""
    share = foreach_share(spec)
    freed = gradients_freed(spec, composition)
    workspaces = workspace_blocks(spec)
    best = None
    reserved = 0
    for position, index in enumerate(peak_candidates(kinds, records)):
        kind = memory.kinds[position]
        for m in kind_moments(composition, kind.states, kind.activations, kind.in_flight,
                              memory.buffers, _kind_parts(facts, position), share,
                              activation_source, unsharded_blocks(
                                  spec, composition, parameters[position], len(records) > 1),
                              fp8_copy_blocks(spec, composition, parameters[position])
                              + workspaces, freed,
                              edge_unit_blocks(spec, composition, parameters[position],
                                               _kind_parts(facts, position), len(records) > 1),
                              reduce_scatter_blocks(spec, composition, parameters[position],
                                                    _kind_parts(facts, position),
                                                    len(records) > 1, freed),
                              head_correction=kind.head_correction):
            reserved = max(reserved, int(m.reserved))
            size = int(m.allocated)
            if best is None or size > best[0] or (size == best[0] and index < best[1]):
                best = (size, index, m)
    assert best is not None
    allocated, index, chosen = best
    if spec.training.profile.expandable_segments:
        reserved = int(expandable_reserved(allocated))
    record = records[index]
    alive = tuple(LiveBuffer(name=b.name, bytes=int(b.size), source=b.source,
                             transient=b.transient)
                  for b in chosen.blocks if b.size or not b.transient)
    groups = communicators(composition)
    nccl = int(groups) * NCCL_BUFFSIZE_BYTES * NCCL_RING_PEERS * NCCL_MIN_CHANNELS
    context, workspace, outside = device_extras(spec)
    copies = sum(int(b.size) for b in chosen.blocks if b.name == FP8_COPIES_NAME)
    peak = MemoryPeak(allocated_bytes=allocated, reserved_bytes=reserved,
                      device_bytes=reserved + nccl + context + outside, nccl_bytes=nccl,
                      moment=chosen.name, stage=record.stage, steady_bytes=record.total_bytes,
                      alive=alive, cuda_context_bytes=context, workspace_bytes=workspace,
                      fp8_weight_copies_bytes=copies)
    return peak, (_derivations(peak, int(groups), spec.training.profile.expandable_segments)
                  + _copy_derivations(spec, peak))


def _copy_derivations(spec: Spec, peak: MemoryPeak) -> tuple[Derivation, ...]:
    """How the fp8 weight copies were counted, where there are any."""
    if not peak.fp8_weight_copies_bytes:
        return ()
    dtype = spec.precision.linear_format
    return (Derivation(
        quantity="memory_peak.fp8_weight_copies_bytes", value=peak.fp8_weight_copies_bytes,
        unit="bytes",
        rule=(f"sum over the stage's layer linear weights N_g * {COPIES} copies * "
              f"bytes({dtype}) "
              "/ (tensor, pipeline and expert splits of g; not the data-parallel shard), "
              "alive at every moment of the step"),
        source=WEIGHT_COPY_SOURCE,
        inputs={"bytes_per_element": bytes_per_element(dtype), "copies": COPIES,
                "stage": peak.stage, "framework": spec.training.profile.name}),)


def _derivations(peak: MemoryPeak, groups: int,
                 expandable: bool = False) -> tuple[Derivation, ...]:
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
                   rule=("peak_allocated_bytes rounded up to 20 MiB pages (expandable "
                         "segments)" if expandable else
                         "max over stages and moments of what is alive, each block rounded "
                         "by the caching allocator (activations tensor by tensor)"),
                   source=EXPANDABLE_SOURCE if expandable else ALLOCATOR_SOURCE,
                   inputs={"allocated_bytes": peak.allocated_bytes}),
        Derivation(quantity="device_bytes", value=peak.device_bytes, unit="bytes",
                   rule="peak_reserved_bytes (the cuBLAS workspaces' segments included; "
                        "PyTorch's added here where the profile counts it in device memory "
                        "only) + communicators * NCCL_BUFFSIZE * ring peers * channels + CUDA "
                        "context; fits = device_bytes <= capacity_bytes",
                   source=f"{NCCL_SOURCE}; {DEVICE_SOURCE}",
                   inputs={"communicators": groups, "nccl_bytes": peak.nccl_bytes,
                           "workspace_bytes": peak.workspace_bytes,
                           "cuda_context_bytes": peak.cuda_context_bytes}),
    )


__all__ = ["EDGE_GROUPS", "MemoryMoment", "PeakCore", "activation_bytes", "allocator_rounded",
           "edge_unit_blocks", "kind_moments", "memory_peak", "peak_candidates", "peak_core",
           "step_timeline", "workspace_blocks"]
