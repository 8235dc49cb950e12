"""The software stack a training run uses: a framework profile (`[training] framework`)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from llmpar.spec import validators as v
from llmpar.spec.hardware import ARCHITECTURES, FUSED_ATTENTION_KERNELS, Gpu
from llmpar.spec.quantities import Bytes, Seconds

AttentionKernel = Literal["unfused-softmax", "eager", "sdpa-math", "sdpa-flash",
                          "flash-attention-2", "flash-attention-3", "cudnn", "aiter"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = typing.get_args(AttentionKernel)
LossKernel = Literal["torch", "vocab-parallel", "vocab-parallel-copy"]
LOSS_KERNELS: tuple[LossKernel, ...] = typing.get_args(LossKernel)
OptimizerKernel = Literal["foreach", "fused"]
OPTIMIZER_KERNELS: tuple[OptimizerKernel, ...] = typing.get_args(OptimizerKernel)
FsdpEdgeUnits = Literal["per-module", "separate", "root"]
FSDP_EDGE_UNITS: tuple[FsdpEdgeUnits, ...] = typing.get_args(FsdpEdgeUnits)
"""How FSDP / ZeRO-3 gathers the embeddings and the output layer
(`Framework.fsdp_edge_units`)."""
CudaGraphs = Literal["none", "layers", "step"]
CUDA_GRAPHS: tuple[CudaGraphs, ...] = typing.get_args(CudaGraphs)
"""What a stack captures in CUDA graphs (`Framework.cuda_graphs`)."""
AttentionTiming = Literal["kernel", "matmul"]
ATTENTION_TIMINGS: tuple[AttentionTiming, ...] = typing.get_args(AttentionTiming)
"""How a training step times fused attention (`Framework.attention_timing`)."""
Fp8Scaling = Literal["delayed", "current"]
FP8_SCALINGS: tuple[Fp8Scaling, ...] = typing.get_args(Fp8Scaling)
"""How a per-tensor fp8 cast finds its scale (`[precision] fp8_scaling`)."""
TensorOverlapKernels = Literal["userbuffers", "symmetric-memory"]
TENSOR_OVERLAP_KERNELS: tuple[TensorOverlapKernels, ...] = typing.get_args(TensorOverlapKernels)
"""The kernels that run pipelined tensor-parallel communication
(`[parallel.sequence] overlap_kernels`)."""

KERNEL_ACTIVATION_MODELS: Mapping[str, str] = MappingProxyType({
    # Megatron's unfused core attention (scores materialized, softmax fused with scale and
    # mask; megatron/core/transformer/dot_product_attention.py): Korthikanti et al. 2022.
    "unfused-softmax": "korthikanti",
    # Hugging Face transformers' eager attention: scores and probabilities kept.
    "eager": "hf-eager",
    # torch SDPA's math backend materializes the scores as eager attention does.
    "sdpa-math": "hf-eager",
    # torch SDPA on its flash or memory-efficient backend: a fused kernel.
    "sdpa-flash": "fused",
    # FlashAttention-2/3 (Dao 2023, arXiv:2307.08691; Shah et al. 2024, arXiv:2407.08608)
    # and cuDNN's fused attention keep only the output and the log-sum-exp.
    "flash-attention-2": "fused",
    "flash-attention-3": "fused",
    "cudnn": "fused",
    # AMD's AITER flash attention (ROCm/aiter, flash_attn_func: FlashAttention-2's
    # interface, its output and log-sum-exp kept for the backward).
    "aiter": "fused",
})
"""The activation model each attention kernel implies: the default of `[training]
activation_model` under a profile with that kernel."""

MiB = 2**20
BLAS_WORKSPACE_BY_ARCHITECTURE: Mapping[str, int] = MappingProxyType({
    # PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize (v2.4 on:
    # Hopper; later versions add Blackwell): 4096 KiB x 8 = 32 MiB on compute capability
    # 9.x and 10.x, else CUBLAS_WORKSPACE_CONFIG's documented default ":4096:2:16:8"
    # (PyTorch docs, CUDA semantics, cuBLAS workspaces: 2 x 4096 + 8 x 16 KiB).
    "hopper": 32 * MiB,
    "blackwell": 32 * MiB,
})
TE_WORKSPACE_BY_ARCHITECTURE: Mapping[str, int] = MappingProxyType({
    # Transformer Engine, transformer_engine/pytorch/cpp_extensions/gemm.py
    # get_cublas_workspace_size_bytes (TE 2.x): 33,554,432 bytes where the device's compute
    # capability major is 9 or more (Hopper, Blackwell), else 4,194,304.
    "hopper": 32 * MiB,
    "blackwell": 32 * MiB,
})
TE_WORKSPACE_DEFAULT_BYTES = 4 * MiB
"""Transformer Engine's cuBLAS workspace below compute capability 9.0 (A100, L40S)."""
BLAS_WORKSPACE_DEFAULT_BYTES = (2 * 4096 + 8 * 16) * 1024
"""8,519,680 bytes: CUBLAS_WORKSPACE_CONFIG's default ":4096:2:16:8" where
`BLAS_WORKSPACE_BY_ARCHITECTURE` names no other size."""
CUDA_CONTEXT_BYTES = 400 * MiB
"""The CUDA context of a PyTorch process with lazy module loading (CUDA 11.7 on, PyTorch's
default): "around 400MB" at the first CUDA operation (pytorch/pytorch issue #109888, a
maintainer's answer, 2023, CUDA 12); over 1000 MB before lazy loading (issue #107667)."""


