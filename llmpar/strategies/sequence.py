"""Sequence parallelism over the tensor group (Korthikanti et al. 2022,
arXiv:2205.05198, Sec. 4.2.2).

The norms and dropouts outside the tensor-parallel regions work on a 1/t slice of
the sequence, so their activations split too: sbh(34 + 5as/h)/t per layer (Eq. 4).
Each all-reduce of tensor parallelism becomes a reduce-scatter plus an all-gather
of the same total traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs

from llmpar.arrays import anywhere, is_array, where
from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.casts import PER_TENSOR_FORMATS, amax_reads
from llmpar.evaluation.matmuls import launch_seconds
from llmpar.footprint.inventory import SPLIT_SEQUENCE
from llmpar.hookspecs import hookimpl
from llmpar.roofline import rates_of
from llmpar.search.dimension import Point, SearchDimension
from llmpar.spec import Spec
from llmpar.spec.framework import TENSOR_OVERLAP_KERNELS, TensorOverlapKernels
from llmpar.spec.validators import one_of, positive, share_below_one
from llmpar.strategies.common import (
    backward_input_gradient_calls,
    hidden_state_bytes,
    layer_collective_calls,
    layers_per_stage,
    micro_batches_per_step,
    op_checkpoint_collective_reruns,
)
from llmpar.strategies.tensor import INPUT_GRADIENT, LAYER_OUTPUT
from llmpar.strategy import (
    ActivationSplit,
    Collective,
    Layout,
    Strategy,
    StrategyContext,
    Transform,
    checked_collective,
)

ALL_GATHER = "sequence.all-gather"
"""Gathers the sequence before each tensor-parallel block (forward, and backward)."""
CommOverlap = Literal["none", "pipelined"]
COMM_OVERLAPS: tuple[CommOverlap, ...] = ("none", "pipelined")
REDUCE_SCATTER = "sequence.reduce-scatter"
"""Scatters each block's output by sequence (forward), and output gradients (backward)."""
INPUT_GRADIENT_REDUCE_SCATTER = "sequence.input-gradient-reduce-scatter"
"""Reduce-scatters the input gradients of the column-parallel projections (backward)."""
AMAX_ALL_REDUCE = "sequence.fp8-amax-all-reduce"
"""The amax of each sequence-split tensor cast to fp8 with one current scale (backward
and forward)."""
AMAX_BYTES = 4.0
"""One fp32 amax per cast tensor."""


@attrs.frozen(kw_only=True)
class SequenceConfig:
    """`[parallel.sequence]`: present and enabled turns it on."""

    enabled: bool = True
    """Split the norm and dropout regions by sequence over the tensor group."""
    overlap_backward: bool = True
    """Run the backward pass's input-gradient reduce-scatters of the column-parallel
    projections behind their weight-gradient products (Megatron-LM,
    `LinearWithGradAccumulationAndAsyncCommunication`); false: on the critical path."""
    comm_overlap: CommOverlap = attrs.field(default="none", validator=one_of(*COMM_OVERLAPS))
    """"pipelined": each layer's all-gathers and reduce-scatters run in chunks, each
    overlapped with the matrix product that consumes or produces it (Megatron-LM's
    `--tp-comm-overlap` with Transformer Engine's userbuffers; torchtitan's AsyncTP; both
    need sequence parallelism). An all-gather runs as a ring exchange, one chunk per
    tensor rank, over the copy engines; a reduce-scatter in `overlap_splits` chunks on
    `overlap_compute_share` of the GPU. One chunk of each stays exposed (as
    `overlap_kernels` run them). "none": on the critical path."""
    overlap_kernels: TensorOverlapKernels = attrs.field(default="userbuffers",
                                                        validator=one_of(*TENSOR_OVERLAP_KERNELS))
    """What runs the collectives of `comm_overlap = "pipelined"` (the framework profile's
    `tensor_overlap_kernels` by default). "userbuffers": Transformer Engine's (Megatron-LM,
    NeMo), as `comm_overlap` describes. "symmetric-memory": PyTorch's micro-pipelined
    SymmetricMemory ops that torch.compile's micro-pipeline pass puts in place of an
    all-gather and the product after it, or a product and the reduce-scatter after it
    (torchtitan's AsyncTP): each product runs in t chunks of the tokens, one per tensor
    rank, the local one first; the copies run on the copy engines (no share of the GPU)
    while the other chunks compute, so no chunk's transfer waits with nothing beside it;
    each chunk pays a product's launch and first tile, and a reduce-scatter ends in a
    local reduction kernel over the t partial sums."""
    overlap_splits: int = attrs.field(default=4, validator=positive)
    """Chunks of a pipelined reduce-scatter (Transformer Engine's `num_splits`; NeMo's H100
    configurations use 4)."""
    overlap_compute_share: float = attrs.field(default=20 / 132, validator=share_below_one)
    """Share of the GPU a pipelined reduce-scatter's kernels take from the product beside
    it: NeMo's H100 bf16 configuration (Llama 3 70B, TP4) gives them 24 and 16 of the 132
    SMs after the attention and MLP output projections, 20 on average
    (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py)."""


