"""What the attention of a transformers model keeps, eager or through SDPA.

Eager attention is Python in each modeling file (eager_attention_forward): Q.K^T with
keys and values expanded to every query head by repeat_kv, an optional tanh
soft-capping, a softmax (in fp32 and cast back, for Llama's descendants), dropout and
probabilities.V. SDPA is torch.nn.functional.scaled_dot_product_attention; on the CPU
it runs _scaled_dot_product_flash_attention_for_cpu, which keeps Q, K, V as passed,
the output and an fp32 log-sum-exp per head and query, and falls back to the math
path (every operand upcast to fp32, scores materialized) with dropout or when the
value head width differs from the query's (MLA). gpt-oss's eager attention appends a
learned sink logit per head before its softmax (modeling_gpt_oss.py); transformers has no
SDPA path for it. Sources: modeling_*.py and
integrations/sdpa_attention.py of transformers 5.24.0, measured with torch 2.13.0.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.activations.common import (
    FP32_BYTES,
    INSIDE_TP,
    OUTSIDE_TP,
    TOKENS_ONLY,
    ActivationUnavailable,
    saved,
)
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.norms import norm_tensors
from llmpar.footprint.inventory import SavedTensor

QKV_WEIGHTS = frozenset({"attention.q_proj", "attention.k_proj", "attention.v_proj"})
"""The products that take the attention block's normed input."""
O_WEIGHTS = frozenset({"attention.o_proj"})
MAX_GQA_HEAD_DIM = 256
"""transformers' use_gqa_in_sdpa passes enable_gqa only for head widths up to 256."""
BOOL_BYTES = 1.0
INDEX_BYTES = 8.0
"""Indices are int64 (max over a dimension)."""


def kernel(ctx: Context) -> str:
    """eager, flash (SDPA's fused kernel) or math (SDPA's composite fallback)."""
    if ctx.run.attention == "eager":
        return "eager"
    if not ctx.family.sdpa:
        raise ActivationUnavailable(
            f"transformers refuses SDPA for {ctx.family.name} (its PreTrainedModel's "
            "_supports_sdpa = False: SDPA takes no sink logits); use 'hf-eager'")
    if ctx.model.attention_logit_softcapping is not None:
        raise ActivationUnavailable(
            "attention soft-capping runs only with eager attention in transformers "
            "(Gemma2PreTrainedModel._supports_sdpa = False); use 'hf-eager'")
    if ctx.run.dropout.attention > 0 or ctx.model.qk_head_dim != ctx.model.value_head_dim:
        return "math"
    return "flash"


def windowed_share(ctx: Context, moe: bool | None) -> float:
    """The share of a group's layers that attend within the sliding window (Llama 4: its
    chunk), of its MoE layers, its dense ones, or all layers (`moe` None), in closed form
    (Model.layer_kinds_in): 1 where every layer is windowed, 0 without a window."""
    model = ctx.model
    kinds = model.layer_kinds_in(0, model.num_layers or 0)
    chosen = {kind: n for kind, n in kinds.items() if moe is None or kind[0] == moe}
    total = sum(chosen.values())
    if not total:
        return 1.0 if model.sliding_window is not None else 0.0
    return sum(n for (_, windowed), n in chosen.items() if windowed) / total


def sdpa_mask_share(ctx: Context, moe: bool | None) -> float:
    """The share of a group's layers whose SDPA call gets a materialized mask: a windowed
    (or chunked) layer once the sequence reaches its window, where masking_utils'
    _ignore_causal_mask_sdpa refuses the is_causal skip (kv_length >= local_attention_size);
    a global layer's create_causal_mask returns None without padding, and SDPA runs
    is_causal (transformers 5.24.0; measured with Gemma 3's and Llama 4's windowed and
    global layers side by side, validation/data/gemma-3-1b.json and llama-4-scout.json);
    every layer of a model that always builds one (`Family.mask_always`)."""
    window = ctx.model.sliding_window
    if ctx.run.attention == "sdpa" and ctx.family.mask_always:
        return 1.0
    if ctx.run.attention != "sdpa" or window is None or ctx.sequence < window:
        return 0.0
    return windowed_share(ctx, moe)


