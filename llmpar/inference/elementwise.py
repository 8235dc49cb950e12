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

- Time per kernel: with the profile's `[elementwise_kernels]`
  (`llmpar.spec.inference.ElementwiseKernel`), each of these operations, the norms and
  residual adds, the embedding lookup and the router's top-k takes the kernels' fixed
  time for each kernel it runs beside its bytes at their bandwidth share (`per_kernel`):
  a decode step of small batches runs thousands of them, each paying its launch inside
  the CUDA graph and the fill and drain of its waves whatever its bytes. Kernels: one
  fused add-RMSNorm per module of a layer; one quantization per product input it
  quantizes; one activation; a scatter and a gather; one top-k per MoE layer (SGLang
  0.4.6: sgl-kernel's moe_fused_gate, python/sglang/srt/layers/moe/topk.py
  biased_grouped_topk); one embedding lookup.
- Multi-head latent attention's absorbed decode runs small kernels of its own before the
  attention kernel (SGLang 0.4.6, python/sglang/srt/models/deepseek_v2.py,
  DeepseekV2AttentionMLA.forward_absorb): the query latent's RMSNorm (q_a_layernorm,
  q_lora_rank wide), the key/value latent's (kv_a_layernorm, kv_lora_rank), the rotary
  embedding of the query's and key's rope parts, and the attention backend's write of
  the new token's latent into the cache (its bytes counted by the attention); each norm
  and the rotary embedding read and write their values in 16 bits (`latent_decode`).
  With DeepGEMM (SGL_ENABLE_JIT_DEEPGEMM and 128 x 128 weight blocks,
  DeepseekV2ForCausalLM.post_load_weights: use_deep_gemm_bmm), the absorbed key and
  value up-projections are masked grouped FP8 products whose inputs, the non-rope query
  (qk_nope_head_dim a head) and the attention's latent output (kv_lora_rank a head), are
  quantized by per_tensor_quant_mla_deep_gemm_masked_fp8 first; they replace the key/value
  up-projection's input among the quantized ones.

- Expert exchange passes: DeepEP's low-latency dispatch and combine (decode, `[parallel.
  expert] dispatcher = "deepep"`) run as a send and a receive kernel each; with two-batch
  overlap the receive waits behind a hook (DeepEP README: "the actual tensor will not be
  received only if you call hook()"), so the network time hides behind the other
  micro-batch while the four kernels run on the compute stream
  (deepseek-ai/DeepEP, csrc/kernels/internode_ll.cu, dispatch and combine, their
  LOW_LATENCY_SEND_PHASE and LOW_LATENCY_RECV_PHASE): the dispatch's send casts each
  token to FP8 into its send buffer (16 bits read, 1 byte and the scales written), its
  receive copies each received (token, expert) message into the experts' packed layout;
  the combine's send copies each expert output (16 bits) into its send buffer, its
  receive reads each token's k returned copies and writes their weighted sum
  (`exchange_passes`; a GPU receives as many pairs as it sends under balanced routing).
  Without the overlap the kernels run inside the measured dispatch and combine times
  (`llmpar.communication.deepep`): nothing counted here.

The products' own bytes then leave out the round trip the activation makes
(`product_io_passes`), so the bytes of a step stay what they were; what changes is that
the pass no longer hides under a compute-bound product.
"""

from __future__ import annotations

import attrs

from llmpar.inference.serving import Serving
from llmpar.roofline import Operation
from llmpar.spec import Model
from llmpar.spec.inference import ElementwiseKernel

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


def elementwise_kernel(serving: Serving) -> ElementwiseKernel | None:
    """The engine's small elementwise kernels' law; None: no engine or none measured."""
    engine = serving.inference.engine
    return engine.elementwise_kernels if engine is not None else None


def per_kernel(op: Operation, kernels: int, kernel: ElementwiseKernel | None) -> Operation:
    """`op` run as `kernels` small kernels under `kernel`'s law: their fixed time and its
    bandwidth share (the bytes of a product, the router's, keep their own share); `op`
    as it was without one."""
    if kernel is None or kernels <= 0:
        return op
    share = op.memory_efficiency if op.flops > 0 else kernel.memory_efficiency
    return attrs.evolve(op, fixed_seconds=op.fixed_seconds + kernels * kernel.fixed_seconds,
                        memory_efficiency=share)


LATENT_DECODE_KERNELS = 4
"""The query latent's norm, the key/value latent's norm, the rotary embedding and the
cache write (one fewer without a query latent)."""


def latent_decode(name: str, tokens: float, model: Model, tensor: int, act_bytes: float,
                  dtype: str) -> tuple[Operation, int]:
    """Multi-head latent attention's small decode kernels of one layer for `tokens` new
    tokens, and how many kernels they are: each latent norm and the rotary embedding
    read and write their values in 16 bits (the cache write's bytes are the
    attention's)."""
    mla = model.mla
    assert mla is not None and model.num_attention_heads is not None
    rope = (model.num_attention_heads / tensor + 1) * mla.qk_rope_head_dim
    values = (mla.q_lora_rank or 0) + mla.kv_lora_rank + rope
    kernels = LATENT_DECODE_KERNELS - (mla.q_lora_rank is None)
    return (Operation(name=name, flops=0.0, bytes=tokens * 2 * values * act_bytes,
                      dtype=dtype), kernels)


EXCHANGE_KERNELS = 4
"""The dispatch's send and receive, the combine's send and receive."""


def exchange_passes(name: str, tokens: float, pairs: float, experts_per_token: int,
                    hidden: int, act_bytes: float, dtype: str) -> Operation:
    """The HBM passes of one MoE layer's low-latency dispatch and combine kernels on one
    GPU, for its `tokens` tokens and the `pairs` (token, expert) pairs it sends and
    receives: the FP8 cast into the send buffer, the received messages copied into the
    experts' layout, the experts' outputs copied into the combine's send buffer, the k
    returned copies of each token read and their sum written."""
    fp8 = FP8_BYTES + SCALE_BYTES / QUANTIZATION_GROUP
    dispatch = tokens * hidden * (act_bytes + fp8) + pairs * hidden * 2 * fp8
    combine = (pairs * hidden * 2 * act_bytes
               + tokens * hidden * (experts_per_token + 1) * act_bytes)
    return Operation(name=name, flops=0.0, bytes=dispatch + combine, dtype=dtype)