class SequenceParallel(Strategy[SequenceConfig]):
    name = "sequence"
    config_type = SequenceConfig
    phase = 25
    vectorised = True

    def degree(self, config: SequenceConfig) -> int:
        return 1  # it reuses the tensor group

    def active(self, config: SequenceConfig) -> Any:
        return config.enabled

    def neutral_config(self, layout: Layout) -> SequenceConfig:
        return SequenceConfig(enabled=False)

    def transform(self, config: SequenceConfig, ctx: StrategyContext) -> Transform:
        t = ctx.layout.degree("tensor")
        if t == 1 or not anywhere(config.enabled):
            return Transform(strategy=self.name)
        spec, layout = ctx.spec, ctx.layout
        on = config.enabled
        calls = where(on, layer_collective_calls(spec, layout), 0.0)
        backward = where(on, backward_input_gradient_calls(spec, layout), 0.0)
        # an op-level recompute_policy reruns the all-gathers, not the saved reduce-scatters
        reruns = op_checkpoint_collective_reruns(spec)
        saved = where(on, reruns * layers_per_stage(spec, layout)
                      * micro_batches_per_step(spec, layout), 0.0)
        # ... and keeps those reduce-scatters' outputs, b x s/t x h each, two per layer
        # (torchtitan's save list holds _c10d_functional.reduce_scatter_tensor)
        kept = where(on, reruns * layers_per_stage(spec, layout)
                     * hidden_state_bytes(spec, layout) / t, 0.0)
        common: dict[str, Any] = dict(strategy=self.name,
                                      buffer_bytes=hidden_state_bytes(spec, layout),
                                      group_size=t, group_stride=layout.stride("tensor"))
        return Transform(
            strategy=self.name,
            activation_splits=(ActivationSplit(tag=SPLIT_SEQUENCE, divisor=where(on, t, 1),
                                               reason="norm and dropout regions split by "
                                                      "sequence"),),
            collectives=(
                checked_collective(name=ALL_GATHER, operation="all-gather", calls_per_step=calls,
                                   reason="gather the sequence before each split block",
                                   **{**common, "buffer_bytes": gathered_bytes(spec, layout)},
                                   **_pipelined(config, spec, t, pieces=t)),
                checked_collective(name=REDUCE_SCATTER, operation="reduce-scatter",
                                   calls_per_step=calls - backward - saved,
                                   reason="scatter each split block's output by sequence", **common,
                                   **_pipelined(config, spec, t, pieces=config.overlap_splits,
                                                compute_share=config.overlap_compute_share,
                                                reduced_bytes=common["buffer_bytes"])),
                checked_collective(name=INPUT_GRADIENT_REDUCE_SCATTER,
                                   operation="reduce-scatter", calls_per_step=backward,
                                   overlap=1.0 if config.overlap_backward else 0.0,
                                   hides_behind="weight-gradients",
                                   reason="input gradients of the Q/K/V and first MLP projections "
                                          "(backward)" + (", behind the weight gradients"
                                                          if config.overlap_backward else ""),
                                   **common),
            ) + _amax_all_reduces(spec, calls, t, layout.stride("tensor")),
            added_activation_bytes=kept, mechanisms=_mechanisms(config),
            replaces=(LAYER_OUTPUT, INPUT_GRADIENT), replaces_where=on)


def _mechanisms(config: SequenceConfig) -> tuple[str, ...]:
    """The mechanisms validation rows check on their own that this layout runs:
    "tp-comm-overlap" under `comm_overlap = "pipelined"` (none stated for a search
    node's arrays: only a plan quotes them)."""
    if is_array(config.enabled) or not config.enabled or config.comm_overlap == "none":
        return ()
    return ("tp-comm-overlap",)


def gathered_bytes(spec: Spec, layout: Layout) -> Any:
    """One micro-batch's hidden states as each sequence all-gather carries them: in the
    linear layers' fp8 format under one scale per tensor ("fp8-tensorwise"), since
    the stacks cast the sequence-split tensor to fp8 before gathering it, the
    column-parallel inputs forward and the row-parallel output gradients backward
    (Transformer Engine: LayerNormLinear casts ln_out before gather_along_first_dim,
    and base.py grad_output_preprocess casts the output gradient first, "FP8 case with
    gather: unfused bgrad, cast, transpose for efficient gather", TE 1.x; torchao's
    Float8ColwiseParallel and PrepareFloat8ModuleInput cast the input before
    redistribute, and NoopFwToFloat8BwDynamic casts the output gradient before the
    backward all-gather, torchao/float8/float8_tensor_parallel.py, torchao 0.8);
    else in the activations' format. The reduce-scatters carry the products' outputs,
    in the activations' format."""
    linear = spec.precision.linear_format
    if linear not in PER_TENSOR_FORMATS:
        return hidden_state_bytes(spec, layout)
    return (hidden_state_bytes(spec, layout) * bytes_per_element(linear)
            / bytes_per_element(spec.precision.activations))