def _heads(ctx: Context) -> tuple[int, int]:
    model = ctx.model
    assert model.num_attention_heads is not None and model.num_kv_heads is not None
    return model.num_attention_heads, model.num_kv_heads


def _width(ctx: Context, name: str, reason: str, symbol: str, width: int,
           size: float | None = None, weights: frozenset[str] = frozenset(),
           weights_only: bool = False) -> SavedTensor:
    return ctx.per_token(name, reason, symbol, width, ctx.d if size is None else size,
                         INSIDE_TP, weights, weights_only)


def _scores(ctx: Context, name: str, reason: str, size: float) -> SavedTensor:
    return saved(name, reason, ctx.sizes.scores, size, INSIDE_TP, attention_score=True)


def _qk_norms(ctx: Context) -> list[SavedTensor]:
    """Qwen3/Gemma 3 normalize each head (head_dim weights); OLMo 2 the whole query and
    key projections."""
    model = ctx.model
    if not model.qk_norm:
        return []
    heads, kv_heads = _heads(ctx)
    if model.qk_norm_scope == "head":
        return (norm_tensors(ctx, "query norm", "d_head", model.query_width, INSIDE_TP,
                             heads=("a", heads), row_splits=INSIDE_TP, group="attention")
                + norm_tensors(ctx, "key norm", "d_head", model.kv_width, INSIDE_TP,
                               heads=("kv", kv_heads), row_splits=INSIDE_TP,
                               group="attention"))
    return (norm_tensors(ctx, "query norm", "a*d_head", model.query_width, INSIDE_TP,
                         row_splits=TOKENS_ONLY, group="attention")
            + norm_tensors(ctx, "key norm", "kv*d_head", model.kv_width, INSIDE_TP,
                           row_splits=TOKENS_ONLY, group="attention"))


def _fused_width(ctx: Context) -> int:
    return ctx.model.query_width + ctx.model.kv_width + ctx.model.value_width


