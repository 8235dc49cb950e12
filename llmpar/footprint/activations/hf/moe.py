"""What a mixture-of-experts MLP keeps in transformers: the router, the routed experts
(b * s * k token copies: transformers drops no token) and the shared experts.

Routers: Mixtral softmax(logits.float()), top-k, renormalized in place, fp32 weights;
Qwen-MoE softmax(dtype=float), top-k, renormalized when norm_topk_prob, cast back;
DeepSeek-V3 an fp32 linear, sigmoid scores, group-limited top-k, gathered and
renormalized fp32 weights; Granite 4.0-H (GraniteMoeHybridTopKRouter) the top-k of the
fp32 logits, softmax over those k, cast back; gpt-oss (GptOssTopKRouter) the top-k of a
biased linear's logits, softmax over those k in the activations' dtype, its experts the
clamped SwiGLU with biases; ERNIE 4.5 (Ernie4_5_MoeTopKRouter) an fp32
linear, softmax, the top-k of the probabilities plus e_score_correction_bias, the chosen
probabilities divided by their clamped sum, cast back; MiniMax-M2 (MiniMaxM2TopKRouter) a
linear in the weights' dtype, sigmoid of the fp32 logits, the top-k of the scores plus
e_score_correction_bias, gathered and renormalized in place, fp32 weights. Only what the
loss's graph reaches stays alive after the forward: a branch that yields only indices is
freed with it.
Experts: the grouped_mm implementation (integrations/moe.py, transformers' default)
sorts the token copies by expert and runs two grouped matmuls; the eager loop runs one
F.linear per expert. Sources: modeling_mixtral.py, modeling_qwen3_moe.py,
modeling_deepseek_v3.py, modeling_granitemoehybrid.py, modeling_gpt_oss.py,
modeling_ernie4_5_moe.py, modeling_minimax_m2.py and integrations/moe.py of transformers
5.24.0, measured with torch 2.13.0.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.activations.common import (
    FP32_BYTES,
    INSIDE_TP,
    OUTSIDE_TP,
    ActivationUnavailable,
    saved,
)
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.mlp import first_projections, inner_tensors, mlp_input
from llmpar.footprint.inventory import SavedTensor

FP32_INPUT_ROUTERS = ("deepseek", "softmax-clamp")
"""The routers whose linear runs on an fp32 copy of the MoE input, which it keeps."""
INDEX_BYTES = 8.0
"""Indices are int64 (torch.topk, torch.sort, torch.where)."""
OFFSET_BYTES = 4.0
"""grouped_mm's per-expert offsets are int32 (torch.cumsum(..., dtype=torch.int32))."""


def _tokens(ctx: Context, name: str, reason: str, extra: tuple[tuple[str, int], ...], size: float,
            splits: frozenset[str] = OUTSIDE_TP) -> SavedTensor:
    return saved(name, reason, (*ctx.sizes.tokens, *extra), size, splits)


def _weight_bytes(ctx: Context) -> float:
    """Routing weights: fp32 for Mixtral and DeepSeek, cast back for Qwen-MoE and
    Granite."""
    return (ctx.d if ctx.family.router in ("softmax-cast", "topk-softmax", "topk-softmax-cast",
                                           "softmax-clamp")
            else FP32_BYTES)