def _efficiencies_by_gpu(_instance: object, attribute: object,
                         value: Mapping[str, float]) -> None:
    """Each key a GPU preset's name, each value a share of its dense peak in (0, 1]."""
    name = getattr(attribute, "name", "matmul_efficiency")
    for gpu, efficiency in value.items():
        if not isinstance(gpu, str) or not gpu:
            raise v.FieldError(name, f"keys must name a GPU preset, got {gpu!r}")
        if (isinstance(efficiency, bool) or not isinstance(efficiency, float | int)
                or not 0 < efficiency <= 1):
            raise v.FieldError(f"{name}.{gpu}", f"must be in (0, 1], got {efficiency!r}")


def _kernels_by_architecture(_instance: object, attribute: object,
                             value: Mapping[str, str]) -> None:
    """Each key a GPU architecture (`Gpu.architecture`), each value a fused kernel."""
    name = getattr(attribute, "name", "attention_kernel_by_architecture")
    for architecture, kernel in value.items():
        if architecture not in ARCHITECTURES or not architecture:
            raise v.FieldError(name, f"keys must be one of {', '.join(ARCHITECTURES[1:])}, "
                                     f"got {architecture!r}")
        if kernel not in FUSED_ATTENTION_KERNELS:
            raise v.FieldError(f"{name}.{architecture}",
                               f"must be one of {', '.join(FUSED_ATTENTION_KERNELS)}, "
                               f"got {kernel!r}")


