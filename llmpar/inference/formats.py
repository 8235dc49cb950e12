"""Bytes per weight under quantization, and the format each matrix product runs in.

Weight-only and weight-activation quantization (GPTQ, Frantar et al. 2022,
arXiv:2210.17323; AWQ, Lin et al. 2023, arXiv:2306.00978; FP8 as vLLM and DeepSeek-V3
ship it) quantize the linear layers inside the blocks; the embedding, the output layer,
the norms and the MoE router stay in 16-bit (vLLM loads `lm_head` unquantized; DeepSeek-V3
keeps them in BF16 around its FP8 linear layers, arXiv:2412.19437, Sec. 3.3.1).

Group-wise scales: a GPTQ/AWQ checkpoint stores, per group of `group_size` input weights
and per output column, one fp16 scale (`scales`) and one zero point packed at the weight's
width (`qzeros`): int4 with groups of 128 is 0.5 + (2 + 0.5) / 128 = 0.51953 bytes a weight.
"""

from __future__ import annotations

from llmpar.dtypes import bytes_per_element
from llmpar.spec import Gpu
from llmpar.spec.inference import QUANTIZED_FORMATS, Inference

QUANTIZED_GROUPS = frozenset({"attention", "mlp", "experts", "shared_experts"})
"""Parameter groups whose linear layers a quantized checkpoint stores quantized."""
SCALE_BYTES = {"int4": 2.0, "int8": 2.0, "fp8": 4.0}
"""One scale per group: fp16 for GPTQ/AWQ integers, fp32 for FP8 block scales (DeepSeek-V3's
`weight_scale_inv`)."""
INTEGER_FORMATS = ("int4", "int8")
"""Formats with a zero point per group (asymmetric quantization, GPTQ/AWQ `qzeros`)."""


def group_overhead_bytes(weights: str) -> float:
    """Bytes of one group's scale and zero point."""
    zero_point = bytes_per_element(weights) if weights in INTEGER_FORMATS else 0.0
    return SCALE_BYTES.get(weights, 0.0) + zero_point


def quantized_bytes_per_weight(inference: Inference) -> float:
    """Bytes per quantized weight: the element plus its share of the group's scale."""
    size = bytes_per_element(inference.weights)
    group = inference.weights_group_size
    if inference.weights in QUANTIZED_FORMATS and group is not None:
        size += group_overhead_bytes(inference.weights) / group
    return size


def bytes_per_parameter(group: str, inference: Inference, activations: str) -> float:
    """Bytes per parameter of `group`: quantized in the blocks' linear layers, else 16-bit."""
    if inference.weights in QUANTIZED_FORMATS and group not in QUANTIZED_GROUPS:
        return bytes_per_element(activations)
    return quantized_bytes_per_weight(inference)


def matmul_dtype(inference: Inference, activations: str, gpu: Gpu) -> str:
    """The format whose peak the weights' matrix products run at.

    fp8 weights run fp8 x fp8 products (W8A8, vLLM's fp8 quantization) where the GPU states
    an fp8 peak, else they are dequantized; int8 and int4 are weight-only here (W8A16,
    W4A16: Marlin kernels, Frantar et al. 2024, arXiv:2408.11743, dequantize to 16-bit),
    so they run at the activations' peak.
    """
    weights = inference.weights
    if weights == "fp8" and gpu.peak_flops_per_s("fp8") is not None:
        return "fp8"
    if weights in QUANTIZED_FORMATS:
        return activations
    return weights
