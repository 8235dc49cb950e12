"""What transformers' gated DeltaNet keeps for backward without the flash-linear-attention
kernels: its torch path (Qwen3NextGatedDeltaNet.forward in modeling_qwen3_next.py,
transformers 5.24.0, with the fallbacks causal_conv1d_fn and torch_chunk_gated_delta_rule),
as measured with torch 2.13.0 on the CPU (validation/data/qwen3-next-80b-a3b.json).

The input projections keep their input; the convolution keeps its input (q, k and v
concatenated) and its padded output (s + kernel - 1 positions, kept by silu); beta =
sigmoid(b) keeps its output; the decay g = -exp(A_log) * softplus(a + dt_bias) keeps
exp(A_log) and its negation (per layer), softplus's input and its output in fp32. The
chunked delta rule (the chunkwise form of Yang, Kautz and Hatamizadeh 2024, "Gated Delta
Networks", arXiv:2412.06464) runs in fp32 with q and k repeated to every value head, on
sequences padded to whole chunks (c = ceil(s / Q) chunks of Q = chunk_size, S = c Q
positions): the L2 norms of q and k keep their fp32 inputs and rsqrt; beta in fp32; the
padded v and k (kept by the products with beta) and k * beta; the within-chunk decays
exp(cumsum_i - cumsum_j) (b x H x c x Q x Q) and the products k_beta.k^T and q.k^T
before and after the decay (the UT system, kept by the triangular solves, and the
intra-chunk scores, kept by the loop's products); the padded, scaled q; three exp of the
cumulative decay per position and one per chunk; the two solves' outputs (the new values
and the decayed keys they read the state with); q and k decayed for the inter-chunk step;
the state before each chunk (c of b x H x d_k x d_v: the initial zeros and each chunk's
state but the last, which is dropped without a cache) and each chunk's corrected values
v_new (S positions in all). q decayed is read only from the second chunk on (the first
reads the zero state, which needs no gradient). The gated RMSNorm
(Qwen3NextRMSNormGated) keeps its fp32 input, rsqrt per head, the normalized x in the
activations' dtype, the gate's fp32 copy, silu of it and the weighted product; the
output projection keeps its input. A Q x Q boolean mask is kept once per layer.
Exact at one and two sequences of 128, 256 and 512 tokens (the einsum-free bmm calls
take views of every chunk, whatever the batch)."""

from __future__ import annotations

import math

from llmpar.footprint.activations.common import FP32_BYTES, INSIDE_TP, OUTSIDE_TP, saved
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.inventory import SavedTensor

BOOL_BYTES = 1.0


def gated_deltanet_tensors(ctx: Context) -> list[SavedTensor]:
    """One Qwen3NextGatedDeltaNet's saved tensors on the torch path (see the module
    docstring)."""
    linear, sizes = ctx.model.linear_attention, ctx.sizes
    assert linear is not None
    b, s = sizes.b, sizes.s
    heads, d_k, d_v = linear.num_value_heads, linear.key_head_dim, linear.value_head_dim
    chunk, taps, conv = linear.chunk_size, linear.conv_kernel_size, linear.conv_width
    width = linear.value_width
    chunks = math.ceil(s[1] / chunk)
    padded = ("S", chunks * chunk)
    h, k, v = ("H_v", heads), ("d_k", d_k), ("d_v", d_v)
    c, q = ("c", chunks), ("Q", chunk)
    d, f = ctx.d, FP32_BYTES

    def fp32(name: str, reason: str, *shape: tuple[str, int]) -> SavedTensor:
        return saved(name, reason, (b, *shape), f, INSIDE_TP)

    tensors = [
        ctx.per_token("mixer input", "input of in_proj_qkvz and in_proj_ba", "h",
                      sizes.h[1], d, OUTSIDE_TP),
        ctx.per_token("convolution input", "q, k and v concatenated, kept by conv1d",
                      "2*d_qk+d_vv", conv, d, INSIDE_TP),
        saved("convolution output", "padded by kernel - 1, kept by silu", (
            b, ("conv", conv), ("s+k-1", s[1] + taps - 1)), d, INSIDE_TP),
        ctx.per_token("beta = sigmoid(b)", "kept by sigmoid", "H_v", heads, d, INSIDE_TP),
        saved("exp(A_log) and its negation (fp32)", "kept by exp and by the product with "
              "softplus", (("2*H_v", 2 * heads),), f, frozenset()),
        ctx.per_token("a + dt_bias and its softplus (fp32)", "kept by softplus and by the "
                      "product with -exp(A_log)", "2*H_v", 2 * heads, f, INSIDE_TP),
        fp32("q and k (fp32, repeated to the value heads)", "kept by their L2 norms", s, h,
             ("2*d_k", 2 * d_k)),
        fp32("q and k L2 rsqrt", "per head and position", s, h, ("2", 2)),
        fp32("beta (fp32)", "kept by the products with v and k", s, h),
        fp32("v and k padded", "kept by the products with beta", padded, h, ("d_v+d_k",
                                                                              d_v + d_k)),
        saved("strictly upper mask (bool)", "kept by masked_fill", (
            ("Q^2", chunk * chunk),), BOOL_BYTES, frozenset()),
        fp32("within-chunk decays, k_beta.k^T and q.k^T before and after them",
             "exp kept by its products; the products' operands; the UT system kept by "
             "the solves; the intra-chunk scores kept by the loop", h, c, q,
             ("5*Q", 5 * chunk)),
        fp32("k * beta", "kept by k_beta.k^T and by its decayed copy", padded, h, k),
        fp32("q padded and scaled", "kept by q.k^T and by its decayed copy", padded, h, k),
        fp32("exp of the cumulative decay", "three per position (k_beta's, q's, k's)",
             h, padded, ("3", 3)),
        fp32("exp of each chunk's total decay", "kept by the state's decay", h, c),
        fp32("new values and decayed keys", "the triangular solves' outputs", padded, h,
             ("d_v+d_k", d_v + d_k)),
        fp32("k decayed to the chunk's end", "kept by the state update", padded, h, k),
        fp32("state before each chunk", "the initial zeros and every chunk's state but "
             "the last", c, h, k, v),
        fp32("corrected values v_new", "kept by the intra-chunk product and the state "
             "update", padded, h, v),
        fp32("gated norm input (fp32)", "kept by pow and mul", s, ("d_vv", width)),
        fp32("gated norm rsqrt", "per head", s, h),
        ctx.per_token("gated norm normalized and weighted", "x_hat.to(dtype) kept by the "
                      "weight's product, its product kept by the gate's", "2*d_vv",
                      2 * width, d, INSIDE_TP),
        fp32("gate z (fp32) and silu(z)", "kept by silu and the gating product", s,
             ("2*d_vv", 2 * width)),
        ctx.per_token("output projection input", "input of out_proj", "d_vv", width, d,
                      INSIDE_TP),
    ]
    if chunks > 1:
        tensors.append(fp32("q decayed", "read by the state from the second chunk on",
                            padded, h, k))
    return tensors
