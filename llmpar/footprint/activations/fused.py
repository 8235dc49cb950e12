"""`fused`: what a modern fused training stack keeps (Megatron-Core with Transformer
Engine, torchtitan), tensor by tensor.

- Attention is FlashAttention: it keeps Q, K and V (K and V at their own head count:
  GQA needs no expansion), the output O and the fp32 log-sum-exp per head and query,
  and recomputes the s x s scores in the backward (Dao 2023, FlashAttention-2,
  arXiv:2307.08691, Sec. 3.1.1 and Algorithm 2). O is also the output projection's
  input, kept once.
- Norms are fused kernels (Transformer Engine LayerNorm/RMSNorm, Apex
  FusedLayerNorm/FusedRMSNorm): each keeps its input and the fp32 rstd per row (and
  the fp32 mean for LayerNorm); the next linear keeps the normalized output
  (Transformer Engine LayerNormLinear saves ln_out for the weight gradient).
- No dropout by default (hidden_dropout = attention_dropout = 0, as Llama-style
  pretraining and torchtitan run), so no masks; `[training] hidden_dropout` above 0
  adds a one-byte mask of b x s x h after the embedding and after each layer's
  attention and MLP (Megatron-Core's bias-dropout-add; Korthikanti et al. 2022, Sec.
  4.1). Attention dropout inside the fused kernel keeps no mask (FlashAttention,
  arXiv:2205.14135, Sec. 3.1: the backward regenerates it).
- SwiGLU is one fused op (Megatron-Core bias_swiglu_impl, Transformer Engine swiglu)
  keeping its two inputs, the gate and up halves of fc1's output; fc2 keeps its input.
  A GELU MLP keeps fc1's output and fc2's input.
- RoPE is fused (Transformer Engine fused_apply_rotary_pos_emb): one fp32 frequency
  table of s x d_rope (the rotated channels of a head, `Model.rotary_dim`), shared by
  the layers.
- The loss is Megatron-Core's fused vocab-parallel cross-entropy
  (cross_entropy_loss_fusion): no fp32 copy of the logits; it keeps exp(logits) in the
  logits' dtype, the labels and a per-token target mask.
- Recurrent layers (gated DeltaNet: flash-linear-attention's chunk_gated_delta_rule;
  Mamba-2: mamba_ssm's mamba_split_conv1d_scan_combined) keep what their fused kernels
  save (`_linear_attention`, `_mamba`).
- MoE (Megatron-Core MoE with moe_permute_fusion): fp32 router probabilities and a
  boolean routing map per token and expert, the permuted token copies (b * s * k, no
  dropping), each copy's fc1 output and fc2 input, the expert output and the fp32
  routing weight kept to weight it.
Each tensor names the Megatron-Core module whose recomputation frees it
(`[training] recompute_modules`; `SavedTensor.module`).
This is the right model for Megatron-Core/torchtitan-style training; the default
activation model stays korthikanti.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from llmpar.footprint.activations.common import (
    ARCHITECTURE,
    FP32_BYTES,
    INSIDE_TP,
    MASK_BYTES,
    OUTSIDE_TP,
    TOKEN_ID_BYTES,
    TOKENS_ONLY,
    Sizes,
    require,
    saved,
    sizes_of,
)
from llmpar.footprint.inventory import ActivationInventory, LayerGroup, SavedTensor
from llmpar.spec.model import NO_MIXER, NO_MLP, mixer_parts

if TYPE_CHECKING:
    from llmpar.spec import Spec
    from llmpar.spec.model import Model

SOURCE = ("FlashAttention-2 (arXiv:2307.08691), Transformer Engine fused norms, SwiGLU and "
          "RoPE, Megatron-Core fused cross-entropy and MoE permutation, per tensor")
BOOL_BYTES = 1.0


def _inputs_of(*weights: str) -> frozenset[str]:
    """A tensor's `SavedTensor.weights`: the products whose weight gradients keep it (a
    linear layer keeps its input only for its weight's gradient: autograd's mm saves an
    operand only where the other requires a gradient, and Transformer Engine's Linear and
    LayerNormLinear save their input or ln_out only where `backward_needs_input =
    is_grad_enabled and weight.requires_grad`, transformer_engine/pytorch/module/linear.py
    and layernorm_linear.py)."""
    return frozenset(weights)


def _wide(sizes: Sizes, name: str, reason: str, symbol: str, width: int, size: float,
          splits: frozenset[str], module: str = "",
          weights: frozenset[str] = frozenset()) -> SavedTensor:
    return saved(name, reason, sizes.per_token(symbol, width), size, splits, module=module,
                 weights=weights, weights_only=bool(weights))


def _first_projections(model: Model, group: str) -> frozenset[str]:
    """The products that take an MLP's input: fc1 (gate and up) of parameter group
    `group`."""
    names = ("gate_proj", "up_proj") if model.gated else ("up_proj",)
    return frozenset(f"{group}.{name}" for name in names)


def _norm(sizes: Sizes, model: Model, label: str, symbol: str = "h",
          width: int | None = None, splits: frozenset[str] = OUTSIDE_TP,
          rows: tuple[tuple[str, int], ...] = ()) -> list[SavedTensor]:
    """A fused norm: its input and the fp32 rstd (and mean, for LayerNorm) per row."""
    width = sizes.h[1] if width is None else width
    stats = ["rstd"] + (["mean"] if model.norm == "layernorm" else [])
    return [_wide(sizes, f"{label} input", "kept by the fused norm", symbol, width, sizes.d,
                  splits)] + [
        saved(f"{label} {stat} (fp32)", "per row, kept by the fused norm",
              (*sizes.tokens, *rows), FP32_BYTES, splits if rows else OUTSIDE_TP)
        for stat in stats]


def _hidden(sizes: Sizes, name: str, reason: str, module: str = "",
            weights: frozenset[str] = frozenset()) -> SavedTensor:
    return _wide(sizes, name, reason, "h", sizes.h[1], sizes.d, OUTSIDE_TP, module, weights)


def _dropout_mask(sizes: Sizes, after: str) -> SavedTensor:
    """The boolean mask of a dropout on the residual stream (`[training]
    hidden_dropout`), one byte per element."""
    return _wide(sizes, f"{after} dropout mask", f"dropout after the {after}", "h",
                 sizes.h[1], MASK_BYTES, OUTSIDE_TP)


def _norm_output(model: Model) -> str:
    """The module whose recomputation frees a block's norm outputs (the inputs of the
    Q/K/V projections and of fc1): "layernorm" when a norm precedes attention and the
    MLP (Megatron-Core's input_layernorm and pre_mlp_layernorm), else none."""
    return "" if model.norm_placement == "post" else "layernorm"


def _attention(sizes: Sizes, model: Model) -> list[SavedTensor]:
    d = sizes.d
    assert model.num_kv_heads is not None
    first = (("attention.q_proj", "attention.k_proj", "attention.v_proj") if model.mla is None
             else ("attention.q_proj" if model.mla.q_lora_rank is None else
                   "attention.q_a_proj", "attention.kv_a_proj_with_mqa"))
    tensors = [_hidden(sizes, "attention input", "input of the Q/K/V projections",
                       _norm_output(model), _inputs_of(*first))]
    if model.mla is not None:
        mla = model.mla
        if mla.q_lora_rank is not None:
            tensors += _norm(sizes, model, "query latent norm", "r_q", mla.q_lora_rank)
            tensors.append(_wide(sizes, "query latent", "input of the query up-projection",
                                 "r_q", mla.q_lora_rank, d, OUTSIDE_TP,
                                 weights=_inputs_of("attention.q_b_proj")))
        tensors += _norm(sizes, model, "key/value latent norm", "r_kv", mla.kv_lora_rank)
        tensors.append(_wide(sizes, "key/value latent", "input of the key/value "
                             "up-projection", "r_kv", mla.kv_lora_rank, d, OUTSIDE_TP,
                             weights=_inputs_of("attention.kv_b_proj")))
        key = ("a*d_qk", model.query_width)
    else:
        key = ("kv*d_head", model.kv_width)
    if model.qk_norm:
        heads = model.num_attention_heads
        assert heads is not None  # as model.query_width asserts below
        per_head = model.qk_norm_scope == "head"
        tensors += _norm(sizes, model, "query norm", "a*d_head", model.query_width, INSIDE_TP,
                         (("a", heads),) if per_head else ())
        tensors += _norm(sizes, model, "key norm", "kv*d_head", model.kv_width, INSIDE_TP,
                         (("kv", model.num_kv_heads),) if per_head else ())
    value_width = model.value_width if model.mla is not None else model.kv_width
    lse = (sizes.b, sizes.a, sizes.s)
    # MLA's query, key and value are its up-projections' outputs (with RoPE applied):
    # Megatron-Core's mla_up_proj discards them after the attention kernel and reruns
    # the up-projections from the latents in the backward (CheckpointWithoutOutput in
    # multi_latent_attention.py).
    up = "mla_up_proj" if model.mla is not None else ""
    return tensors + [
        _wide(sizes, "query", "kept by flash attention", "a*d_head", model.query_width, d,
              INSIDE_TP, up),
        _wide(sizes, "key", "kept by flash attention (no GQA expansion)", *key, d, INSIDE_TP,
              up),
        _wide(sizes, "value", "kept by flash attention (no GQA expansion)",
              key[0].replace("qk", "v").replace("head", "v"), value_width, d, INSIDE_TP, up),
        saved("log-sum-exp (fp32)", "kept by flash attention per head and query", lse,
              FP32_BYTES, INSIDE_TP),
        _wide(sizes, "attention output", "kept by flash attention; the output projection's "
              "input", "a*d_v", model.attention_output_width, d, INSIDE_TP),
    ]


def _mlp(sizes: Sizes, model: Model, tokens: tuple[tuple[str, int], ...], symbol: str,
         width: int, module: str, activation_module: str,
         label: str = "", group: str = "mlp") -> list[SavedTensor]:
    """fc1's output and fc2's input: `module` frees both, `activation_module` fc2's input
    (the activation's output), kept for fc2's weight gradient (parameter group
    `group`)."""
    shape = (*tokens, (symbol, width))
    if model.gated:
        first = saved(f"{label}fc1 output (gate and up)", "the fused SwiGLU's two inputs",
                      (*tokens, ("2*" + symbol, 2 * width)), sizes.d, INSIDE_TP,
                      module=module)
    else:
        first = saved(f"{label}fc1 output", "input of the activation", shape, sizes.d,
                      INSIDE_TP, module=module)
    return [first, saved(f"{label}fc2 input", "input of the second projection", shape,
                         sizes.d, INSIDE_TP, module=activation_module,
                         weights=_inputs_of(f"{group}.down_proj"), weights_only=True)]


def _moe(sizes: Sizes, model: Model) -> list[SavedTensor]:
    moe = model.moe
    assert moe is not None
    routed = (*sizes.tokens, ("k", moe.experts_per_token))
    experts = ("E", moe.num_experts)
    tensors = [
        saved("router probabilities (fp32)", "kept by the router's softmax or sigmoid",
              (*sizes.tokens, experts), FP32_BYTES, OUTSIDE_TP, module="moe"),
        saved("routing map (bool)", "which experts each token goes to",
              (*sizes.tokens, experts), BOOL_BYTES, OUTSIDE_TP, module="moe"),
        saved("permuted tokens", "expert inputs after the fused permutation",
              (*routed, sizes.h), sizes.d, OUTSIDE_TP, module="moe",
              weights=_first_projections(model, "experts"), weights_only=True),
        *_mlp(sizes, model, routed, "ffn_e", moe.expert_ffn_hidden_size, "moe", "moe_act",
              "expert ", "experts"),
        saved("expert output", "kept by the unpermutation to weight it",
              (*routed, sizes.h), sizes.d, OUTSIDE_TP, module="moe"),
        saved("routing weights (fp32)", "kept by the unpermutation", routed, FP32_BYTES,
              OUTSIDE_TP, module="moe"),
    ]
    if moe.num_shared_experts:
        width = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size
                                          or moe.expert_ffn_hidden_size)
        tensors += _mlp(sizes, model, sizes.tokens, "n_s*ffn_s", width, "shared_experts",
                        "shared_experts", "shared expert ", "shared_experts")
    return tensors


