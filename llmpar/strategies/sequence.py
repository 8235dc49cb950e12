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
from llmpar.footprint.inventory import SPLIT_SEQUENCE
from llmpar.hookspecs import hookimpl
from llmpar.search.dimension import Point, SearchDimension
from llmpar.spec import Spec
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
    `overlap_compute_share` of the GPU. One chunk of each stays exposed. "none": on the
    critical path."""
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
                                   **_pipelined(config, pieces=t)),
                checked_collective(name=REDUCE_SCATTER, operation="reduce-scatter",
                                   calls_per_step=calls - backward - saved,
                                   reason="scatter each split block's output by sequence", **common,
                                   **_pipelined(config, pieces=config.overlap_splits,
                                                compute_share=config.overlap_compute_share)),
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


def _pipelined(config: SequenceConfig, pieces: int,
               compute_share: float = 0.0) -> dict[str, Any]:
    """How a layer collective overlaps its products under `comm_overlap = "pipelined"`:
    in `pieces` chunks behind the layers' matrix products (one chunk exposed), taking
    `compute_share` of the GPU while it hides; nothing otherwise."""
    if config.comm_overlap == "none":
        return {}
    return dict(overlap=1.0, hides_behind="projections", pieces=pieces,
                compute_share=compute_share)


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(SequenceParallel())


def _on_or_off(point: Point) -> tuple[bool, ...]:
    return (False, True) if point.degree("tensor") > 1 else (False,)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="sequence", field=None, values=_on_or_off,
                             description="on or off, when the tensor degree is above 1"))
