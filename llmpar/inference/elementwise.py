"""The elementwise kernels a serving engine runs on their own between its products, each a
memory-bound pass over HBM that a compute-bound product cannot hide (the engine profile's
`activation_kernel` and `quantization_kernel`; without them, or without an engine, no
operation here).

- Activation: the gated activation between an MLP's two products (SiLU of the gate times
  the up projection) reads the first product's output and writes its own for the second,
  `mlp_width` elements per token (gate, up and product; ungated: input and output), each
  in 16 bits. vLLM: vllm/model_executor/layers/activation.py, SiluAndMul, a kernel of its
  own (csrc/activation_kernels.cu, silu_and_mul) between the two products of every MLP and
  of its fused MoE; SGLang: its sgl-kernel silu_and_mul, in its dense MLPs (DeepseekV2MLP)
  and in DeepEPMoE.forward_deepgemm_contiguous (python/sglang/srt/layers/moe/ep_moe/
  layer.py) between the two grouped products of each routed expert's tokens.
- Quantization: with FP8 weights in blocks (the engine's block_fp8_gemm), each product's
  16-bit input is quantized in groups of QUANTIZATION_GROUP values by its own kernel,
  read in 16 bits and written as 1 byte a value plus one 4-byte scale a group: SGLang's
  apply_w8a8_block_fp8_linear (python/sglang/srt/layers/quantization/fp8_utils.py) calls
  per_token_group_quant_fp8 before every block-FP8 linear layer, and DeepEPMoE's
  contiguous path (prefill) calls it on the down projection's input after silu_and_mul.
  The routed experts' first input is quantized once per token before DeepEP's dispatch
  (its FP8 dispatch, llmpar.communication.deepep); in decode, DeepEP's low-latency path
  (forward_deepgemm_masked) fuses the activation and the down input's quantization in one
  kernel (silu_and_mul_masked_post_quant_fwd), which writes the FP8 values at once.

- Expert permutation: a prefill's tokens arrive by DeepEP's normal dispatch once per GPU,
  with the local experts each picked; DeepGEMM's contiguous grouped product wants one
  block of rows per expert, so SGLang's ep_scatter reads each received token once (FP8
  values and scales) and writes a copy per local expert, and after the down projection
  ep_gather reads each copy's 16-bit output and writes each token's weighted sum
  (python/sglang/srt/layers/moe/ep_moe/kernels.py; DeepEPMoE.forward_deepgemm_contiguous).
  Decode's low-latency dispatch delivers the tokens in per-expert blocks already
  (forward_deepgemm_masked): nothing to permute. A GPU receives each token that picked at
  least one of its experts: of the k copies of a token over e expert ranks, e (1 - (1 -
  1/e)^k) distinct ranks under uniform routing (`llmpar.strategies.expert`), so
  `received_tokens` = pairs x e (1 - (1 - 1/e)^k) / k.

The products' own bytes then leave out the round trip the activation makes
(`product_io_passes`), so the bytes of a step stay what they were; what changes is that
the pass no longer hides under a compute-bound product.
"""

from __future__ import annotations

from llmpar.inference.serving import Serving
from llmpar.roofline import Operation

QUANTIZATION_GROUP = 128
"""Values sharing one scale in the activations' FP8 quantization (DeepGEMM's 1 x 128
activation groups, DeepSeek-V3 report arXiv:2412.19437 Sec. 3.3.2)."""
SCALE_BYTES = 4
"""One float32 scale per group (per_token_group_quant_fp8's scales)."""
FP8_BYTES = 1


def separate_activation(serving: Serving) -> bool:
    """Whether the engine runs the activation as a kernel of its own."""
    engine = serving.inference.engine
    return engine is not None and engine.activation_kernel


def separate_permutation(serving: Serving) -> bool:
    """Whether the engine permutes a prefill's routed tokens by kernels of their own (only
    behind DeepEP's dispatch)."""
    engine = serving.inference.engine
    expert = serving.spec.parallel.get("expert")
    return (engine is not None and engine.expert_permutation_kernel
            and getattr(expert, "dispatcher", "all-to-all") == "deepep")


def separate_quantization(serving: Serving) -> bool:
    """Whether the engine quantizes the block-FP8 products' inputs by a kernel of its own."""
    engine = serving.inference.engine
    return engine is not None and engine.quantization_kernel


def product_io_passes(serving: Serving) -> int:
    """How often an MLP's intermediates (`mlp_width` a token) pass through HBM inside its
    products: 2 (written by the first, read and written by the activation, read by the
    second, all counted there) or 1 when the activation is an operation of its own."""
    return 1 if separate_activation(serving) else 2


def quantized_bytes_per_value(act_bytes: float) -> float:
    """HBM bytes of quantizing one value: read in 16 bits, written in FP8 with its share of
    the group's scale."""
    return act_bytes + FP8_BYTES + SCALE_BYTES / QUANTIZATION_GROUP


def activation(name: str, rows: float, width: float, gated: bool, act_bytes: float,
               dtype: str, fused_quantization: bool = False) -> Operation:
    """The activation of `rows` rows of an MLP whose intermediates are `width` elements a
    row (`mlp_width`): the gate and up outputs read in 16 bits and their product written
    (gated: two thirds read, one written; ungated: half and half), in 16 bits, or in FP8
    with its scales when the kernel quantizes it too."""
    read = width * (2 / 3 if gated else 1 / 2)
    out = FP8_BYTES + SCALE_BYTES / QUANTIZATION_GROUP if fused_quantization else act_bytes
    return Operation(name=name, flops=0.0,
                     bytes=rows * (read * act_bytes + (width - read) * out), dtype=dtype)


def quantization(name: str, values: float, act_bytes: float, dtype: str) -> Operation:
    """Quantizing `values` 16-bit inputs to FP8 before their products."""
    return Operation(name=name, flops=0.0, bytes=values * quantized_bytes_per_value(act_bytes),
                     dtype=dtype)


def received_tokens(pairs: float, experts_per_token: int, expert_ranks: int) -> float:
    """Distinct tokens one GPU receives for `pairs` (token, expert) pairs of its experts:
    each token's k copies land on e (1 - (1 - 1/e)^k) distinct ranks of e (uniform
    routing, as `llmpar.strategies.expert` counts a token's destinations)."""
    k, e = experts_per_token, expert_ranks
    return pairs * e * (1 - (1 - 1 / e) ** k) / k


def permutation(name: str, pairs: float, received: float, hidden: int, act_bytes: float,
                dtype: str) -> Operation:
    """Scatter and gather of one MoE layer's routed tokens: the received tokens read once
    in FP8 with their scales and a copy written per pair; each pair's output read in 16
    bits and each token's sum written."""
    fp8 = hidden * (FP8_BYTES + SCALE_BYTES / QUANTIZATION_GROUP)
    moved = (received + pairs) * fp8 + (pairs + received) * hidden * act_bytes
    return Operation(name=name, flops=0.0, bytes=moved, dtype=dtype)
