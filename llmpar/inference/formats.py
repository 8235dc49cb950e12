"""Bytes per weight under quantization, and the format each matrix product runs in.

Weight-only and weight-activation quantization (GPTQ, Frantar et al. 2022,
arXiv:2210.17323; AWQ, Lin et al. 2023, arXiv:2306.00978; FP8 as vLLM and DeepSeek-V3
ship it) quantize the linear layers inside the blocks; the embedding, the output layer,
the norms and the MoE router stay in 16-bit (vLLM loads `lm_head` unquantized; DeepSeek-V3
keeps them in BF16 around its FP8 linear layers, arXiv:2412.19437, Sec. 3.3.1).

Group-wise scales: a GPTQ/AWQ checkpoint stores, per group of `group_size` input weights
and per output column, one fp16 scale (`scales`) and one zero point packed at the weight's
width (`qzeros`): int4 with groups of 128 is 0.5 + (2 + 0.5) / 128 = 0.51953 bytes a weight.

FP4 (nvfp4, mxfp4: `llmpar.dtypes`) carries its block scales in its element size (0.5625
and 0.53125 bytes), so a group size adds nothing. `[inference] expert_weights` gives the
routed experts a format of their own (gpt-oss: MXFP4 experts, the rest BF16).
"""

from __future__ import annotations

from llmpar.dtypes import bytes_per_element
from llmpar.spec import Gpu
from llmpar.spec.inference import QUANTIZED_FORMATS, Inference

QUANTIZED_GROUPS = frozenset({"attention", "mlp", "experts", "shared_experts"})
"""Parameter groups whose linear layers a quantized checkpoint stores quantized."""
SCALE_BYTES = {"int4": 2.0, "int8": 2.0, "fp8": 4.0}
FP4_FORMATS = ("nvfp4", "mxfp4")
"""Formats whose products run on Blackwell's block-scaled fp4 tensor cores."""
LOW_PRECISION_MATH = ("fp8", *FP4_FORMATS)
"""Weight formats whose products run on tensor cores of their own format, where the GPU
states that format's peak."""
"""One scale per group: fp16 for GPTQ/AWQ integers, fp32 for FP8 block scales (DeepSeek-V3's
`weight_scale_inv`)."""
INTEGER_FORMATS = ("int4", "int8")
"""Formats with a zero point per group (asymmetric quantization, GPTQ/AWQ `qzeros`)."""


def group_overhead_bytes(weights: str) -> float:
    """Bytes of one group's scale and zero point."""
    zero_point = bytes_per_element(weights) if weights in INTEGER_FORMATS else 0.0
    return SCALE_BYTES.get(weights, 0.0) + zero_point


def quantized_bytes_per_weight(inference: Inference, weights: str | None = None) -> float:
    """Bytes per quantized weight of `weights` (default the spec's `weights`): the element
    plus its share of the group's scale."""
    weights = inference.weights if weights is None else weights
    size = bytes_per_element(weights)
    group = inference.weights_group_size
    if weights in QUANTIZED_FORMATS and group is not None:
        size += group_overhead_bytes(weights) / group
    return size


def group_format(group: str, inference: Inference) -> str:
    """The format of `group`'s linear weights: `expert_weights` for the routed experts
    when given, else `weights`."""
    if group == "experts" and inference.expert_weights is not None:
        return inference.expert_weights
    return inference.weights


def bytes_per_parameter(group: str, inference: Inference, activations: str) -> float:
    """Bytes per parameter of `group`: quantized in the blocks' linear layers, else 16-bit."""
    weights = inference.weights
    if group == "experts" and inference.expert_weights is not None:
        weights = inference.expert_weights
    if weights in QUANTIZED_FORMATS and group not in QUANTIZED_GROUPS:
        return bytes_per_element(activations)
    return quantized_bytes_per_weight(inference, weights)


def format_matmul_dtype(weights: str, activations: str, gpu: Gpu) -> str:
    """The format whose peak products with weights in `weights` run at.

    fp8 weights run fp8 x fp8 products (W8A8, vLLM's fp8 quantization) where the GPU states
    an fp8 peak, else they are dequantized; nvfp4 and mxfp4 run fp4 x fp4 products on the
    block-scaled tensor cores where the GPU states an fp4 peak (W4A4, the activations
    quantized to the same format on the fly), else they are dequantized; int8 and int4 are
    weight-only here (W8A16, W4A16: Marlin kernels, Frantar et al. 2024, arXiv:2408.11743,
    dequantize to 16-bit), so they run at the activations' peak.
    """
    if weights in LOW_PRECISION_MATH and gpu.peak_flops_per_s(weights) is not None:
        return weights
    if weights in QUANTIZED_FORMATS:
        return activations
    return weights


def matmul_dtype(inference: Inference, activations: str, gpu: Gpu) -> str:
    """The format whose peak the blocks' weight products run at (`format_matmul_dtype` of
    `weights`)."""
    return format_matmul_dtype(inference.weights, activations, gpu)


def expert_matmul_dtype(inference: Inference, activations: str, gpu: Gpu) -> str:
    """The format whose peak the routed experts' products run at."""
    return format_matmul_dtype(group_format("experts", inference), activations, gpu)


def format_warnings(inference: Inference, activations: str, gpu: Gpu) -> list[str]:
    """What the plan assumes for fp4 weights: their products' efficiency, their weight
    kernels' bandwidth share unless the engine profile measured it, and the dequantization
    where the GPU has no fp4 tensor cores."""
    if inference.weights not in FP4_FORMATS and inference.expert_weights not in FP4_FORMATS:
        return []
    engine = inference.engine
    measured = engine.weight_memory_efficiency if engine is not None else {}
    found = []
    for weights in dict.fromkeys(f for f in (inference.weights, inference.expert_weights)
                                 if f in FP4_FORMATS):
        if format_matmul_dtype(weights, activations, gpu) == weights:
            found.append(f"{weights} products run at the fp4 peak x the GPU's "
                         "matmul_efficiency (measured on bf16 GEMMs; no fp4 GEMM measurement "
                         "here)")
        else:
            found.append(f"{weights} weights: GPU {gpu.name!r} states no fp4 peak, so they are "
                         f"dequantized to {activations} (weight-only, W4A16)")
        if weights not in measured:
            found.append(f"{weights} weights are read at the GPU's memory_efficiency: no "
                         "kernel-level measurement of their weight-streaming bandwidth "
                         "(assumed as bf16's)")
    return found
