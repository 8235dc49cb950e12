"""The casts around fp8 matrix products in training, memory-bound kernels the products'
own time leaves out, and the fp8 weight copies a stack keeps.

A product C[m x n] = A[m x k] B[k x n] whose weights run in an fp8 format (`[precision]
linear`, `math_format` fp8) needs its operands in fp8 first:
- forward: the input A is read in the activations' format and written in fp8 twice, as it
  is and transposed, the copy the weight gradient reads. cuBLASLt's fp8 GEMMs on Hopper
  take only the "TN" layout (cuBLAS documentation, cublasLtMatmul, FP8 requirements: "A
  must be transposed and B non-transposed"), and Transformer Engine writes both copies in
  one pass (its fused cast-transpose, transformer_engine/common/transpose/cast_transpose.cu;
  its GEMM reads the "column-wise data" where the layout needs the transpose). Block-scaled
  formats (mxfp8, DeepSeek-V3's 1 x 128 blocks) scale along the reduced dimension, which
  differs between the two uses, so they keep two quantized copies as well;
- backward: the output gradient dC alike, read by the input- and the weight-gradient
  products;
- each forward rerun of recomputation casts its inputs again;
- weights: B once per step, not per micro-batch, under a profile with `fp8_weight_cache`:
  Transformer Engine keeps the fp8 weights across the micro-batches of a step (its
  modules' `is_first_microbatch` argument, which Megatron-Core passes), also in both
  orientations; without it, every forward (and each rerun) casts B again (Transformer
  Engine called without `is_first_microbatch` sets `update_ws = is_first_microbatch is
  None or is_first_microbatch`, transformer_engine/pytorch/module/linear.py, TE 2.20;
  torchao.float8 casts the weight at every call);
- recasts (`Framework.fp8_backward_recasts`, torchao.float8): each cast writes one
  orientation, and the backward casts from the saved bf16 tensors again: the output
  gradient twice (for the input and the weight gradient), the weight and the input once
  more each (`matmul_with_hp_or_float8_args`, torchao/float8/float8_linear.py at commit
  7ca1bfb). The fp8 bytes written are those of Transformer Engine's two copies; the reads
  double;
- the output layer casts as the layers do only where the profile runs it in fp8
  (`Framework.fp8_output_layer`); Megatron-Core's stays in bf16 and casts nothing.

Attention in an fp8 format (`[precision] attention`; Transformer Engine's `fp8_dpa`,
cuDNN's fp8 attention forward and backward: transformer_engine/pytorch/attention/
dot_product_attention/backends.py, FusedAttnFunc, TE 2.20) casts its operands alike, one
copy each (the kernel reads them as they are): queries, keys and values before the
forward (`combine_and_quantize`), the output kept in fp8 for the backward (`O_quantizer`,
`bwd_requires_o_fp8`), and the output's gradient before the backward (`dO_quantizer`);
a rerun of the attention casts its inputs and output again.

Scales. Per-tensor formats ("fp8", "fp8-tensorwise") under delayed scaling take their
scale from the amax history of earlier steps and record the new amax in the cast's pass;
under current scaling (`[precision] fp8_scaling`) each cast first reads its input once
more to find its amax (Transformer Engine's Float8CurrentScalingQuantizer::quantize_impl
runs nvte_compute_amax, then nvte_compute_scale_from_amax, then nvte_quantize_v2:
transformer_engine/pytorch/csrc/quantizer.cpp, TE 2.20; torchao.float8's
hp_tensor_to_float8_dynamic reduces `torch.max(torch.abs(x))` before the cast,
torchao/float8/float8_utils.py tensor_to_amax, torchao 0.19). Row-, block- and MX-scaled
formats compute each row's or block's scale in the cast's own pass (the scaling
kernels transformer_engine/common/recipe/fp8_block_scaling.cu and mxfp8_scaling.cu).
Bytes per element written are the format's, its scales included (`bytes_per_element`).

Gathers in fp8 (`[precision] weight_gather` in an fp8 format, weights stored in 16 bits):
the data strategy's weight all-gathers carry fp8, so each GPU casts its shard before each
gather, reading it in the weights' format (and once more for its amax under current
scaling) and writing it in fp8: torchao's WeightWithDynamicFloat8CastTensor casts in
`fsdp_pre_all_gather`, which FSDP2 calls for every all-gather, and hands the gathered fp8
data to the products as a Float8TrainingTensor (torchao/float8/fsdp_utils.py at commit
11ce634), which `matmul_with_hp_or_float8_args` casts no further, forward or backward
(`tensor_already_casted_to_fp8`). So where ZeRO-3 / FSDP gathers the layers' weights in
fp8, the products cast no weight (`gather_casts`). The amax all-reduce a shard's cast
makes over the shard group, or torchtitan's once-a-step
`precompute_float8_dynamic_scale_for_fsdp` in its place, is left out (one fp32 per
weight).

Copies. Under a profile with `fp8_weight_cache` (Transformer Engine under Megatron-Core),
each fp8 linear layer keeps its weight's two fp8 copies from one step to the next
(`weight_copy_bytes`), unless the weights are stored in fp8 themselves (fp8 primary
weights, TE's `quantized_model_init`, whose weights are cast in place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmpar.arrays import Value, rounded, where
from llmpar.dtypes import bytes_per_element, math_format
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.matmuls import (
    Product,
    RankShape,
    output_layer_format,
    products,
    reruns,
)
from llmpar.spec import Spec
from llmpar.strategy import Collective

COPIES = 2
"""fp8 copies written per cast of a linear layer's operand: as the tensor is, and
transposed (or scaled along the other dimension)."""
PER_TENSOR_FORMATS = ("fp8", "fp8-tensorwise")
"""Formats with one scale per tensor: the ones whose scale current scaling finds in a
pass of its own."""
WEIGHT_COPY_GROUPS = ("attention", "linear_attention", "mamba", "mlp", "experts",
                      "shared_experts")
"""Parameter groups of the layers' linear weights: the layers' products `products` runs
in the linear format, which Megatron-Core builds from Transformer Engine modules (its
output layer is none, `tensor_parallel.ColumnParallelLinear`, and keeps no workspace),
the recurrent mixers' projections among them (TELayerNormColumnParallelLinear in and
TERowParallelLinear out in Megatron-Core's Mamba and gated DeltaNet layer specs). The
groups also hold a few parameters no product reads (norms, biases, a recurrent layer's
convolution and per-head decays: under 1% of the group)."""
WEIGHT_COPY_SOURCE = (
    "Transformer Engine's weight workspace: each linear with is_first_microbatch (which "
    "Megatron-Core passes) keeps its fp8 weight in _fp8_workspaces['weight'], row-wise "
    "and column-wise (transformer_engine/pytorch/module/linear.py and module/base.py "
    "quantize_weight, TE 2.20), for the layers' linear weights after tensor, pipeline "
    "and expert splits (gathered under ZeRO-3 / FSDP)")
ATTENTION_CAST = Product(name="attention", m=0, n=0, k=0, weights=False)
"""Stands for the attention kernel when asking how often recomputation reruns it."""


def fp8_scaling(spec: Spec) -> str:
    """`[precision] fp8_scaling`, else the framework profile's."""
    stated = spec.precision.fp8_scaling
    return spec.training.profile.fp8_scaling if stated is None else stated