def _linear_attention(sizes: Sizes, model: Model) -> list[SavedTensor]:
    """A gated DeltaNet layer: the input projection's input, the convolution's input
    (causal_conv1d keeps it), what flash-linear-attention's chunk_gated_delta_rule keeps
    (ChunkGatedDeltaRuleFunction: the L2-normalized q and k with their fp32 rstd, v, the
    fp32 cumulative decay g, beta and the chunk's UT-transformed matrix A of chunk_size per
    token and head; the chunk states are recomputed in the backward), the output gate z, the
    gated RMSNorm's input and fp32 rstd, and the output projection's input."""
    linear = model.linear_attention
    assert linear is not None
    d, hv, hk = sizes.d, ("hv", linear.num_value_heads), ("hk", linear.num_key_heads)
    heads = (*sizes.tokens, hv)
    return [
        _hidden(sizes, "mixer input", "input of the input projections", _norm_output(model)),
        _wide(sizes, "convolution input", "kept by the causal convolution", "2*k+v",
              linear.conv_width, d, INSIDE_TP),
        _wide(sizes, "query (normalized)", "kept by the chunked delta rule", "hk*d_k",
              linear.key_width, d, INSIDE_TP),
        _wide(sizes, "key (normalized)", "kept by the chunked delta rule", "hk*d_k",
              linear.key_width, d, INSIDE_TP),
        saved("query and key rstd (fp32)", "kept by the kernel's L2 norm", (*sizes.tokens,
              ("2*hk", 2 * hk[1])), FP32_BYTES, INSIDE_TP),
        _wide(sizes, "value", "kept by the chunked delta rule", "hv*d_v", linear.value_width,
              d, INSIDE_TP),
        saved("decay g (fp32)", "cumulative log decay per value head", heads, FP32_BYTES,
              INSIDE_TP),
        saved("beta", "write strength per value head", heads, d, INSIDE_TP),
        saved("UT transform A", "per chunk and value head, chunk_size per token",
              (*heads, ("C", linear.chunk_size)), d, INSIDE_TP),
        _wide(sizes, "output gate z", "kept by the gated RMSNorm", "hv*d_v",
              linear.value_width, d, INSIDE_TP),
        _wide(sizes, "gated norm input", "kept by the gated RMSNorm", "hv*d_v",
              linear.value_width, d, INSIDE_TP),
        saved("gated norm rstd (fp32)", "per value head and token", heads, FP32_BYTES,
              INSIDE_TP),
        _wide(sizes, "output projection input", "input of out_proj", "hv*d_v",
              linear.value_width, d, INSIDE_TP),
    ]