def _operands_eager(ctx: Context) -> list[SavedTensor]:
    """Q, K (expanded), V (expanded) as torch.matmul keeps them."""
    model = ctx.model
    heads, kv_heads = _heads(ctx)
    fused = ("(a+2kv)*d_head", _fused_width(ctx))
    if ctx.family.fused_qkv and not ctx.family.rope:
        # GPT-2: q, k and v are views of c_attn's output; matmul keeps the views (b = 1) or
        # copies of the same total size (b > 1).
        return [_width(ctx, "fused q/k/v output", "operands of Q.K^T and P.V (views)", *fused)]
    expanded = " expanded by repeat_kv" if heads != kv_heads else ""
    if expanded and kv_heads == 1 and ctx.batch == 1:
        # One kv head (Gemma 3 1B): repeat_kv's expand(b, 1, a, s, d).reshape(b, a, s, d)
        # stays a view (stride 0 over the heads), and matmul folds (b, a) into bmm's batch
        # without a copy only when b = 1: Q.K^T and P.V keep the unexpanded storages.
        return [_width(ctx, "query", "operand of Q.K^T", "a*d_head", model.query_width),
                _width(ctx, "key (one kv head, a view)", "operand of Q.K^T", "kv*d_head",
                       model.kv_width),
                _width(ctx, "value (one kv head, a view)", "operand of P.V", "kv*d_v",
                       model.kv_width // model.qk_head_dim * model.value_head_dim)]
    tensors = [
        _width(ctx, "query", "operand of Q.K^T", "a*d_head", model.query_width),
        _width(ctx, f"key{expanded}", "operand of Q.K^T", "a*d_head", model.query_width),
    ]
    if ctx.family.fused_qkv and heads == kv_heads and ctx.batch == 1:
        # Phi-3: v is a view of qkv_proj's output; matmul merges (b, a) without a copy
        # only when b = 1, and then keeps the whole fused storage.
        tensors.append(_width(ctx, "fused q/k/v output", "kept whole by the value view",
                              *fused))
    else:
        tensors.append(_width(ctx, f"value{expanded}", "operand of P.V", "a*d_v",
                              model.attention_output_width))
    return tensors


def _probabilities_eager(ctx: Context) -> list[SavedTensor]:
    d = ctx.d
    tensors = []
    if ctx.model.attention_logit_softcapping is not None:
        tensors.append(_scores(ctx, "soft-capped scores (tanh)", "tanh keeps its output", d))
    if ctx.family.attention_sinks:
        # gpt-oss: cat(scores, sinks) - its row maximum, softmax in the activations' dtype;
        # P.V reads a view of the softmax output without the sink column
        s, sink = ctx.sizes.s, (*ctx.sizes.scores[:3], ("s+1", ctx.sizes.s[1] + 1))
        tensors += [saved("row maximum indices (int64)", "kept by max for its backward",
                          (ctx.sizes.b, ctx.sizes.a, s), INDEX_BYTES, INSIDE_TP),
                    saved("softmax output with the sink column", "kept by softmax; P.V "
                          "keeps a view of it", sink, d, INSIDE_TP, attention_score=True)]
    elif ctx.family.softmax_fp32:
        tensors.append(_scores(ctx, "softmax output (fp32)", "softmax(dtype=float32) keeps "
                               "its output", FP32_BYTES))
        if ctx.upcast:
            tensors.append(_scores(ctx, "attention probabilities", "the softmax cast back, "
                                   "operand of P.V", d))
    else:
        tensors.append(_scores(ctx, "softmax output", "kept by softmax and P.V", d))
    if ctx.run.dropout.attention > 0:
        tensors += [_scores(ctx, "attention dropout mask", "CPU dropout keeps its scaled "
                            "Bernoulli noise in the input's dtype (CUDA: 1-byte mask)", d),
                    _scores(ctx, "attention dropout output", "operand of P.V", d)]
    return tensors


def _flash_keys_values(ctx: Context, masked: bool) -> list[SavedTensor]:
    """K and V as SDPA gets them, with a mask (`masked`: repeated to every head by
    repeat_kv) or without one (GQA passed to SDPA, enable_gqa, up to transformers'
    MAX_GQA_HEAD_DIM: integrations/sdpa_attention.py's use_gqa_in_sdpa)."""
    model = ctx.model
    heads, kv_heads = _heads(ctx)
    gqa = heads != kv_heads and not masked and (
        model.qk_head_dim == model.value_head_dim <= MAX_GQA_HEAD_DIM)
    expanded = heads != kv_heads and not gqa
    # repeat_kv of one kv head is a view (stride 0 over the heads), which SDPA keeps as
    # passed: its storage is the unexpanded one
    kv_symbol, kv_width = (("a*d_head", model.query_width) if expanded and kv_heads > 1
                           else ("kv*d_head", model.kv_width))
    tensors = [_width(ctx, "key" + (" expanded by repeat_kv" if expanded else ""),
                      "SDPA input", kv_symbol, kv_width)]
    if ctx.family.fused_qkv and not expanded:
        tensors.append(_width(ctx, "fused q/k/v output", "kept whole by the value view",
                              "(a+2kv)*d_head", _fused_width(ctx)))
    elif model.mla is not None:
        # MLA's V is a view of kv_b_proj's output (mla.py), which SDPA keeps whole
        mla = model.mla
        tensors.append(_width(ctx, "kv_b_proj output", "kept whole by the value view",
                              "a*(d_nope+d_v)", heads * (mla.qk_nope_head_dim + mla.v_head_dim)))
    else:
        tensors.append(_width(ctx, "value" + (" expanded by repeat_kv" if expanded else ""),
                              "SDPA input", kv_symbol.replace("d_head", "d_v"),
                              kv_width // model.qk_head_dim * model.value_head_dim))
    return tensors


def _flash(ctx: Context, moe: bool | None) -> list[SavedTensor]:
    """SDPA's fused kernel keeps Q, K, V as passed (views keep their whole storage), the
    output and the fp32 log-sum-exp per head and query; where a share of the group's
    layers gets a mask (`sdpa_mask_share`), its keys, values and mask are counted at that
    share, the unmasked layers' at the rest."""
    model = ctx.model
    share = sdpa_mask_share(ctx, moe)
    if ctx.family.fused_qkv and not ctx.family.rope:
        tensors = [_width(ctx, "fused q/k/v output", "Q, K and V are views of it",
                          "(a+2kv)*d_head", _fused_width(ctx))]
    else:
        tensors = [_width(ctx, "query", "SDPA input", "a*d_head", model.query_width)]
        masked, unmasked = _flash_keys_values(ctx, True), _flash_keys_values(ctx, False)
        if share >= 1 or masked == unmasked:
            tensors += masked if share >= 1 else unmasked
        else:
            tensors += (_on_share(masked, share, "windowed layers")
                        + _on_share(unmasked, 1 - share, "global layers"))
    lse = (ctx.sizes.b, ctx.sizes.a, ctx.sizes.s)
    copied = (ctx.family.fused_qkv and ctx.family.rope or ctx.family.rope_concat
              or model.mla is not None)
    # SDPA converts the boolean mask to an additive one in the query's dtype
    # (convert_boolean_attn_mask, aten/src/ATen/native/transformers/attention.cpp) in
    # every call, and the CPU flash kernel keeps it: b x 1 x s x s per layer
    kind = "sparse attention" if ctx.family.mask_always else "sliding-window"
    tensors += _on_share([saved(f"{kind} mask (additive)", "the boolean mask "
                                "converted by SDPA, kept by its kernel",
                                (ctx.sizes.b, ctx.sizes.s, ("s", ctx.sequence)), ctx.d,
                                TOKENS_ONLY, attention_score=True)], share, "windowed layers")
    tensors += [
        saved("log-sum-exp (fp32)", "per head and query, for the backward", lse, FP32_BYTES,
              INSIDE_TP),
        _width(ctx, "attention output", "kept by SDPA", "a*d_v", model.attention_output_width,
               weights=frozenset() if copied else O_WEIGHTS),
    ]
    if copied:
        # The CPU kernel lays its output out like the query. A query sliced from a fused
        # projection comes out of RoPE as a new b x a x s x d tensor (Phi-3), as does one
        # RoPE concatenates (Qwen3-Next) or MLA's torch.cat of its two parts (measured
        # with DeepSeek-V3.2's layers at equal query and value head widths), so the output
        # projection needs a transposed copy; otherwise (a b x s x a x d layout) the
        # transposed output is already contiguous and is the output projection's input.
        tensors.append(_width(ctx, "output projection input", "the output transposed and "
                              "made contiguous", "a*d_v", model.attention_output_width,
                              weights=O_WEIGHTS, weights_only=True))
    return tensors


def _math(ctx: Context) -> list[SavedTensor]:
    """SDPA's math path upcasts Q, K, V to fp32, expands K and V to every head, scales Q
    and K by sqrt(scale) and materializes the fp32 scores (aten
    _scaled_dot_product_attention_math)."""
    model = ctx.model
    tensors = [
        _width(ctx, "query (fp32, scaled)", "operand of Q.K^T", "a*d_head", model.query_width,
               FP32_BYTES),
        _width(ctx, "key (fp32, scaled, expanded)", "operand of Q.K^T", "a*d_head",
               model.query_width, FP32_BYTES),
        _scores(ctx, "softmax output (fp32)", "_safe_softmax keeps its output", FP32_BYTES),
    ]
    if ctx.run.dropout.attention > 0:
        tensors += [_scores(ctx, "attention dropout mask (fp32)", "noise in the fp32 "
                            "scores' dtype", FP32_BYTES),
                    _scores(ctx, "attention dropout output (fp32)", "operand of P.V",
                            FP32_BYTES)]
    return tensors + [
        _width(ctx, "value (fp32, expanded)", "operand of P.V", "a*d_v",
               model.attention_output_width, FP32_BYTES),
        _width(ctx, "output projection input", "the output cast back and made contiguous",
               "a*d_v", model.attention_output_width, weights=O_WEIGHTS, weights_only=True),
    ]


def core_tensors(ctx: Context, operands_eager: list[SavedTensor],
                 moe: bool | None = None) -> list[SavedTensor]:
    """From Q, K, V to the output projection's input, by kernel (`moe` as for
    `attention_tensors`)."""
    found = kernel(ctx)
    if found == "flash":
        return _flash(ctx, moe)
    if found == "math":
        return _math(ctx)
    return operands_eager + _probabilities_eager(ctx) + [
        _width(ctx, "output projection input", "P.V transposed and made contiguous", "a*d_v",
               ctx.model.attention_output_width, weights=O_WEIGHTS, weights_only=True)]


def output_gate(ctx: Context, tensors: list[SavedTensor]) -> list[SavedTensor]:
    """Qwen3-Next's gated attention (Qwen3NextAttention.forward in modeling_qwen3_next.py,
    transformers 5.24.0; Qiu et al. 2025, "Gated Attention for Large Language Models",
    arXiv:2505.06708): the output, made contiguous, times sigmoid of the gate half of
    q_proj's output. The product keeps both, and the
    output projection keeps the product instead of the output."""
    if not ctx.model.attention_output_gate:
        return tensors
    *core, output = tensors
    width = ctx.model.attention_output_width
    return [*core,
            attrs.evolve(output, reason="kept by the product with the gate", weights=frozenset(),
                         weights_only=False),
            _width(ctx, "output gate sigmoid(g)", "kept by sigmoid and the product", "a*d_v",
                   width),
            _width(ctx, "gated output", "input of the output projection", "a*d_v", width,
                   weights=O_WEIGHTS, weights_only=True)]


def residual_dropout(ctx: Context, label: str) -> list[SavedTensor]:
    """GPT-2, BERT and Phi-3 drop out each residual branch: on the CPU the mask is the
    scaled Bernoulli noise in the activations' dtype (ATen _dropout_impl); CUDA's fused
    native_dropout keeps a 1-byte mask."""
    if not (ctx.family.residual_dropout and ctx.run.dropout.hidden > 0):
        return []
    return [ctx.per_token(f"{label} residual dropout mask", "dropout on the branch output",
                          "h", ctx.sizes.h[1], ctx.d, OUTSIDE_TP)]


def query_scale(ctx: Context) -> list[SavedTensor]:
    """Ministral 3's attention temperature (Ministral3Attention.forward,
    modeling_ministral3.py of transformers 5.24.0, after Llama 4's): the rotated queries
    times a per-position scale, computed in every layer from position_ids (1 x s, whatever
    the batch) and cast to the activations' dtype; the product keeps the scale."""
    if not ctx.family.query_scale:
        return []
    return [saved("query scale", "per position, kept by its product with the queries",
                  (ctx.sizes.s,), ctx.d, TOKENS_ONLY)]


def rope_per_layer(ctx: Context) -> list[SavedTensor]:
    """ERNIE 4.5's apply_rotary_pos_emb (modeling_ernie4_5_moe.py, transformers 5.24.0):
    each layer repeats the fp32 cos and sin halves into its own s x rotary_dim copies
    (cos[..., :d/2].repeat_interleave(2)), kept by the products with q.float() and
    k.float()."""
    if not ctx.family.rope_per_layer_fp32 or ctx.model.position_embedding != "rope":
        return []
    width = ctx.model.rotary_dim
    return [saved(f"RoPE {name} (fp32, this layer's copy)", "kept by the products with "
                  "q.float() and k.float()", (ctx.sizes.s, ("d_rope", width)), FP32_BYTES,
                  TOKENS_ONLY) for name in ("cos", "sin")]


def _on_share(tensors: list[SavedTensor], share: float, which: str) -> list[SavedTensor]:
    """`tensors` as kept by `share` of a group's layers (its `which` layers): each
    counted at that share of its bytes, so that the group's layers add up to the model's
    (a pipeline stage's layers are counted at the model's mix)."""
    if share >= 1:
        return tensors
    if share <= 0:
        return []
    return [attrs.evolve(t, bytes_per_element=t.bytes_per_element * share,
                         reason=f"{t.reason} (on {which}: {share:.4g} of the layers)")
            for t in tensors]


def rope_share(ctx: Context, moe: bool | None) -> float:
    """The share of a group's layers that rotate (Llama 4: the chunked layers; the
    global ones, every sliding_window_pattern-th, are NoPE layers), of its MoE layers,
    its dense ones, or all layers (`moe` None), in closed form (Model.layer_kinds_in)."""
    if ctx.model.sliding_window is None:
        raise ActivationUnavailable(
            "Llama 4's NoPE layers are its global ones: without a chunk size "
            "(attention_chunk_size) they are not told apart; use 'fused' or 'korthikanti'")
    return windowed_share(ctx, moe)


def nope_tensors(ctx: Context, moe: bool | None) -> list[SavedTensor]:
    """Llama 4's two layer kinds (Llama4TextAttention.forward, modeling_llama4.py of
    transformers 5.24.0; measured in validation/data/llama-4-scout.json): a RoPE layer's
    Llama4TextL2Norm of the rotated q and k where the model has it (qk_l2_norm:
    x.float() * rsqrt(mean(x^2) + eps), keeping the fp32 copy and the rsqrt per head; the
    complex products of RoPE keep only the shared frequencies), a NoPE layer's queries
    times the fp32 temperature log1p(floor((position + 1) / floor_scale)) * attn_scale + 1
    (1 x s, expanded over the batch), which the product keeps."""
    if not ctx.family.nope_layers:
        return []
    heads, kv_heads = _heads(ctx)
    norms = [
        _width(ctx, "query (fp32, L2 norm input)", "kept by pow and the product with rsqrt",
               "a*d_head", ctx.model.query_width, FP32_BYTES),
        _width(ctx, "query L2 norm rsqrt (fp32)", "operand of the product", "a", heads,
               FP32_BYTES),
        _width(ctx, "key (fp32, L2 norm input)", "kept by pow and the product with rsqrt",
               "kv*d_head", ctx.model.kv_width, FP32_BYTES),
        _width(ctx, "key L2 norm rsqrt (fp32)", "operand of the product", "kv", kv_heads,
               FP32_BYTES),
    ]
    temperature = [saved("query temperature (fp32)", "per position, kept by its product "
                         "with the queries", (ctx.sizes.s,), FP32_BYTES, TOKENS_ONLY)]
    share = rope_share(ctx, moe)
    return (_on_share(norms if ctx.model.qk_l2_norm else [], share, "RoPE layers")
            + _on_share(temperature, 1 - share, "NoPE layers"))


def attention_tensors(ctx: Context, moe: bool | None = None) -> list[SavedTensor]:
    """A standard (not MLA) attention block, from its input to its output projection
    (`moe`: whether it is of a MoE layer, a dense one or either, None, where its layer
    kinds differ by attention)."""
    inputs = [ctx.per_token("attention input", "input of the Q/K/V projections", "h",
                            ctx.sizes.h[1], ctx.d, OUTSIDE_TP, QKV_WEIGHTS, True),
              *query_scale(ctx)]
    return (inputs + rope_per_layer(ctx) + _qk_norms(ctx) + nope_tensors(ctx, moe)
            + output_gate(ctx, core_tensors(ctx, _operands_eager(ctx), moe))
            + residual_dropout(ctx, "attention"))


def sdpa_mask(ctx: Context) -> list[SavedTensor]:
    """Outside the layers SDPA keeps no mask: the boolean sliding-window mask transformers
    builds once per forward is converted in every layer (`_flash`), and the conversion is
    what the kernel keeps (measured with Gemma 3 1B at s = window = 512)."""
    return []
