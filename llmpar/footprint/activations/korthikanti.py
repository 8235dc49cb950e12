"""Korthikanti et al. 2022 (arXiv:2205.05198): the tensors a Megatron-LM GPT block keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.activations.common import (
    INSIDE_TP,
    LOSS_BYTES,
    MASK_BYTES,
    OUTSIDE_TP,
    TOKEN_ID_BYTES,
    require,
    saved,
)
from llmpar.footprint.inventory import (
    SPLIT_CONTEXT,
    ActivationInventory,
    LayerGroup,
    SavedTensor,
)

if TYPE_CHECKING:
    from llmpar.spec import Spec

SOURCE = "Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 4.1 and 4.3, per tensor"


def _attention_tensors(spec: Spec, d: float) -> list[SavedTensor]:
    """Korthikanti et al. 2022, Sec. 4.1, attention block: 11sbh + 5as^2b, plus its norm."""
    model, training = spec.model, spec.training
    assert model.hidden_size is not None and model.num_attention_heads is not None
    b, s = ("b", training.micro_batch_size), ("s", training.sequence_length)
    h, a = ("h", model.hidden_size), ("a", model.num_attention_heads)
    q, kv = ("a*d_head", model.query_width), ("kv*d_head", model.kv_width)
    # MLA: values and the attention output are narrower than queries and keys.
    v, out = ("kv*d_v", model.value_width), ("a*d_v", model.attention_output_width)
    score = (b, a, s, ("s", training.sequence_length))
    return [
        saved("attention norm input", "input of the first norm", (b, s, h), d, OUTSIDE_TP),
        saved("qkv input", "input of the Q/K/V projections", (b, s, h), d, OUTSIDE_TP,
              module="layernorm"),
        saved("query", "operand of Q.K^T", (b, s, q), d, INSIDE_TP),
        saved("key", "operand of Q.K^T", (b, s, kv), d, INSIDE_TP),
        saved("softmax output", "needed by the softmax backward", score, d, INSIDE_TP, True),
        saved("attention dropout mask", "dropout on the scores", score, MASK_BYTES,
              INSIDE_TP, True),
        saved("attention dropout output", "operand of scores.V", score, d, INSIDE_TP, True),
        saved("value", "operand of scores.V", (b, s, v), d, INSIDE_TP),
        saved("output projection input", "input of the attention output projection",
              (b, s, out), d, INSIDE_TP),
        saved("attention residual dropout mask", "dropout after attention", (b, s, h),
              MASK_BYTES, OUTSIDE_TP),
        saved("mlp norm input", "input of the second norm", (b, s, h), d, OUTSIDE_TP),
        saved("mlp input", "input of the first MLP projection", (b, s, h), d, OUTSIDE_TP,
              module="layernorm"),
    ]


def _mlp_tensors(spec: Spec, d: float, tokens: tuple[tuple[str, int], ...], width: tuple[str, int],
                 label: str, module: str, activation_module: str) -> list[SavedTensor]:
    """Korthikanti et al. 2022, Sec. 4.1, MLP: the activation's input and the last
    projection's input (8sbh + 8sbh for a 4h GELU MLP); a gated MLP keeps the gate
    and up outputs and the gated product. `module` frees them all, `activation_module`
    the activation's output (the last projection's input)."""
    shape = (*tokens, width)
    if spec.model.gated:
        kept = [saved(f"{label}gate output", "input of the activation function", shape, d,
                      INSIDE_TP, module=module),
                saved(f"{label}up output", "operand of the gating product", shape, d,
                      INSIDE_TP, module=module)]
    else:
        kept = [saved(f"{label}activation input", "input of the activation function", shape,
                      d, INSIDE_TP, module=module)]
    return kept + [saved(f"{label}down projection input", "input of the last MLP projection",
                         shape, d, INSIDE_TP, module=activation_module)]


def _moe_tensors(spec: Spec, d: float) -> list[SavedTensor]:
    """The MoE block: router logits, dispatched token copies and each routed token's
    expert MLP tensors (b*s*k tokens), plus the shared experts on every token."""
    model, training = spec.model, spec.training
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    b, s = ("b", training.micro_batch_size), ("s", training.sequence_length)
    routed = (b, s, ("k", moe.experts_per_token))
    tensors = [
        saved("router logits", "input of the router softmax", (b, s, ("E", moe.num_experts)),
              d, OUTSIDE_TP, module="moe"),
        saved("dispatched tokens", "expert inputs after the token permutation",
              (*routed, ("h", model.hidden_size)), d, OUTSIDE_TP, module="moe"),
    ]
    tensors += _mlp_tensors(spec, d, routed, ("ffn_e", moe.expert_ffn_hidden_size), "expert ",
                            "moe", "moe_act")
    if moe.num_shared_experts:
        width = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size
                                          or moe.expert_ffn_hidden_size)
        tensors += _mlp_tensors(spec, d, (b, s), ("n_s*ffn_s", width), "shared expert ",
                                "shared_experts", "shared_experts")
    return tensors


def korthikanti(spec: Spec) -> ActivationInventory:
    """Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 4.1 and 4.3.

    Per layer s*b*h*(34 + 5*a*s/h) bytes for a GPT block in 16-bit with dropout;
    here each term is a tensor whose width follows the model (query and key/value
    widths for GQA, three MLP tensors for gated MLPs, routed tokens for MoE), so a
    GPT block gives the paper's number exactly. Outside the layers: token ids and
    the embedding dropout mask; the final norm's input, the output layer's input
    and fp32 logits for the loss (Megatron-LM `theoretical_memory_usage.py`).
    Each tensor names the Megatron-Core module whose recomputation frees it
    (`[training] recompute_modules`): the norm outputs layernorm, the MLP's inner
    tensors mlp, the MoE block's moe (its experts' last projection inputs moe_act,
    its shared experts shared_experts). MLA's latents are not listed, so mla_up_proj
    has nothing to rerun from here.
    """
    require(spec, ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                    "ffn_hidden_size"), "korthikanti")
    model, training = spec.model, spec.training
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    assert model.vocab_size is not None
    d = bytes_per_element(spec.precision.activations)
    b, s = ("b", training.micro_batch_size), ("s", training.sequence_length)
    h = ("h", model.hidden_size)
    residual_mask = saved("mlp residual dropout mask", "dropout after the MLP", (b, s, h),
                          MASK_BYTES, OUTSIDE_TP)
    attention = _attention_tensors(spec, d)
    groups = []
    if model.num_dense_layers:
        dense = attention + _mlp_tensors(spec, d, (b, s), ("ffn", model.ffn_hidden_size), "",
                                         "mlp", "mlp")
        groups.append(LayerGroup(kind="dense", count=model.num_dense_layers,
                                 tensors=(*dense, residual_mask)))
    if model.num_moe_layers:
        groups.append(LayerGroup(kind="moe", count=model.num_moe_layers,
                                 tensors=(*attention, *_moe_tensors(spec, d), residual_mask)))
    vocab = ("V", model.vocab_size)
    embedding = (
        saved("token ids", "input of the embedding lookup", (b, s), TOKEN_ID_BYTES,
              frozenset({SPLIT_CONTEXT})),
        saved("embedding dropout mask", "dropout after the embedding", (b, s, h),
              MASK_BYTES, OUTSIDE_TP),
    )
    head = (
        saved("final norm input", "input of the last norm", (b, s, h), d, OUTSIDE_TP),
        saved("output layer input", "input of the output projection", (b, s, h), d,
              OUTSIDE_TP),
        saved("logits (fp32)", "softmax cross-entropy in fp32", (b, s, vocab), LOSS_BYTES,
              INSIDE_TP),
    )
    fixed = tuple(attrs.evolve(t, placement="embedding") for t in embedding) + tuple(
        attrs.evolve(t, placement="head") for t in head)
    return ActivationInventory(model="korthikanti", groups=tuple(groups), fixed=fixed,
                               source=SOURCE)