def _mamba(sizes: Sizes, model: Model) -> list[SavedTensor]:
    """A Mamba-2 layer as mamba_ssm's fused mamba_split_conv1d_scan_combined keeps it
    (MambaSplitConv1dScanCombinedFn in ssd_combined.py: the input projection's output
    zxbcdt, the scan's output before the gated norm, the norm's fp32 rstd per group; the
    convolution, the norm and the output projection are recomputed in the backward), with
    the input projection's input. B and C of a single group are on every tensor rank.
    Without the gated norm (gated_norm false: rmsnorm_weight None) the kernel gates the
    scan's output by silu(z) and keeps no rstd."""
    mamba = model.mamba
    assert mamba is not None
    d, groups = sizes.d, mamba.num_groups
    bc = 2 * groups * mamba.state_size
    rstd = [saved("gated norm rstd (fp32)", "per group and token", (*sizes.tokens, ("G", groups)),
                  FP32_BYTES, INSIDE_TP if groups > 1 else TOKENS_ONLY)] if mamba.gated_norm else []
    return [
        _hidden(sizes, "mixer input", "input of the input projection", _norm_output(model)),
        _wide(sizes, "z, x and dt", "the input projection's output (zxbcdt)", "2*d_in+H",
              2 * mamba.inner_width + mamba.num_heads, d, INSIDE_TP),
        _wide(sizes, "B and C", "the input projection's output (zxbcdt)", "2*G*N", bc, d,
              INSIDE_TP if groups > 1 else TOKENS_ONLY),
        _wide(sizes, "scan output", "kept for the gated norm's backward", "d_in",
              mamba.inner_width, d, INSIDE_TP),
        *rstd,
    ]