def amax_reads(spec: Spec, dtype: str) -> float:
    """Extra reads of its input a cast to `dtype` makes to find its scale: 1 for a
    per-tensor format under current scaling, else 0."""
    return 1.0 if dtype in PER_TENSOR_FORMATS and fp8_scaling(spec) == "current" else 0.0


def casts_fp8(spec: Spec) -> bool:
    """Whether the linear layers' or attention's products run in an fp8 format."""
    precision = spec.precision
    return "fp8" in (math_format(precision.linear_format), math_format(precision.attention_format))


def cast_bytes(spec: Spec, shape: RankShape, recompute: Any, recomputed_fraction: Any,
               weight_casts: Value = 1.0) -> tuple[Value, Value]:
    """(bytes one micro-batch's casts move, bytes the step's weight casts move), along
    the pipeline on one GPU of each stage; (0, 0) unless a product runs in fp8.
    `weight_casts` (0 or 1, an array over a search node): whether the products cast
    their weights (0 where they arrive in fp8 from an fp8 all-gather, `gather_casts`)."""
    if not casts_fp8(spec) or not spec.model.has_architecture:
        return 0.0, 0.0
    micro_batch_bytes: Value = 0.0
    step_bytes: Value = 0.0
    precision = spec.precision
    if math_format(precision.linear_format) == "fp8":
        micro_batch_bytes, step_bytes = _linear_cast_bytes(spec, shape, recompute,
                                                           recomputed_fraction, weight_casts)
    if math_format(precision.attention_format) == "fp8":
        micro_batch_bytes = micro_batch_bytes + attention_cast_bytes(
            spec, shape, recompute, recomputed_fraction)
    return micro_batch_bytes, step_bytes


