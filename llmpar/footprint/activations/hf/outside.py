"""What a transformers model keeps outside its layers: the embedding side (token ids,
positions, embedding norm and dropout), what every layer shares (RoPE cos/sin, an SDPA
mask) and the head (final norm, output layer input, soft-capping, the fp32 loss).

The loss is transformers' ForCausalLMLoss: logits.float(), labels padded by one and
shifted (labels[..., 1:].contiguous(), a view when b = 1, so the padded storage of
s + 1 ids stays alive), cross_entropy = log_softmax (keeps its fp32 output) + nll_loss
(keeps the labels and an fp32 total_weight). BertForMaskedLM calls CrossEntropyLoss on
its logits as they are (no fp32 copy) and takes the labels as given (the input ids
themselves here). Sources: loss/loss_utils.py and the modeling
files of transformers 5.24.0, measured with torch 2.13.0.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.activations.common import (
    FP32_BYTES,
    INSIDE_TP,
    OUTSIDE_TP,
    TOKEN_ID_BYTES,
    TOKENS_ONLY,
    saved,
)
from llmpar.footprint.activations.hf.attention import sdpa_mask
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.norms import norm_tensors
from llmpar.footprint.inventory import SavedTensor

EMBEDDING = frozenset({"embedding"})
"""nn.Embedding saves its indices only for its weight's gradient (embedding_backward in
PyTorch's tools/autograd/derivatives.yaml)."""


def _hidden(ctx: Context, name: str, reason: str,
            weights: frozenset[str] = frozenset()) -> SavedTensor:
    return ctx.per_token(name, reason, "h", ctx.sizes.h[1], ctx.d, OUTSIDE_TP, weights,
                         bool(weights))


def embedding_tensors(ctx: Context) -> list[SavedTensor]:
    model, s = ctx.model, ctx.sizes
    tensors = [saved("token ids", "input of the embedding lookup", s.tokens, TOKEN_ID_BYTES,
                     TOKENS_ONLY, weights=EMBEDDING, weights_only=True)]
    if model.position_embedding == "learned" and not model.embedding_norm:
        # GPT-2 builds position_ids = arange(s)[None]; BERT slices a registered buffer.
        tensors.append(saved("position ids", "input of the position embedding lookup",
                             (s.s,), TOKEN_ID_BYTES, TOKENS_ONLY, weights=EMBEDDING,
                             weights_only=True))
    if model.type_vocab_size:
        # BERT gathers its token_type_ids buffer into a new 1 x s tensor.
        tensors.append(saved("token type ids", "input of the token type embedding lookup",
                             (s.s,), TOKEN_ID_BYTES, TOKENS_ONLY, weights=EMBEDDING,
                             weights_only=True))
    # Gemma's sqrt(h) embedding scale is a registered buffer in the model's dtype: the
    # product keeps the buffer itself, no activation.
    if model.embedding_norm:
        tensors += norm_tensors(ctx, "embedding norm", "h", s.h[1])
    if ctx.family.residual_dropout and ctx.run.dropout.embedding > 0:
        tensors.append(_hidden(ctx, "embedding dropout mask", "CPU dropout noise in the "
                               "activations' dtype"))
    return tensors


def shared_tensors(ctx: Context) -> list[SavedTensor]:
    """Built once per forward and used by every layer (every pipeline stage keeps its
    own): RoPE's cos and sin, s x rotary_dim each for position_ids of shape 1 x s (a set
    per attention kind where the family says so, Gemma 3's local and global); SDPA's
    mask is kept in the layers. RoPE's are kept only where a layer attends: the rotary
    embedding of a model whose layers are all recurrent (Qwen3-Next's gated DeltaNets alone) is
    computed and never used, nor is one each layer copies (ERNIE 4.5's)."""
    model, s = ctx.model, ctx.sizes
    tensors = []
    if (model.position_embedding == "rope" and model.num_attention_layers
            and not ctx.family.rope_per_layer_fp32):
        # the rotated channels of a head (its rotary_fraction; MLA's qk_rope_head_dim):
        # transformers' rotary embeddings compute inv_freq over int(head_dim x
        # partial_rotary_factor) channels (compute_default_rope_parameters)
        width = model.rotary_dim // (2 if ctx.family.rope_half else 1)
        size = FP32_BYTES if ctx.family.rope_fp32 else ctx.d
        if ctx.family.rope_complex:
            # Llama 4's freqs_cis (torch.polar), complex64 over head_dim / 2 pairs; a model
            # whose layers are all NoPE layers (all global) never uses it
            if model.sliding_window is not None and model.sliding_window_pattern != 1:
                tensors.append(saved("RoPE frequencies (complex64)", "kept by the complex "
                                     "products with q and k", (s.s, ("d_rope/2", width // 2)),
                                     2 * FP32_BYTES, TOKENS_ONLY))
        else:
            windows = ({sliding for _, sliding in model.layer_kinds_in(0, model.num_layers or 0)}
                       if ctx.family.rope_per_window else {False})
            tensors += [saved(f"RoPE {name}{' (' + kind + ')' if len(windows) > 1 else ''}",
                              "kept by the products with q and k",
                              ((s.b, s.s) if ctx.family.rope_per_sample else (s.s,))
                              + (("d_rope", width),),
                              size, TOKENS_ONLY)
                        for kind in sorted("local" if w else "global" for w in windows)
                        for name in ("cos", "sin")]
    return tensors + sdpa_mask(ctx)


def _labels(ctx: Context) -> list[SavedTensor]:
    if not ctx.family.causal_lm:
        return []
    b, s = ctx.sizes.b, ctx.sizes.s
    shape = (("b*s+1", b[1] * s[1] + 1),) if b[1] == 1 else (b, s)
    return [saved("labels (shifted)", "kept by nll_loss; padded by one, shifted", shape,
                  TOKEN_ID_BYTES, TOKENS_ONLY)]


def head_tensors(ctx: Context) -> list[SavedTensor]:
    model, s = ctx.model, ctx.sizes
    tensors = []
    if model.final_norm:
        # an fp32 residual stream (Mamba2's residual_in_fp32) keeps the normalized x in
        # fp32, as OLMo 2's norm does
        norm_ctx = (attrs.evolve(ctx, family=attrs.evolve(ctx.family, norm="olmo2"))
                    if ctx.family.residual_fp32 else ctx)
        tensors += norm_tensors(norm_ctx, "final norm", "h", s.h[1])
    if model.mlm_head:
        tensors += [_hidden(ctx, "head transform input", "input of the MLM head's dense"),
                    _hidden(ctx, "head activation input", "kept by F.gelu")]
        tensors += norm_tensors(ctx, "head norm", "h", s.h[1])
    tensors.append(_hidden(ctx, "output layer input", "input of the output projection",
                           frozenset({"head"})))
    if model.final_logit_softcapping is not None:
        tensors.append(saved("soft-capped logits (tanh)", "tanh keeps its output",
                             s.per_token("V", s.vocab[1]), ctx.d, INSIDE_TP))
    loss_bytes = FP32_BYTES if ctx.family.loss_upcast else ctx.d
    dtype = " (fp32)" if loss_bytes == FP32_BYTES else ""
    tensors.append(saved(f"log-probabilities{dtype}", "kept by log_softmax and nll_loss",
                         s.per_token("V", s.vocab[1]), loss_bytes, INSIDE_TP))
    tensors += _labels(ctx)
    tensors.append(saved(f"loss total_weight{dtype}", "kept by nll_loss", (), loss_bytes,
                         frozenset()))
    return tensors
