"""The casts around fp8 matrix products in training: memory-bound kernels the products'
own time leaves out.

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
- weights: B once per step, not per micro-batch: Transformer Engine keeps the fp8 weights
  across the micro-batches of a step (its modules' `is_first_microbatch` argument, which
  Megatron-Core passes), also in both orientations.
The amax of each tensor is taken in the same pass (delayed scaling's amax history, and
block scales computed within each block); a recipe that scans a whole tensor for its amax
before casting it (current scaling) reads each input once more, which this leaves out.
Bytes per element written are the format's, its scales included (`bytes_per_element`).
"""

from __future__ import annotations

from typing import Any

from llmpar.arrays import Value
from llmpar.dtypes import bytes_per_element, math_format
from llmpar.evaluation.matmuls import RankShape, products, reruns
from llmpar.spec import Spec

COPIES = 2
"""fp8 copies written per cast: as the tensor is, and transposed (or scaled along the
other dimension)."""


def casts_fp8(spec: Spec) -> bool:
    """Whether the linear layers' products run in an fp8 format."""
    return math_format(spec.precision.linear_format) == "fp8"


def cast_bytes(spec: Spec, shape: RankShape, recompute: Any,
               recomputed_fraction: Any) -> tuple[Value, Value]:
    """(bytes one micro-batch's casts move, bytes the step's weight casts move), along
    the pipeline on one GPU of each stage; (0, 0) unless the linear layers run in fp8."""
    if not casts_fp8(spec) or not spec.model.has_architecture:
        return 0.0, 0.0
    precision = spec.precision
    written_bytes_per_element = COPIES * bytes_per_element(precision.linear_format)
    input_bytes_per_element = bytes_per_element(precision.activations) + written_bytes_per_element
    weight_bytes_per_element = bytes_per_element(precision.weights) + written_bytes_per_element
    modules = spec.training.selective_modules
    micro_batch_bytes: Value = 0.0
    step_bytes: Value = 0.0
    for product in products(spec, shape, materialized_scores=False):
        if not product.weights:
            continue
        forward_bytes = product.m * product.k * product.count * input_bytes_per_element
        backward_bytes = product.m * product.n * product.count * input_bytes_per_element
        rerun = reruns(product, recompute, recomputed_fraction, modules)
        micro_batch_bytes = micro_batch_bytes + forward_bytes * (1.0 + rerun) + backward_bytes
        step_bytes = step_bytes + product.k * product.n * product.count * weight_bytes_per_element
    return micro_batch_bytes, step_bytes
