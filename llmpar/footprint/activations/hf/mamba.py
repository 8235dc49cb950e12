"""What transformers' Mamba-2 mixer keeps for backward without the mamba_ssm kernels: its
torch path (Mamba2Mixer.forward in modeling_mamba2.py, transformers 5.24.0, with the
fallbacks causal_conv1d_fn and mamba2_chunk_scan), as measured with torch 2.13.0 on the CPU
(validation/data/mamba-codestral-7b.json).

The input projection keeps its input; the convolution keeps the projection's whole output
zxbcdt (its input is a view of it) and its padded output (s + kernel - 1 positions, kept by
silu); dt + dt_bias and its softplus are kept by softplus and clamp. The chunked scan runs in
fp32 on sequences padded to whole chunks (c = ceil(s / Q) chunks of Q = chunk_size, S = c Q
positions): x in fp32 and its padded copy (the D residual), dt in fp32 twice, the
discretized x by chunks, B and C repeated to every head and padded, the within-chunk decay
L = exp(segsum(A)) and the scores G = C.B^T (b x H x c x Q x Q each), the masked scores'
copy for the product with x, the decays per position, B weighted by its decay, the chunk
states (c + 1 of them after the initial zeros), the states read by C and the inter-chunk
output. torch.einsum hands bmm views of its operands when batch, chunk and head dimensions
merge (one sequence in one chunk) and copies otherwise: then B, C and the discretized x are
kept once more and the states read by C are a copy of c states, not a view of all c + 1.
The gated RMSNorm (MambaRMSNormGated) runs in fp32: the gate's fp32 copy and silu of it,
the scan output (a view of the padded output for one sequence), the gated product, its
normalized groups and their rsqrt; without it (FalconH1Mixer with mamba_rms_norm = false,
modeling_falcon_h1.py) the scan output is gated by silu(z) in bf16. The output projection
keeps its bf16 input. NemotronHMamba2Mixer and GraniteMoeHybridMambaLayer run the same
code; FalconH1Mixer too, but for its muP multipliers (its input scaled by
ssm_in_multiplier, a copy in_proj keeps instead of the norm's output; in_proj's output
times the mup_vector buffer, which keeps nothing more). Two masks
of Q x Q and of (c + 1) x (c + 1) booleans and A = -exp(A_log) are kept once per layer.
Exact at one sequence of 128, 256 and 512 tokens and at two of 128 and 512; two of 256
tokens come out 1.4% over (a copy the einsum avoids that this rule counts)."""

from __future__ import annotations

import math
from collections.abc import Callable

from llmpar.footprint.activations.common import (
    FP32_BYTES,
    INSIDE_TP,
    OUTSIDE_TP,
    saved,
)
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.inventory import SavedTensor

BOOL_BYTES = 1.0


def _gating(ctx: Context, fp32: Callable[..., SavedTensor]) -> list[SavedTensor]:
    """The scan output's gate: the gated RMSNorm in fp32 (MambaRMSNormGated: the gate's
    fp32 copy and silu of it, the gated product, its normalized groups and their rsqrt),
    or without it (Falcon-H1's mamba_rms_norm = false: scan_output * silu(z)) silu(z) in
    the activations' dtype, whose input z is in_proj's output, already kept."""
    mamba, sizes = ctx.model.mamba, ctx.sizes
    assert mamba is not None
    inner, s = mamba.inner_width, sizes.s
    if not mamba.gated_norm:
        return [ctx.per_token("silu(z)", "kept by the gating product", "d_in", inner, ctx.d,
                              INSIDE_TP)]
    return [
        fp32("gate z (fp32) and silu(z)", "kept by silu and the gating product", s,
             ("2*d_in", 2 * inner)),
        fp32("gated product and its normalized groups", "kept by pow, rsqrt's product and "
             "the weight's product", s, ("2*d_in", 2 * inner)),
        fp32("gated norm rsqrt", "per group", s, ("G", mamba.num_groups)),
    ]


