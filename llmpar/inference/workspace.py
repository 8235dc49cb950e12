"""The activation workspace of one forward step: the tensors alive at once in a layer.

Serving keeps no activations for a backward pass; its peak is the widest moment of the
largest step (vLLM sizes it by profiling a forward pass of max_num_batched_tokens, its
`profile_run`). Per token, on one tensor rank:
- the residual stream and its normed copy: 2h;
- plus the widest block: attention's Q, K, V and output (MLA: also its latents and the keys
  and values up-projected from them), or the MLP's gate and up outputs and their product
  (3f/t; 2f/t ungated), or an MoE layer's k dispatched copies of the hidden state and their
  expert outputs (2h each) with the experts' intermediates, plus the shared experts';
FlashAttention keeps no s x s score matrix (Dao et al. 2022, arXiv:2205.14135, Sec. 3.1).
Logits of the sampled rows are fp32 over the whole vocabulary (vLLM's sampler upcasts them).
"""

from __future__ import annotations

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.inference.kv_cache import kv_heads_per_rank
from llmpar.spec import Model

LOGIT_BYTES = 4.0
"""fp32 logits for sampling."""


def attention_width(model: Model, tensor: int) -> float:
    """Elements per token alive in one attention block on one tensor rank (none in a model
    whose layers never attend)."""
    if not model.attends:
        return 0.0
    assert model.num_attention_heads is not None and model.head_dim is not None
    query, output = model.query_width / tensor, model.attention_output_width / tensor
    if model.mla is None:
        kv = 2 * kv_heads_per_rank(model, tensor) * model.head_dim
        return query + kv + output
    latents = (model.latent_kv_width or 0) + (model.mla.q_lora_rank or 0)
    return query + (model.kv_width + model.value_width) / tensor + output + latents


def mlp_width(model: Model, width: int, tensor: int) -> float:
    """Elements per token alive in one MLP of inner `width`: gate, up and product (gated)."""
    return (3 if model.gated else 2) * width / tensor


def moe_width(model: Model, tensor: int) -> float:
    """Elements per token alive in one MoE layer: k routed copies in and out, the experts'
    intermediates, and the shared experts'."""
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    routed = moe.experts_per_token * (2 * model.hidden_size
                                      + mlp_width(model, moe.expert_ffn_hidden_size, tensor))
    shared_width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
    return routed + moe.num_shared_experts * mlp_width(model, shared_width, tensor)


def block_width(model: Model, tensor: int) -> float:
    """The widest block of the model, per token."""
    widths = [attention_width(model, tensor)]
    if model.num_dense_layers:
        assert model.ffn_hidden_size is not None
        widths.append(mlp_width(model, model.ffn_hidden_size, tensor))
    if model.moe is not None and model.num_moe_layers:
        widths.append(moe_width(model, tensor))
    return max(widths)


@attrs.frozen(kw_only=True)
class WorkspaceRates:
    """What a step's workspace grows by: bytes per token processed, per row sampled."""

    bytes_per_token: float
    bytes_per_row: float

    def bytes_of(self, tokens: float, rows: float) -> float:
        """Peak workspace of a step of `tokens` tokens sampling `rows` next tokens."""
        return tokens * self.bytes_per_token + rows * self.bytes_per_row


def workspace_rates(model: Model, activations: str, tensor: int) -> WorkspaceRates:
    """The residual stream, its normed copy and the widest block per token; fp32 logits
    over the vocabulary per sampled row."""
    assert model.hidden_size is not None and model.vocab_size is not None
    per_token = 2 * model.hidden_size + block_width(model, tensor)
    return WorkspaceRates(bytes_per_token=per_token * bytes_per_element(activations),
                          bytes_per_row=model.vocab_size * LOGIT_BYTES)