def _amax_all_reduces(spec: Spec, calls: Any, t: int, stride: int) -> tuple[Collective, ...]:
    """Under one current scale per tensor (`[precision] linear = "fp8-tensorwise"` with
    `fp8_scaling = "current"`) each tensor a sequence-parallel rank casts to fp8 before
    its all-gather holds only its slice of the sequence, so its amax is reduced over the
    tensor group first: the input of every column-parallel linear (forward, and again
    when recomputed) and the output gradient of every row-parallel one (backward), one
    per sequence all-gather. Transformer Engine sets `with_amax_reduction` and
    `amax_reduction_group = tp_group` on those two quantizers under sequence parallelism
    (`_customize_quantizers_float8_current_scaling`, transformer_engine/pytorch/module/
    linear.py, layernorm_linear.py and layernorm_mlp.py, TE 2.20); torchao's
    Float8ColwiseParallel and Float8RowwiseParallel cast the sequence-sharded DTensor
    input and output gradient before redistributing them, its amax a DTensor reduction
    over the mesh (torchao/float8/float8_tensor_parallel.py, float8_utils.py
    tensor_to_amax). Each is one fp32 on the critical path of its cast: latency."""
    if amax_reads(spec, spec.precision.linear_format) == 0.0:
        return ()
    return (checked_collective(name=AMAX_ALL_REDUCE, strategy="sequence", operation="all-reduce",
                               buffer_bytes=AMAX_BYTES, calls_per_step=calls, group_size=t,
                               group_stride=stride,
                               reason="the amax of each sequence-split tensor cast to fp8 under "
                                      "current per-tensor scaling: column-parallel inputs "
                                      "(forward), row-parallel output gradients (backward)"),)


def _pipelined(config: SequenceConfig, spec: Spec, t: int, pieces: int,
               compute_share: float = 0.0, reduced_bytes: Any = None) -> dict[str, Any]:
    """How a layer collective overlaps its products under `comm_overlap = "pipelined"`,
    behind the layers' matrix products; nothing otherwise. Transformer Engine's
    userbuffers: in `pieces` chunks (one exposed), taking `compute_share` of the GPU
    while it hides. PyTorch's SymmetricMemory: `_symmetric_memory_serial_seconds`."""
    if config.comm_overlap == "none":
        return {}
    if config.overlap_kernels == "userbuffers":
        return dict(overlap=1.0, hides_behind="projections", pieces=pieces,
                    compute_share=compute_share)
    return dict(overlap=1.0, hides_behind="projections",
                serial_seconds_per_call=_symmetric_memory_serial_seconds(spec, t, reduced_bytes))


def _symmetric_memory_serial_seconds(spec: Spec, t: int, reduced_bytes: Any) -> Any:
    """GPU seconds each pipelined call adds on the critical path under PyTorch's
    SymmetricMemory ops (torch/distributed/_symmetric_memory/__init__.py, PyTorch 2.5,
    as torchtitan's AsyncTP runs them through torch/_inductor/fx_passes/micro_pipeline_tp.py).

    `fused_all_gather_matmul` (`_pipelined_all_gather_and_consume`) multiplies the local
    shard first, while that shard is copied into the rank's peer-visible buffer, then
    for each of the t - 1 other ranks copies its shard (`Tensor.copy_` of a peer buffer:
    the copy engines) and multiplies it, alternating two streams so a copy runs beside
    the previous chunk's product. `fused_matmul_reduce_scatter`
    (`_pipelined_produce_and_all2all`) computes the partial product of each other rank's
    rows into a double buffer that rank pulls while the next chunk computes, the local
    chunk last, then reduces the t partial sums with `torch.sum` over the stacked
    [t, tokens/t, n] buffer. So no transfer waits with nothing beside it (no exposed
    piece, no share of the SMs), but:
    - each product runs as t products of tokens/t rows, each paying the GEMM law's
      launch and first tile (`llmpar.evaluation.matmuls.launch_seconds`), t - 1 more
      than the whole product (one product per call, as llmpar's inventory groups Q/K/V
      and the MLP's input projections; an upper bound where the two streams start a
      chunk during the previous one's last wave);
    - each reduce-scatter's reduction reads the whole stacked buffer (`reduced_bytes`, the
      reduce-scatter's buffer in the activations' format) and writes 1/t of it, a
      memory-bound kernel at the GPU's HBM bandwidth and memory efficiency (the roofline,
      Williams et al. 2009) on the compute stream after the last chunk."""
    rates = rates_of(spec.hardware.gpu)
    launches = (t - 1) * launch_seconds(spec, rates)
    if reduced_bytes is None or not spec.hardware.gpu.hbm_bandwidth_bytes_per_s:
        return launches
    return launches + (1 + 1 / t) * reduced_bytes / (rates.bandwidth * rates.memory_efficiency)


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(SequenceParallel())


def _on_or_off(point: Point) -> tuple[bool, ...]:
    return (False, True) if point.degree("tensor") > 1 else (False,)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="sequence", field=None, values=_on_or_off,
                             description="on or off, when the tensor degree is above 1"))