def mamba_mixer_tensors(ctx: Context) -> list[SavedTensor]:
    """One Mamba2Mixer's saved tensors on the torch path (see the module docstring)."""
    mamba, sizes = ctx.model.mamba, ctx.sizes
    assert mamba is not None
    b, s = sizes.b, sizes.s
    heads, head_dim = mamba.num_heads, mamba.head_dim
    state, chunk, taps = mamba.state_size, mamba.chunk_size, mamba.conv_kernel_size
    inner, conv = mamba.inner_width, mamba.conv_width
    chunks = math.ceil(s[1] / chunk)
    padded = ("S", chunks * chunk)
    h, n, p, q = ("H", heads), ("N", state), ("P", head_dim), ("Q", chunk)
    c, c1 = ("c", chunks), ("c+1", chunks + 1)
    view = b[1] == 1 and chunks == 1  # bmm gets views of the einsum operands
    d, f = ctx.d, FP32_BYTES

    def fp32(name: str, reason: str, *shape: tuple[str, int]) -> SavedTensor:
        return saved(name, reason, (b, *shape), f, INSIDE_TP)

    tensors = [
        ctx.per_token("mixer input", "input of in_proj", "h", sizes.h[1], d, OUTSIDE_TP),
        saved("A = -exp(A_log) (fp32)", "kept by exp and by the product with dt", (
            ("2*H", 2 * heads),), f, frozenset()),
        ctx.per_token("z, x, B, C and dt", "in_proj's output, whose view the convolution "
                      "keeps", "2*d_in+2*G*N+H", inner + conv + heads, d, INSIDE_TP),
        saved("convolution output", "padded by kernel - 1, kept by silu", (
            b, ("conv", conv), ("s+k-1", s[1] + taps - 1)), d, INSIDE_TP),
        ctx.per_token("dt + dt_bias and its softplus", "kept by softplus and clamp", "2*H",
                      2 * heads, d, INSIDE_TP),
        fp32("x (fp32)", "kept by the product with dt", s, h, p),
        fp32("x padded (fp32)", "kept by the D residual", padded, h, p),
        fp32("dt (fp32), twice", "kept by the products with x and with A", s, ("2*H", 2 * heads)),
        saved("segment-sum masks (bool)", "kept by masked_fill, two per segment sum", (
            ("2*Q^2+2*(c+1)^2", 2 * chunk * chunk + 2 * (chunks + 1) ** 2),), BOOL_BYTES,
              frozenset()),
        fp32("decay within chunks L", "exp(segsum(A)), kept by exp", h, c, q, q),
        fp32("B and C repeated to the heads, padded", "operands of C.B^T", padded, h,
             ("2*N", 2 * state)),
        fp32("scores G = C.B^T", "kept by the product with L", c, q, q, h),
        fp32("masked scores M", "bmm's copy for M.x", c, h, q, q),
        fp32("discretized x by chunks", "kept by bmm", padded, h, p),
        fp32("decays per position", "exp of the cumulative A, twice", h, padded, ("2", 2)),
        fp32("decay between chunks", "exp(segsum) over the chunk states", h, c1, c1),
        fp32("B weighted by its decay", "operand of the chunk states' bmm", padded, h, n),
        fp32("chunk states", "the initial zeros and each chunk's state", h, c1, p, n),
        fp32("states read by C", "a view of the chunk states, or a copy of c of them", h, (
            ("c+1", chunks + 1) if view else c), n, p),
        fp32("inter-chunk output C.states", "kept by the product with the decay", padded, h, p),
        fp32("scan output (fp32)", "kept by the gating product; a view of the padded "
             "output for one sequence", padded if b[1] == 1 else s, ("d_in", inner)),
        *_gating(ctx, fp32),
        ctx.per_token("output projection input", "input of out_proj", "d_in", inner, d,
                      INSIDE_TP),
    ]
    if not view:
        tensors.append(fp32("B, C and the discretized x once more", "bmm's copies of "
                            "operands whose dimensions do not merge", padded, h,
                            ("2*N+P", 2 * state + head_dim)))
    return tensors