def _linear_cast_bytes(spec: Spec, shape: RankShape, recompute: Any,
                       recomputed_fraction: Any, weight_casts: Value) -> tuple[Value, Value]:
    precision = spec.precision
    profile = spec.training.profile
    dtype = precision.linear_format
    size = bytes_per_element(dtype)
    reads = 1.0 + amax_reads(spec, dtype)
    recasts = profile.fp8_backward_recasts
    # one orientation per cast where the backward casts again, else both at once
    input_bytes_per_element = reads * bytes_per_element(precision.activations) + (
        (1 if recasts else COPIES) * size)
    weight_read_bytes_per_element = reads * bytes_per_element(precision.weights)
    modules = spec.training.selective_modules
    cached = profile.fp8_weight_cache
    micro_batch_bytes: Value = 0.0
    step_bytes: Value = 0.0
    output_cast = math_format(output_layer_format(spec)) == "fp8"
    for product in products(spec, shape, materialized_scores=False):
        if not product.weights or not (product.layer or output_cast):
            continue  # attention's casts are its own; an output layer in 16 bits casts none
        inputs = product.m * product.k * product.count
        outputs = product.m * product.n * product.count
        weights = product.k * product.n * product.count * weight_casts
        forward_bytes = inputs * input_bytes_per_element
        backward_bytes = outputs * input_bytes_per_element
        if recasts:  # the output gradient once more, and the saved input again
            backward_bytes = backward_bytes * 2 + forward_bytes
        rerun = reruns(product, recompute, recomputed_fraction, modules)
        if cached:  # both orientations once per step
            step_bytes = step_bytes + weights * (weight_read_bytes_per_element + COPIES * size)
        elif recasts:  # one orientation each forward (and rerun), one each backward
            forward_bytes = forward_bytes + weights * (weight_read_bytes_per_element + size)
            backward_bytes = backward_bytes + weights * (weight_read_bytes_per_element + size)
        else:
            forward_bytes = forward_bytes + weights * (weight_read_bytes_per_element
                                                       + COPIES * size)
        micro_batch_bytes = micro_batch_bytes + forward_bytes * (1.0 + rerun) + backward_bytes
    return micro_batch_bytes, step_bytes


def fp8_gathers(spec: Spec) -> bool:
    """Whether the data strategy's weight all-gathers carry fp8 cast from weights stored
    in another format (`[precision] weight_gather`)."""
    precision = spec.precision
    return (math_format(precision.weight_gather_under(spec.training.profile)) == "fp8"
            and math_format(precision.weights) != "fp8")