def router_tensors(ctx: Context) -> list[SavedTensor]:
    moe = ctx.model.moe
    assert moe is not None
    experts, k = ("E", moe.num_experts), ("k", moe.experts_per_token)
    renormalized = [
        _tokens(ctx, "top-k weights before renormalization (fp32)", "in-place division "
                "keeps a copy of its input", (k,), FP32_BYTES),
        _tokens(ctx, "top-k weight sum (fp32)", "divisor of the in-place renormalization",
                (), FP32_BYTES),
    ] if ctx.family.norm_topk else []
    if ctx.family.router == "deepseek":
        # The group-limited choice (top-2 per group, top groups, the masked_fill of the
        # other groups' experts, the final topk) only yields indices: autograd frees those
        # nodes with the forward, and only the gather of the chosen scores keeps its index.
        return [
            ctx.per_token("router input (fp32)", "the router's linear runs in fp32", "h",
                          ctx.sizes.h[1], FP32_BYTES, OUTSIDE_TP, frozenset({"router"}), True),
            _tokens(ctx, "router scores (fp32)", "kept by sigmoid", (experts,), FP32_BYTES),
            _tokens(ctx, "top-k indices", "kept by the gather of the chosen scores", (k,),
                    INDEX_BYTES),
            *renormalized,
        ]
    if ctx.family.router == "topk-softmax-cast":
        return [
            _tokens(ctx, "top-k indices", "kept by topk of the logits", (k,), INDEX_BYTES),
            _tokens(ctx, "top-k probabilities", "kept by the softmax over the k, in the "
                    "activations' dtype", (k,), ctx.d),
            *renormalized,
        ]
    if ctx.family.router == "sigmoid":
        # The linear runs in the weights' dtype on the MoE input itself; the biased scores'
        # top-k yields only indices.
        return [
            _tokens(ctx, "router scores (fp32)", "kept by sigmoid of the fp32 logits and the "
                    "gather", (experts,), FP32_BYTES),
            _tokens(ctx, "top-k indices", "kept by the gather of the chosen scores", (k,),
                    INDEX_BYTES),
            *renormalized,
        ]
    if ctx.family.router == "softmax-clamp":
        # The biased scores' top-k yields only indices (freed with the forward); the
        # division is out of place, so it keeps both operands and clamp keeps the sum.
        return [
            ctx.per_token("router input (fp32)", "the router's linear runs in fp32", "h",
                          ctx.sizes.h[1], FP32_BYTES, OUTSIDE_TP, frozenset({"router"}), True),
            _tokens(ctx, "router probabilities (fp32)", "kept by softmax and the gather",
                    (experts,), FP32_BYTES),
            _tokens(ctx, "top-k indices", "kept by the gather of the chosen probabilities",
                    (k,), INDEX_BYTES),
            _tokens(ctx, "top-k probabilities (fp32)", "dividend of the renormalization",
                    (k,), FP32_BYTES),
            _tokens(ctx, "top-k probability sum (fp32)", "kept by clamp", (), FP32_BYTES),
            _tokens(ctx, "clamped sum (fp32)", "divisor of the renormalization", (),
                    FP32_BYTES),
        ]
    if ctx.family.router == "topk-softmax":
        return [
            _tokens(ctx, "top-k indices", "kept by topk of the fp32 logits", (k,),
                    INDEX_BYTES),
            _tokens(ctx, "top-k probabilities (fp32)", "kept by the softmax over the k",
                    (k,), FP32_BYTES),
            *renormalized,
        ]
    return [
        _tokens(ctx, "router probabilities (fp32)", "kept by softmax", (experts,), FP32_BYTES),
        _tokens(ctx, "top-k indices", "kept by topk", (k,), INDEX_BYTES),
        *renormalized,
    ]


def _routed(ctx: Context, name: str, reason: str, symbol: str, width: int | None,
            size: float, splits: frozenset[str] = OUTSIDE_TP) -> SavedTensor:
    moe = ctx.model.moe
    assert moe is not None
    extra = (("k", moe.experts_per_token),) + (((symbol, width),) if width else ())
    return _tokens(ctx, name, reason, extra, size, splits)


def clamped_swiglu(ctx: Context, width: int) -> list[SavedTensor]:
    """gpt-oss's experts (GptOssExperts._apply_gate, modeling_gpt_oss.py of transformers
    5.24.0): gate and up are the even and odd columns of one projection's output, each
    clamped at swiglu_limit (clamp keeps its input: the whole output, through both
    views), glu = gate * sigmoid(alpha * gate) keeps the clamped gate and the sigmoid,
    (up + 1) * glu keeps both, and the down projection keeps the product. Per token
    copy, b x s x k x ffn_e each but the projection's 2 ffn_e."""
    down = frozenset({"experts.down_proj"})

    def inner(name: str, reason: str, symbol: str = "ffn_e", columns: int = width,
              only_down: bool = False) -> SavedTensor:
        return ctx.per_token(f"expert {name}", reason, symbol, columns, ctx.d, INSIDE_TP,
                             down if only_down else frozenset(), only_down)

    return [inner("gate/up output", "kept by both clamps (through their strided views)",
                  "2*ffn_e", 2 * width),
            inner("clamped gate", "operand of gate * sigmoid(alpha * gate)"),
            inner("sigmoid(alpha * gate)", "kept by sigmoid and the product"),
            inner("glu", "operand of (up + 1) * glu"),
            inner("up + 1", "operand of (up + 1) * glu"),
            inner("gated product", "input of the down projection", only_down=True)]


def expert_tensors(ctx: Context) -> list[SavedTensor]:
    """The routed experts' tensors for b * s * k token copies."""
    moe = ctx.model.moe
    assert moe is not None
    h = ctx.sizes.h[1]
    inner = (clamped_swiglu(ctx, moe.expert_ffn_hidden_size) if ctx.family.clamped_swiglu
             else inner_tensors(ctx, "ffn_e", moe.expert_ffn_hidden_size, "expert ",
                                "experts"))
    inner = [saved(t.name, t.reason, (*t.shape[:2], ("k", moe.experts_per_token), t.shape[2]),
                   t.bytes_per_element, t.splits, weights=t.weights,
                   weights_only=t.weights_only) for t in inner]
    dispatched = _routed(ctx, "dispatched tokens", "input of the experts' first projection",
                         "h", h, ctx.d)
    copies = [
        attrs.evolve(dispatched, weights=first_projections(ctx, "experts"), weights_only=True),
        *inner,
        _routed(ctx, "expert output", "operand of the routing-weight product", "h", h, ctx.d),
        _routed(ctx, "routing weights (sorted)", "operand of the routing-weight product", "",
                None, _weight_bytes(ctx)),
    ]
    if ctx.run.experts == "eager":
        if ctx.family.clamped_swiglu:
            raise ActivationUnavailable(
                "gpt-oss's eager experts loop (GptOssExperts.forward) is not measured; "
                "the grouped_mm experts are")
        return copies + [
            _routed(ctx, "token/slot indices (torch.where)", "nonzero keeps both index "
                    "columns in one int64 storage", "2", 2, INDEX_BYTES),
            _routed(ctx, "weighted expert output", "index_add_ keeps its source, cast to "
                    "the hidden states' dtype", "h", h, ctx.d),
        ]
    biases = [_routed(ctx, "sorted expert ids", "kept by the gathers of the experts' "
                      "biases", "", None, INDEX_BYTES)] if ctx.family.clamped_swiglu else []
    return copies + biases + [
        _routed(ctx, "token indices (perm // k)", "kept by the gather of the tokens", "",
                None, INDEX_BYTES),
        _routed(ctx, "sort permutation", "kept by the gather of the routing weights", "",
                None, INDEX_BYTES),
        _routed(ctx, "inverse permutation", "kept by the gather back to token order", "",
                None, INDEX_BYTES),
        saved("expert offsets (int32)", "group boundaries of both grouped_mm calls",
              (("E", moe.num_experts),), OFFSET_BYTES, frozenset()),
    ]