MIXER_TENSORS = {"linear_attention": _linear_attention, "mamba": _mamba}


def _mixers(sizes: Sizes, model: Model, mixer: str) -> list[SavedTensor]:
    """The token mixers of one layer kind; side by side (Falcon-H1's "attention+mamba")
    they read one normed input, kept once (as the attention's), and their outputs' sum
    keeps nothing."""
    tensors: list[SavedTensor] = []
    for part in mixer_parts(mixer):
        own = _attention(sizes, model) if part == "attention" else MIXER_TENSORS[part](sizes,
                                                                                   model)
        tensors += [t for t in own if not (tensors and t.name == "mixer input")]
    return tensors


def _layer(sizes: Sizes, model: Model, moe: bool, mixer: str = "attention", block: str = "",
           dropout: bool = False) -> list[SavedTensor]:
    """One layer: its mixer and its MLP (block "none": the mixer alone; mixer "none":
    the MLP alone), each behind its norm; with `dropout`, the mask of the dropout after
    each of them."""
    tensors = _modules(sizes, model, moe, mixer, block)
    if not dropout:
        return tensors
    masks = [_dropout_mask(sizes, "attention")] if mixer != NO_MIXER else []
    if block != NO_MLP:
        masks.append(_dropout_mask(sizes, "MLP"))
    return tensors + masks