def _activation_model_name(_instance: object, attribute: object, value: str | None) -> None:
    """A name (the loader checks it against the session's activation models)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise v.FieldError(getattr(attribute, "name", "activation_model"),
                           f"must name an activation model, got {value!r}")


@attrs.frozen(kw_only=True)
class Framework:
    """A framework profile (`specs/frameworks/`): what a training stack runs, so that the
    defaults of a spec follow the stack. A spec that names none runs under
    `DEFAULT_FRAMEWORK` (megatron-core: Transformer Engine's fused attention, timed by its
    kernel); `megatron-core-legacy` redoes llmpar's numbers from before that default."""

    name: str = "megatron-core"
    """Preset name or a label."""
    source: str = ""
    """Where the profile's statements come from (source files, documentation)."""
    version: str = ""
    """The version of the stack the profile describes."""
    attention_kernel: AttentionKernel = attrs.field(default="unfused-softmax",
                                                    validator=v.one_of(*ATTENTION_KERNELS))
    """The attention kernel the stack runs: "unfused-softmax" (Megatron's core attention,
    scores materialized), "eager" (Hugging Face eager), "sdpa-math", "sdpa-flash" (torch
    SDPA's flash or memory-efficient backend), "flash-attention-2", "flash-attention-3",
    "cudnn" or "aiter" (AMD's AITER flash attention, on Instinct GPUs). It selects the
    default `[training] activation_model`
    (`KERNEL_ACTIVATION_MODELS`); an `activation_model` the spec states wins."""
    attention_timing: AttentionTiming = attrs.field(default="kernel",
                                                    validator=v.one_of(*ATTENTION_TIMINGS))
    """How a step times fused attention: "kernel" (at the measured rate of
    `attention_kernel` on the GPU, forward and backward apart, `Gpu.attention_kernels`,
    where the GPU states one; else at matmul_efficiency) or "matmul" (every attention
    product at matmul_efficiency, the accounting the A100 and H100 matmul_efficiency
    were calibrated under). Attention that materializes its scores (an activation
    model that keeps them) is timed as its batched products either way."""
    attention_kernel_by_architecture: dict[str, str] = attrs.field(
        factory=dict, hash=False, validator=_kernels_by_architecture)
    """The fused kernel the stack runs instead of `attention_kernel` on a GPU of that
    architecture (`[attention_kernel_by_architecture] ampere = "flash-attention-2"`): what
    a kernel-timed step (`attention_timing = "kernel"`) is timed at there. The activation
    model still follows `attention_kernel` (every fused kernel keeps the same tensors).
    Empty: `attention_kernel` on every GPU."""
    activation_model: str | None = attrs.field(default=None, validator=_activation_model_name)
    """The activation model the stack's tensors follow, where it is not the one its
    attention kernel implies (e.g. "hf-sdpa": what Hugging Face transformers models keep
    beside SDPA); unset: `KERNEL_ACTIVATION_MODELS[attention_kernel]`."""
    fused_cross_entropy: bool = False
    """The loss is computed by a fused cross-entropy kernel that does not keep the fp32
    logits (e.g. Megatron-Core's `cross_entropy_loss_fusion`): the memory peak
    (`training.memory_peak`) counts no fp32 copy of the logits."""
    loss_kernel: LossKernel = attrs.field(default="torch", validator=v.one_of(*LOSS_KERNELS))
    """How an unfused cross-entropy runs on the fp32 copy of the logits: "torch"
    (`torch.nn.functional.cross_entropy` = log_softmax + nll_loss: backward allocates the
    gradient of the log-probabilities and of the logits, both fp32), "vocab-parallel"
    (Megatron-Core's `vocab_parallel_cross_entropy`, megatron/core/tensor_parallel/
    cross_entropy.py from core_r0.8.0 on: the fp32 copy of the logits becomes the saved
    softmax in place, and its gradient in place) or "vocab-parallel-copy" (the same before
    core_r0.8.0: the max is subtracted into a second fp32 tensor, alive beside the copy in
    the loss's forward). Read by the memory peak only."""
    cross_entropy_chunks: int = attrs.field(default=1, validator=v.positive)
    """Token chunks an unfused cross-entropy runs over one at a time (1: the whole
    logits at once). torchtune's `CEWithChunkedOutputLoss(num_output_chunks=8)`
    (torchtune/modules/loss/ce_chunked_output_loss.py at commit 0031bfb0) splits the
    logits along the sequence (`Tensor.chunk(n, dim=1)`) and calls
    `F.cross_entropy(chunk.float(), ...)` per chunk: the fp32 upcast and the gradients of
    the log-probabilities and of the upcast live for one chunk of
    b x ceil(s / n) tokens at a time, while each chunk's log-probabilities (which
    log_softmax saves) stay until that chunk's backward. Read by the memory peak only,
    where the loss upcasts (`fused_cross_entropy = false`, `loss_kernel = "torch"`)."""
    compiled_cross_entropy: bool = False
    """The unfused cross-entropy is compiled on its own (torchtune's recipes with
    `compile = True`: `training.compile_loss` wraps `compute_cross_entropy` in
    `torch.compile`, torchtune/training/_compile.py at commit 0031bfb0). Measured with
    torch 2.13.0's inductor (validation/measure_compiled_loss.py,
    validation/data/compiled_loss.json): the compiled `F.cross_entropy(logits.float(),
    ...)` saves the logits themselves, the labels and two fp32 statistics per token (max
    and log-sum-exp) instead of the fp32 log-probabilities, and its backward writes the
    logits' gradient in their dtype: no fp32 tensor of tokens x vocabulary. With
    `cross_entropy_chunks`, each chunk's gradient appears as its backward frees that
    chunk's logits. Read by the memory peak only, where `fused_cross_entropy = false`."""
    tensor_whole_parameters: bool = True
    """Tensor parallelism keeps the biases of the row-parallel projections (attention's
    output, the MLP's down projection: added after the reduction) and the learned position
    and token-type tables whole on every rank, as Megatron-Core builds them
    (RowParallelLinear, megatron/core/tensor_parallel/layers.py; LanguageModelEmbedding,
    megatron/core/models/common/embeddings/language_model_embedding.py) and vLLM does;
    false: those groups divide by the degree whole, as llmpar counted them before (the
    legacy profiles, which redo those plans)."""
    dummy_weight_gradients: bool = False
    """Transformer Engine's linear modules with `fuse_wgrad_accumulation` (Megatron-Core's
    gradient_accumulation_fusion) hand autograd a cached weight-sized tensor per distinct
    (shape, dtype) (`get_dummy_wgrad`, transformer_engine/pytorch/module/base.py), alive
    from the first backward on; read by the memory peak only."""
    optimizer_kernel: OptimizerKernel = attrs.field(default="fused",
                                                    validator=v.one_of(*OPTIMIZER_KERNELS))
    """How the optimizer step runs: "fused" (multi-tensor apply in place: Apex/Transformer
    Engine FusedAdam, DeepSpeed FusedAdam, torch `fused=True`) or "foreach"
    (torch.optim's `_multi_tensor_adam`, whose `torch._foreach_sqrt(exp_avg_sqs)` makes
    one copy of the second moments of every parameter the GPU updates). Read by the
    memory peak only."""
    pipeline_keeps_unsharded: bool = False
    """Under pipeline parallelism with FSDP / ZeRO-3, each stage's weights stay gathered
    from its first forward to its last backward, and its gradients accumulate unsharded
    (in their reduce format) and are reduce-scattered once, after the last micro-batch's
    backward. torchtitan: `reshard_after_forward = not pp_enabled` under its "default"
    policy (torchtitan/distributed/fsdp.py, get_fsdp_reshard_after_forward_policy,
    torchtitan 0.2.2), and PyTorch's pipelining schedules set
    `set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)` on every
    backward but the last (torch/distributed/pipelining/stage.py,
    `_PipelineStageBase.backward_maybe_with_nosync`, PyTorch 2.10). Read by the memory
    peak, which counts those weights and gradients at the moments they are alive, and by
    the data strategy, whose per-layer gather buffer they replace."""
    zero_grad_frees_gradients: bool = False
    """The training loop frees the gradients after each optimizer step
    (`zero_grad(set_to_none=True)`, PyTorch's default since 2.0: torch/optim/optimizer.py
    `Optimizer.zero_grad`, torch/nn/modules/module.py `Module.zero_grad`) and the next
    step's first backward allocates them as it goes (AccumulateGrad takes the first
    gradient as `.grad`: torch/csrc/autograd/functions/accumulate_grad.h). With one
    micro-batch per step no gradient is alive at the loss's moments, which come before
    any weight gradient; with more, the later micro-batches' backwards hold them all.
    False: gradients live in a persistent buffer that is zeroed in place (Megatron-Core's
    `DistributedDataParallel` grad buffers, `zero_grad_buffer`). Read by the memory peak
    only."""
    fsdp_edge_units: FsdpEdgeUnits = attrs.field(default="per-module",
                                                 validator=v.one_of(*FSDP_EDGE_UNITS))
    """Under FSDP / ZeRO-3, when the embeddings' and the output layer's weights are
    gathered (the transformer blocks are each a unit of their own, the running one and
    the prefetched one gathered). "per-module": each around its own forward and its own
    backward, resharded after forward (DeepSpeed ZeRO-3 fetches and releases every
    submodule's parameters; Megatron-Core's torch FSDP2 wraps LanguageModelEmbedding and
    the output ColumnParallelLinear as units of their own with reshard_after_forward:
    megatron/core/distributed/torch_fully_sharded_data_parallel.py). "separate":
    torchtitan's `apply_fsdp` (torchtitan/models/llama3/infra/parallelize.py, torchtitan
    0.2.0 to 0.2.2; torchtitan/distributed/fsdp.py after): the embeddings a unit resharded
    after forward, `[norm, output]` a unit not resharded after forward, so the output
    layer stays gathered from its forward to its backward (tied embeddings: one unit of
    embeddings, norm and output, gathered from the first forward to the last backward).
    "root": `fully_shard` on each block and on the model, FSDP1's auto-wrap by layer class:
    the embeddings and the output layer are the root unit's parameters, which FSDP never
    reshards after forward (the root's reshard_after_forward is set to False,
    torch/distributed/fsdp/_fully_shard/_fully_shard.py docstring and _fsdp_state.py
    `FSDPState._lazy_init`, PyTorch 2.4 on; torchtitan 0.1.0 wrapped so). Read by the
    memory peak only (`training.memory_peak`)."""
    expandable_segments: bool = False
    """The training processes run with PyTorch's caching allocator in expandable-segments
    mode (`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF="expandable_segments:True"`, as
    torchtitan's run_train.sh launches, torchtitan 0.2.2): each pool is one segment per
    stream that maps physical pages as it grows, 20 MiB at a time (kLargeBuffer; 2 MiB
    for the small pool) and splits blocks to the 512 B (c10/cuda/CUDACachingAllocator.cpp,
    `find_expandable_block`, `should_split`, PyTorch 2.1 on), so the reserved peak is the
    allocated peak rounded up to 20 MiB. False: a segment per large request
    (`training.memory_peak.reserved_bytes` rounds each block). Read by the memory peak
    only."""
    reshard_after_forward: bool | None = None
    """The stack's default of `[parallel.data] reshard_after_forward` under ZeRO-3 / FSDP,
    applied where the spec does not set it; unset: the strategy's own default."""
    tensor_overlap_backward: bool | None = None
    """The stack's default of `[parallel.tensor]` and `[parallel.sequence]`
    `overlap_backward` (input-gradient reductions behind the weight-gradient products),
    applied where the spec does not set it; unset: the strategies' own default."""
    tensor_overlap_kernels: TensorOverlapKernels | None = attrs.field(
        default=None, validator=attrs.validators.optional(v.one_of(*TENSOR_OVERLAP_KERNELS)))
    """The stack's default of `[parallel.sequence] overlap_kernels` (what runs the
    collectives of `comm_overlap = "pipelined"`): "userbuffers" (Transformer Engine's,
    under Megatron-Core and NeMo) or "symmetric-memory" (PyTorch's micro-pipelined
    SymmetricMemory ops, torchtitan's AsyncTP); unset: the strategy's own default."""
    kernel_overhead_seconds: Seconds = attrs.field(default=Seconds(0.0),
                                                   validator=v.non_negative)
    """Host time each matrix-product or attention kernel launch costs that the GPU waits
    for, on top of the GPU's own `matmul_fixed_seconds` (launch and first tile, measured
    by kernel benchmarks): 0 for a stack whose host runs ahead of the GPU."""
    micro_batch_overhead_seconds: Seconds = attrs.field(default=Seconds(0.0),
                                                        validator=v.non_negative)
    """Exposed host time per micro-batch on each GPU (the Python of a forward and
    backward pass, the data loader's hand-over), paid for every micro-batch of a step."""
    step_overhead_seconds: Seconds = attrs.field(default=Seconds(0.0), validator=v.non_negative)
    """Exposed host time once per optimizer step (gradient clipping's norm, the
    scheduler, logging)."""
    host_seconds_per_kernel: Seconds = attrs.field(default=Seconds(0.0),
                                                   validator=v.non_negative)
    """Host time to issue one kernel on the stack's eager path (its Python, PyTorch's
    dispatcher, the CUDA launch), which the GPU waits for only where issuing a
    micro-batch takes longer than running it (`llmpar.evaluation.launches`: hidden
    behind the kernels already queued otherwise). 8 us in the shipped profiles: PyTorch
    eager on an A100 host, measured back to back
    (validation/published/kernels/host_launch_overheads.toml). Unlike
    `kernel_overhead_seconds`, never added in series."""
    host_seconds_per_layer: Seconds = attrs.field(default=Seconds(0.0),
                                                  validator=v.non_negative)
    """Host time per layer and pass beside its kernels' launches (module calls, hooks),
    hidden as `host_seconds_per_kernel` is."""
    elementwise_kernels_per_layer: float = attrs.field(default=0.0, validator=v.non_negative)
    """Kernels one layer's forward launches beside its matrix products and attention
    (norms, rotary embedding, activation, residual adds: what the stack's fusions
    leave), each with one backward kernel; they add to the launches
    `host_seconds_per_kernel` prices."""
    cuda_graphs: CudaGraphs = attrs.field(default="none", validator=v.one_of(*CUDA_GRAPHS))
    """What the stack captures in CUDA graphs: "none" (eager launches), "layers" (each
    layer's forward and backward one graph, Transformer Engine's
    `make_graphed_callables`; Megatron-Core's `cuda_graph_impl = "transformer_engine"`)
    or "step" (the whole iteration one graph, Megatron-Core's `full_iteration` scope).
    A graph's kernels cost the host one replay, `graph_launch_seconds`."""
    graph_launch_seconds: Seconds = attrs.field(default=Seconds(0.0), validator=v.non_negative)
    """Host time of one CUDA graph replay (with `cuda_graphs`)."""
    host_source: str = ""
    """Where the host times of launches (`host_seconds_per_kernel`, `host_seconds_per_layer`,
    `graph_launch_seconds`) and the kernel count come from."""
    overhead_source: str = ""
    """Where the three overheads come from (a kernel-level measurement, a calibration,
    or the derivation that leaves them at 0)."""
    fp8_scaling: Fp8Scaling = attrs.field(default="delayed", validator=v.one_of(*FP8_SCALINGS))
    """How the stack's per-tensor fp8 casts ("fp8-tensorwise") find their scale, the
    default of `[precision] fp8_scaling`: "delayed" (Transformer Engine's default recipe
    on Hopper, `DelayedScaling`: the scale comes from the amax history of earlier
    steps, transformer_engine/pytorch/quantization.py get_default_fp8_recipe, TE 2.20)
    or "current" (torchao.float8's only scaling, `ScalingType.DYNAMIC`: each cast first
    reduces its input to its amax, torchao/float8/float8_utils.py tensor_to_amax,
    torchao 0.19)."""
    fp8_weight_cache: bool = False
    """Each fp8 linear layer keeps its weight's fp8 copies (as it is and transposed) from
    the first micro-batch of a step to the next step, beside the weight itself:
    Transformer Engine's weight workspace (`_fp8_workspaces["weight"]`), filled when the
    caller passes `is_first_microbatch`, as Megatron-Core does
    (transformer_engine/pytorch/module/linear.py, TE 2.20: `cache_name = None if
    (is_first_microbatch is None or self.is_fsdp2) else "weight"`). Unset, the copies
    are made per use and freed with it (torchao.float8, a stack calling Transformer
    Engine without `is_first_microbatch`). Read by the memory peak and by the casts'
    time: with the cache each weight is cast once per step, without it at every forward
    (`llmpar.evaluation.casts`)."""
    fp8_output_layer: bool = True
    """The output layer's product runs in `[precision] linear`'s format with the layers'
    (torchao.float8's `convert_to_float8_training` converts every `nn.Linear` its filter
    keeps, and torchtitan's float8 converter filters none by default: `filter_fqns = []`,
    torchtitan/components/quantization/float8.py). False: it stays in `[precision]
    compute`'s, uncast (Megatron-Core builds its output layer from
    `tensor_parallel.ColumnParallelLinear`, not a Transformer Engine module, so
    `fp8_autocast` leaves it in bf16: megatron/core/models/gpt/gpt_model.py)."""
    fp8_backward_recasts: bool = False
    """The stack saves each fp8 linear layer's input and weight in their own format and
    casts them to fp8 again in the backward, one orientation per cast: torchao.float8's
    `matmul_with_hp_or_float8_args` saves `input_hp` and `weight_hp_t`, and casts the
    output gradient and the weight for the input gradient, the output gradient again and
    the input for the weight gradient, each through `hp_tensor_to_float8_dynamic`
    (torchao/float8/float8_linear.py at commit 7ca1bfb). False: Transformer Engine's casts,
    which write both orientations in one pass (its fused cast-transpose) and keep them for
    the backward, so nothing is cast twice. Read by the casts' time
    (`llmpar.evaluation.casts`)."""
    reduce_scatter_copy_in: bool = False
    """The data strategy's FSDP units (`fsdp_edge_units` "root" or "separate") reduce
    their gradients as PyTorch FSDP2 does: each unit's post-backward copies its unsharded
    gradients into a reduce-scatter input of the whole unit in the reduce format and
    reduce-scatters it into a new shard (foreach_reduce_scatter_copy_in and reduce_output
    in foreach_reduce, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, PyTorch
    2.13), so the memory peak counts the edge units' reduce-scatters as moments of their
    own (`llmpar.evaluation.peak.reduce_scatter_blocks`; measured with
    validation/measure_peak_fsdp.py). False: not counted (FSDP1's flat parameter reduces
    its flat gradient itself; DeepSpeed and Megatron-Core reduce in buckets)."""
    weight_gather_in_compute: bool = False
    """The data strategy's weight all-gathers cast each shard to the compute format
    first, so that the gathers and the gathered weights are in `[precision] compute`
    (bf16, fp16 or fp32) whatever format the sharded weights are stored in: PyTorch
    FSDP2 under `MixedPrecisionPolicy(param_dtype=...)`, whose `FSDPParam.all_gather_inputs`
    returns `_to_dtype_if_needed(sharded_param_data, self.param_dtype)` and whose
    `foreach_all_gather` gathers those inputs into a param_dtype buffer
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py and _fsdp_collectives.py,
    PyTorch 2.6; torch/distributed/_composable/fsdp/ in 2.4-2.5): fp32 weights with bf16
    compute gather 2 bytes per parameter. False: the gathers carry the weights as stored
    (Megatron-Core's distributed optimizer all-gathers the bf16 model parameters'
    buffer, its fp32 main copies staying in the optimizer: `start_param_sync` over
    `bucket.param_data`, megatron/core/distributed/param_and_grad_buffer.py, core_r0.14;
    DeepSpeed ZeRO-3 all-gathers the fp16/bf16 partitions `ds_tensor`, its fp32 copies in
    the optimizer: `all_gather_coalesced`, deepspeed/runtime/zero/partition_parameters.py),
    which a spec states as `[precision] weights`. The default of `[precision]
    weight_gather`; a format the spec states wins (`Precision.weight_gather_under`)."""
    cuda_context_bytes: Bytes = attrs.field(default=Bytes(CUDA_CONTEXT_BYTES),
                                            validator=v.non_negative)
    """Device memory the CUDA context of each training process takes (the driver's state
    and the kernel images it loads), outside PyTorch's allocator: part of
    `training.memory_peak.device_bytes`. Default 400 MiB, a PyTorch process under CUDA's
    lazy module loading (pytorch/pytorch #109888); over 1 GB without it (#107667)."""
    blas_workspace_bytes: Bytes | None = attrs.field(default=None, validator=v.non_negative)
    """cuBLAS workspace of the process's compute stream, which PyTorch takes once from its
    caching allocator and keeps (`CUBLAS_WORKSPACE_CONFIG`): part of
    `training.memory_peak.device_bytes`. Unset: PyTorch's default for the GPU's
    architecture, 32 MiB on Hopper and Blackwell, else 8,519,680 bytes (":4096:2:16:8";
    aten/src/ATen/cuda/CublasHandlePool.cpp). cuDNN's workspaces are taken per call from
    the same allocator and given back, so no persistent buffer is counted for them."""
    blas_workspace_allocated: bool = True
    """PyTorch's cuBLAS workspace (`blas_workspace_bytes`) is counted as what it is, a
    block of the caching allocator alive from the first GEMM on: in the allocated,
    reserved and device numbers of `training.memory_peak`. False: in device memory only,
    its segment added on top of the reserved peak, as llmpar counted it before (the
    legacy profiles, which redo those plans)."""
    transformer_engine_workspace: bool = False
    """The stack's linear layers run their products through Transformer Engine, which
    takes one cuBLAS workspace of its own from PyTorch's caching allocator at its first
    GEMM and keeps it (`get_workspace`: a `torch.empty` of
    `get_cublas_workspace_size_bytes()`, transformer_engine/pytorch/module/base.py and
    cpp_extensions/gemm.py, TE 2.x): 32 MiB on Hopper and Blackwell (compute capability
    9.0 and later), 4 MiB on the others. Counted, with PyTorch's own workspace
    (`blas_workspace_bytes`), in the allocated, reserved and device numbers of
    `training.memory_peak` from the step's start. False: no Transformer Engine GEMMs."""

    matmul_efficiency: dict[str, float] = attrs.field(factory=dict, hash=False,
                                                      validator=_efficiencies_by_gpu)
    """The `matmul_efficiency` this profile was calibrated with, by GPU preset name
    (`[matmul_efficiency] "h100-sxm" = 0.613`): a spec whose GPU is named here runs at
    it instead of the GPU preset's (`Gpu.matmul_efficiency`), for the whole time model,
    and the step time's derivation says so; a value the spec's own `[hardware.gpu]` table
    states (inline or with `--set`) wins over it (the loaded spec's profile drops that
    GPU's entry: `llmpar.loading.framework.without_stated_entries`). What a
    profile calibrated under another accounting of the step carries so that its numbers
    can be redone (`megatron-core-legacy`); `llmpar calibrate` replaces the entry of the
    GPU it fits. Empty: every GPU at its own."""
    fp8_matmul_efficiency: dict[str, float] = attrs.field(factory=dict, hash=False,
                                                          validator=_efficiencies_by_gpu)
    """As `matmul_efficiency`, for `Gpu.fp8_matmul_efficiency` (products in fp8)."""

    def attention_kernel_on(self, architecture: str) -> str:
        """The attention kernel the stack runs on a GPU of `architecture`."""
        return self.attention_kernel_by_architecture.get(architecture, self.attention_kernel)

    def blas_workspace_for(self, architecture: str) -> int:
        """The cuBLAS workspace on a GPU of `architecture` (`Gpu.architecture`)."""
        if self.blas_workspace_bytes is not None:
            return int(self.blas_workspace_bytes)
        return BLAS_WORKSPACE_BY_ARCHITECTURE.get(architecture, BLAS_WORKSPACE_DEFAULT_BYTES)

    def te_workspace_for(self, architecture: str) -> int:
        """Transformer Engine's cuBLAS workspace on a GPU of `architecture`; 0 where the
        stack runs no Transformer Engine GEMMs (`transformer_engine_workspace`)."""
        if not self.transformer_engine_workspace:
            return 0
        return TE_WORKSPACE_BY_ARCHITECTURE.get(architecture, TE_WORKSPACE_DEFAULT_BYTES)

    @property
    def default_activation_model(self) -> str:
        """The `[training] activation_model` a spec under this profile gets by default."""
        if self.activation_model is not None:
            return self.activation_model
        return KERNEL_ACTIVATION_MODELS[self.attention_kernel]


