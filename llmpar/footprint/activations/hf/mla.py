"""What DeepSeek's multi-head latent attention keeps in transformers (DeepseekV3Attention).

The query goes through q_a_proj, an RMSNorm and q_b_proj (or one q_proj); keys and
values through kv_a_proj_with_mqa, an RMSNorm on the latent and kv_b_proj, whose
output holds every head's k_nope and v side by side; the RoPE part of the key is
shared by the heads and copied into each head's key. Q and K are built as new
tensors (torch.cat, copy_); V is a view of kv_b_proj's output. Source:
modeling_deepseek_v3.py of transformers 5.24.0, measured with torch 2.13.0.

DeepSeek sparse attention (DeepseekV32Attention, modeling_deepseek_v32.py of transformers
5.24.0) keeps the same tensors: its lightning indexer (DeepseekV32Indexer: wq_b on the
query latent, wk and its LayerNorm and weights_proj on the layer's input, RoPE on the
indexer's q and k, the fp32 ReLU scores weighted per head, the causal mask added and the
int32 top-k indices) runs under torch.no_grad, so autograd keeps none of its tensors and
its weights get no gradient; the top-k indices are scattered into a boolean s x s mask
combined with the causal one, which eager attention adds to the scores and SDPA's math
path (MLA's query and value heads differ in width) adds to its own, neither keeping it
(measured in validation/data/deepseek-v3.2-exp.json, top-k 64 and 2048 alike).
"""

from __future__ import annotations

from llmpar.footprint.activations.common import INSIDE_TP, OUTSIDE_TP
from llmpar.footprint.activations.hf.attention import core_tensors, residual_dropout
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.norms import norm_tensors
from llmpar.footprint.inventory import SavedTensor


def mla_tensors(ctx: Context) -> list[SavedTensor]:
    model = ctx.model
    mla = model.mla
    assert mla is not None and model.num_attention_heads is not None
    heads = model.num_attention_heads
    first = "attention.q_proj" if mla.q_lora_rank is None else "attention.q_a_proj"
    tensors = [ctx.per_token("attention input", "input of the query and latent projections",
                             "h", ctx.sizes.h[1], ctx.d, OUTSIDE_TP,
                             frozenset({first, "attention.kv_a_proj_with_mqa"}), True)]
    if mla.q_lora_rank is not None:
        tensors += norm_tensors(ctx, "query latent norm", "r_q", mla.q_lora_rank,
                                group="attention")
        tensors.append(ctx.per_token("query latent", "input of q_b_proj", "r_q",
                                     mla.q_lora_rank, ctx.d, OUTSIDE_TP,
                                     frozenset({"attention.q_b_proj"}), True))
    tensors += norm_tensors(ctx, "key/value latent norm", "r_kv", mla.kv_lora_rank,
                            group="attention")
    tensors.append(ctx.per_token("key/value latent", "input of kv_b_proj", "r_kv",
                                 mla.kv_lora_rank, ctx.d, OUTSIDE_TP,
                                 frozenset({"attention.kv_b_proj"}), True))
    kv_b_width = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    eager = [
        ctx.per_token("query", "torch.cat of the pass and RoPE parts, operand of Q.K^T",
                      "a*d_qk", model.query_width, ctx.d, INSIDE_TP),
        ctx.per_token("key", "per-head k_nope and the shared RoPE key, operand of Q.K^T",
                      "a*d_qk", model.query_width, ctx.d, INSIDE_TP),
    ]
    if ctx.batch == 1:
        # V is a view of kv_b_proj's output: matmul keeps it without a copy when b = 1,
        # and with it the whole output, k_nope included.
        eager.append(ctx.per_token("kv_b_proj output", "kept whole by the value view",
                                   "a*(d_nope+d_v)", kv_b_width, ctx.d, INSIDE_TP))
    else:
        eager.append(ctx.per_token("value", "operand of P.V (a copy when b > 1)", "a*d_v",
                                   model.attention_output_width, ctx.d, INSIDE_TP))
    return tensors + core_tensors(ctx, eager) + residual_dropout(ctx, "attention")