def _modules(sizes: Sizes, model: Model, moe: bool, mixer: str,
             block: str) -> list[SavedTensor]:
    """`_layer`'s tensors before its dropout masks."""
    mlp: list[SavedTensor] = []
    if block != NO_MLP:
        if moe:
            mlp = _moe(sizes, model)
        else:
            assert model.ffn_hidden_size is not None
            mlp = _mlp(sizes, model, sizes.tokens, "ffn", model.ffn_hidden_size, "mlp", "mlp")
        first = _first_projections(model, "mlp")
        if moe:
            assert model.moe is not None
            first = _inputs_of("router", *(_first_projections(model, "shared_experts")
                                          if model.moe.num_shared_experts else ()))
        mlp = [_hidden(sizes, "mlp input", "input of fc1 (and the router)",
                       _norm_output(model), first)] + mlp
    attention = _mixers(sizes, model, mixer)
    if not (attention and mlp):  # one module behind one norm (NemotronHBlock)
        return _single_module(sizes, model, attention or mlp)
    if model.norm_placement == "sandwich":
        return (_norm(sizes, model, "input norm") + attention
                + _norm(sizes, model, "post-attention norm")
                + _norm(sizes, model, "pre-MLP norm") + mlp + _norm(sizes, model, "post-MLP norm"))
    if model.norm_placement == "post":
        return (attention + _norm(sizes, model, "post-attention norm") + mlp
                + _norm(sizes, model, "post-MLP norm"))
    return (_norm(sizes, model, "input norm") + attention
            + _norm(sizes, model, "post-attention norm") + mlp)


def _single_module(sizes: Sizes, model: Model,
                   module: list[SavedTensor]) -> list[SavedTensor]:
    """A layer of one module (a token mixer or an MLP alone) and its norm, where the
    model puts norms: before it (pre), after it (post) or both (sandwich)."""
    if model.norm_placement == "sandwich":
        return _norm(sizes, model, "input norm") + module + _norm(sizes, model, "post norm")
    if model.norm_placement == "post":
        return module + _norm(sizes, model, "post norm")
    return _norm(sizes, model, "input norm") + module