def shared_expert_tensors(ctx: Context) -> list[SavedTensor]:
    moe = ctx.model.moe
    assert moe is not None
    if not moe.num_shared_experts:
        return []
    width = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size
                                      or moe.expert_ffn_hidden_size)
    tensors = inner_tensors(ctx, "n_s*ffn_s", width, "shared expert ", "shared_experts")
    if moe.shared_expert_gate:
        tensors += [
            _tokens(ctx, "shared expert gate (sigmoid)", "kept by sigmoid and the product",
                    (), ctx.d),
            ctx.per_token("shared expert output", "operand of the gate product", "h",
                          ctx.sizes.h[1], ctx.d, OUTSIDE_TP),
        ]
    return tensors


def every_copy_tensors(ctx: Context) -> list[SavedTensor]:
    """Llama 4's router and experts (Llama4Router and Llama4TextMoe.forward,
    Llama4TextExperts.forward, modeling_llama4.py of transformers 5.24.0; measured in
    validation/data/llama-4-scout.json): topk of the logits keeps its indices (so does the
    scatter of the chosen logits into -inf), sigmoid of the fp32 scores its output; the
    scores, cast back and transposed, made contiguous, scale the input repeated once per
    expert (the product keeps both), and every expert runs on its own copy of every token
    (b x s x E copies: unchosen ones scaled by 0), torch.bmm keeping the scaled copies and
    the gated product, SiLU the gate/up output (through its gate view) and the gating
    product SiLU's output."""
    moe = ctx.model.moe
    assert moe is not None
    experts, k, h = ("E", moe.num_experts), ("k", moe.experts_per_token), ctx.sizes.h[1]
    width = moe.expert_ffn_hidden_size

    def copies(name: str, reason: str, extra: tuple[tuple[str, int], ...],
               splits: frozenset[str] = OUTSIDE_TP,
               weights: frozenset[str] = frozenset()) -> SavedTensor:
        return saved(name, reason, (*ctx.sizes.tokens, experts, *extra), ctx.d, splits,
                     weights=weights, weights_only=bool(weights))

    return [
        _tokens(ctx, "top-k indices", "kept by topk and the scatter of the chosen logits",
                (k,), INDEX_BYTES),
        _tokens(ctx, "router scores (fp32)", "kept by sigmoid", (experts,), FP32_BYTES),
        copies("router scores per copy", "the scores transposed and made contiguous, "
               "operand of the scaling product", ()),
        copies("repeated input", "operand of the scaling product", (("h", h),)),
        copies("scaled copies", "input of the experts' gate/up bmm", (("h", h),),
               weights=first_projections(ctx, "experts")),
        copies("expert gate/up output", "kept by SiLU through its gate view",
               (("2*ffn_e", 2 * width),), INSIDE_TP),
        copies("expert activation output", "operand of the gating product",
               (("ffn_e", width),), INSIDE_TP),
        copies("expert gated product", "input of the down bmm", (("ffn_e", width),),
               INSIDE_TP, frozenset({"experts.down_proj"})),
    ]


def moe_tensors(ctx: Context) -> list[SavedTensor]:
    """The MoE MLP from its input (kept for the weight gradients of the router, unless it
    runs on an fp32 copy, and of the shared experts; the dispatch's gathers keep only
    their indices)."""
    moe = ctx.model.moe
    assert moe is not None
    weights = first_projections(ctx, "shared_experts") if moe.num_shared_experts else frozenset()
    if ctx.family.router not in FP32_INPUT_ROUTERS:
        weights |= {"router"}
    routed = (every_copy_tensors(ctx) if ctx.family.experts_every_copy
              else router_tensors(ctx) + expert_tensors(ctx))
    return [mlp_input(ctx, "moe", weights)] + routed + shared_expert_tensors(ctx)