def gather_casts(spec: Spec, gathers: Sequence[tuple[Collective, Value, Value]]
                 ) -> tuple[Value, Value]:
    """(bytes one GPU's shard casts move in a step, whether the products still cast their
    weights: 1, or 0 where ZeRO-3 / FSDP gathers them in fp8) from the step's collectives
    (`gathers`: each with its buffer bytes on one GPU and its calls per step, arrays over
    a search node where they vary): every data-parallel weight all-gather in the gather
    format casts the GPU's 1/group share of its buffer first. (0, 1) without fp8 gathers."""
    if not fp8_gathers(spec):
        return 0.0, 1.0
    precision = spec.precision
    dtype = precision.weight_gather_under(spec.training.profile)
    size = bytes_per_element(dtype)
    per_element = (1.0 + amax_reads(spec, dtype)) * bytes_per_element(precision.weights) + size
    moved: Value = 0.0
    per_layer: Value = 0.0
    for collective, buffer_bytes, calls in gathers:
        if (collective.strategy != "data" or collective.component != "weights"
                or collective.operation != "all-gather"
                or collective.bytes_per_parameter != size):
            continue
        moved = moved + calls * buffer_bytes / size / collective.group_size * per_element
        if collective.pieces is not None:  # ZeRO-3's per-layer gathers feed the products
            per_layer = per_layer + calls
    return moved, where(per_layer > 0, 0.0, 1.0)


def attention_elements(spec: Spec, shape: RankShape) -> tuple[Value, Value]:
    """(elements of Q, K and V together, elements of the output O) of one micro-batch's
    attention layers on one GPU, along the pipeline: tokens / context degree, heads /
    tensor degree (KV heads copied past t > kv, as `products` splits the projections)."""
    model, t = spec.model, shape.tensor
    assert model.num_attention_heads is not None
    tokens = shape.micro_batch_size * spec.training.sequence_length / shape.context
    layers = model.mixers_in(0, model.num_layers or 0).get("attention", 0)
    a = model.num_attention_heads
    if model.mla is not None:
        qkv = a * (2 * model.qk_head_dim + model.value_head_dim) / t
        output = a * model.value_head_dim / t
    else:
        assert model.head_dim is not None and model.num_kv_heads is not None
        kv = max(1.0, model.num_kv_heads / t) * model.head_dim
        qkv = model.query_width / t + 2 * kv
        output = model.attention_output_width / t
    return tokens * qkv * layers, tokens * output * layers


def attention_cast_bytes(spec: Spec, shape: RankShape, recompute: Any,
                         recomputed_fraction: Any) -> Value:
    """Bytes one micro-batch's fp8 attention casts move along the pipeline: Q, K, V and O
    each forward (and each rerun), dO each backward; each element read in the
    activations' format (twice under current scaling) and written once in fp8."""
    precision = spec.precision
    dtype = precision.attention_format
    per_element = ((1.0 + amax_reads(spec, dtype)) * bytes_per_element(precision.activations)
                   + bytes_per_element(dtype))
    qkv, output = attention_elements(spec, shape)
    rerun = reruns(ATTENTION_CAST, recompute, recomputed_fraction,
                   spec.training.selective_modules)
    return ((qkv + output) * (1.0 + rerun) + output) * per_element


def weight_copy_bytes(spec: Spec, composition: Composition,
                      parameters: Mapping[str, float]) -> Value:
    """Bytes of the fp8 weight copies one GPU of a stage keeps through the step
    (`parameters`: the stage's, by group, unsharded): both orientations of its layers'
    linear weights in the linear format, after the model-parallel splits but not the
    data-parallel shard (the copy is of the weight as the products read it); 0 unless
    the linear layers run in fp8 under a profile with `fp8_weight_cache` and the weights
    are not stored in fp8."""
    precision = spec.precision
    dtype = precision.linear_format
    if (math_format(dtype) != "fp8" or not spec.training.profile.fp8_weight_cache
            or math_format(precision.weights) == "fp8"):
        return 0.0
    linear = {group: parameters[group] for group in WEIGHT_COPY_GROUPS if group in parameters}
    return rounded(composition.held(linear, COPIES * bytes_per_element(dtype), "weights",
                                    without="data"))