def _outside(sizes: Sizes, model: Model, dropout: bool = False) -> tuple[SavedTensor, ...]:
    lookup = _inputs_of("embedding")  # nn.Embedding keeps its indices for its weight
    embedding = [saved("token ids", "input of the embedding lookup", sizes.tokens,
                       TOKEN_ID_BYTES, TOKENS_ONLY, placement="embedding", weights=lookup,
                       weights_only=True)]
    if dropout:  # Megatron-Core's LanguageModelEmbedding.embedding_dropout
        embedding.append(attrs.evolve(_dropout_mask(sizes, "embedding"),
                                      placement="embedding"))
    if model.position_embedding == "learned":
        embedding.append(saved("position ids", "input of the position embedding lookup",
                               sizes.tokens, TOKEN_ID_BYTES, TOKENS_ONLY,
                               placement="embedding", weights=lookup, weights_only=True))
    shared = []
    if model.position_embedding == "rope":
        # the rotated channels: Megatron-Core's RotaryEmbedding.__init__ takes
        # int(kv_channels x rotary_percent) below 1
        # (megatron/core/models/common/embeddings/rotary_pos_embedding.py); MLA's
        # qk_rope_head_dim
        width = model.rotary_dim
        shared.append(saved("RoPE frequencies (fp32)", "one table for every layer of a stage",
                            (sizes.s, ("d_rope", width)), FP32_BYTES, TOKENS_ONLY))
    head = _norm(sizes, model, "final norm") if model.final_norm else []
    head.append(_hidden(sizes, "output layer input", "input of the output projection",
                        weights=_inputs_of("head")))
    vocab = sizes.per_token("V", sizes.vocab[1])
    if model.final_logit_softcapping is not None:
        head.append(saved("soft-capped logits (tanh)", "tanh keeps its output", vocab,
                          sizes.d, INSIDE_TP))
    head += [
        saved("exp(logits)", "fused cross-entropy keeps the softmax in the logits' dtype",
              vocab, sizes.d, INSIDE_TP),
        saved("labels", "kept by the cross-entropy", sizes.tokens, TOKEN_ID_BYTES,
              TOKENS_ONLY),
        saved("target mask (bool)", "labels outside this rank's vocabulary shard",
              sizes.tokens, BOOL_BYTES, TOKENS_ONLY),
    ]
    return (tuple(embedding) + tuple(shared)
            + tuple(attrs.evolve(t, placement="head") for t in head))


def fused(spec: Spec) -> ActivationInventory:
    """Megatron-Core / torchtitan-style fused kernels (see the module docstring)."""
    require(spec, ARCHITECTURE, "fused")
    model = spec.model
    sizes = sizes_of(spec)
    dropout = spec.training.hidden_dropout > 0
    groups = []
    if model.layer_kinds_vary:  # a hybrid model: a group per (MLP, mixer) kind
        for kind, count in model.hybrid_kinds_in(0, model.num_layers or 0).items():
            block, mixer = kind.split(" ", 1)
            groups.append(LayerGroup(kind=kind, count=count, tensors=tuple(
                _layer(sizes, model, moe=block == "moe", mixer=mixer, block=block,
                       dropout=dropout))))
        return ActivationInventory(model="fused", groups=tuple(groups),
                                   fixed=_outside(sizes, model, dropout), source=SOURCE)
    if model.num_dense_layers:
        groups.append(LayerGroup(kind="dense", count=model.num_dense_layers,
                                 tensors=tuple(_layer(sizes, model, moe=False,
                                                      dropout=dropout))))
    if model.num_moe_layers:
        groups.append(LayerGroup(kind="moe", count=model.num_moe_layers,
                                 tensors=tuple(_layer(sizes, model, moe=True,
                                                      dropout=dropout))))
    return ActivationInventory(model="fused", groups=tuple(groups),
                               fixed=_outside(sizes, model, dropout), source=SOURCE)