def profile_gpu(framework: Framework, gpu: Gpu) -> Gpu:
    """`gpu` with the matrix efficiencies `framework` was calibrated with where it names
    the GPU (`Framework.matmul_efficiency`, `fp8_matmul_efficiency`); the same object where
    it names none or the GPU already states them."""
    bf16 = framework.matmul_efficiency.get(gpu.name, gpu.matmul_efficiency)
    fp8 = framework.fp8_matmul_efficiency.get(gpu.name, gpu.fp8_matmul_efficiency)
    if bf16 == gpu.matmul_efficiency and fp8 == gpu.fp8_matmul_efficiency:
        return gpu
    replaced = [f"{key} {value}" for key, value, own in (
        ("matmul_efficiency", bf16, gpu.matmul_efficiency),
        ("fp8_matmul_efficiency", fp8, gpu.fp8_matmul_efficiency)) if value != own]
    return attrs.evolve(
        gpu, matmul_efficiency=bf16, fp8_matmul_efficiency=fp8,
        efficiency_source=f"{', '.join(replaced)} from framework profile {framework.name!r} "
                          f"(the efficiencies it was calibrated with on {gpu.name!r}); the "
                          f"GPU preset's: {gpu.efficiency_source}")


DEFAULT_FRAMEWORK = Framework(
    name="megatron-core", attention_kernel="cudnn", attention_timing="kernel",
    loss_kernel="vocab-parallel", dummy_weight_gradients=True, optimizer_kernel="fused",
    transformer_engine_workspace=True,
    fp8_weight_cache=True, fp8_output_layer=False, host_seconds_per_kernel=Seconds(8e-6),
    attention_kernel_by_architecture={"ampere": "flash-attention-2", "ada": "flash-attention-2",
                                      "cdna2": "aiter", "cdna3": "aiter", "cdna4": "aiter"},
    source="specs/frameworks/megatron-core.toml (the profile a spec that names none runs "
           "under)")
"""The profile a spec that names none runs under: specs/frameworks/megatron-core.toml's
statements (a test holds them equal), so that no preset is read when none is named."""
