"""Model FLOPs of a training step, per operation, from the architecture.

Convention: a multiply-accumulate is 2 FLOPs; only matrix products count
(projections, attention scores and values, output logits), as in Narayanan et
al. 2021 (arXiv:2104.04473, Sec. 5.1) and in `torch.utils.flop_counter`;
norms, activations and softmax are left out. Backward is twice the forward
(gradients with respect to inputs and to weights), so a training pass is 3x.

Two counts of attention's Q.K^T and scores.V: the model FLOPs of the reporting
convention `[training] attention_flops` (what MFU counts), and the FLOPs the attention
kernel executes (what HFU counts and the step time runs), which depend on the kernel
alone (`executed_attention_share`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Literal

import attrs

from llmpar.footprint.parameters import (
    attention_matmul_weights,
    linear_attention_matmul_weights,
    mamba_matmul_weights,
)
from llmpar.spec import Model

BACKWARD_TO_FORWARD = 2.0
"""Backward costs two forward matmuls per forward matmul (Narayanan et al. 2021, Sec. 5.1)."""

AttentionKernel = Literal["eager", "fused"]
"""How attention runs: "eager" materializes the s x s scores (matmul, mask, softmax,
matmul: transformers' eager attention, SDPA's math fallback, Megatron-LM's unfused
attention); "fused" never does (FlashAttention-2/3, cuDNN, SDPA's flash and
memory-efficient backends)."""
FUSED_ATTENTION_TILE_TOKENS = 128
"""Query rows and key columns per tile of a fused attention kernel, one size for every
kernel: FlashAttention-2 tunes its blocks among {64, 128} x {64, 128} by head width
(Dao 2023, arXiv:2307.08691, Sec. 3.3). It only sets how many diagonal tiles a causal
kernel computes whole: 1 / (2n) of the square beyond its half, n = s / tile (1.6% at
s = 4096)."""


@attrs.frozen(kw_only=True)
class ForwardFlops:
    """Forward FLOPs of one sequence of `sequence_length` tokens, by operation."""

    projections: float
    """Q, K, V (or MLA's), output and MLP matrix products, all layers; BERT's MLM
    transform and pooler."""
    attention: float
    """Q.K^T scores and scores.V, all attention layers, counted as `[training]
    attention_flops` says (the full s x s square or its causal half), and the recurrent
    layers' own products (`recurrent_mixer_flops_per_token`): model FLOPs."""
    executed_attention: float = attrs.field()
    """Q.K^T and scores.V as the attention kernel executes them, all layers: the full
    square for eager attention, about half of it for a fused kernel on a causal model
    (`executed_attention_share`). Default: `attention`."""
    logits: float
    """The output layer."""

    @executed_attention.default
    def _convention(self) -> float:
        return self.attention

    @property
    def total(self) -> float:
        """Model FLOPs (what MFU counts)."""
        return self.projections + self.attention + self.logits

    @property
    def executed_total(self) -> float:
        """FLOPs the GPU executes (what HFU counts and the step time runs)."""
        return self.projections + self.executed_attention + self.logits


def attends_causally(model: Model) -> bool:
    """Whether each token attends only to earlier ones: every decoder; not BERT-style
    encoders (a masked-LM head or a pooler)."""
    return not (model.mlm_head or model.pooler)


def executed_attention_share(model: Model, sequence_length: int,
                             kernel: AttentionKernel) -> float:
    """The share of the full s x s square of Q.K^T and scores.V the attention kernel
    executes. Eager attention computes every score and masks afterwards: all of it. A
    fused kernel on a causal model skips the tiles entirely above the diagonal and
    computes the diagonal tiles whole (masking inside them): n (n + 1) / 2 of n^2
    tiles, n = s / tile (Dao 2023, FlashAttention-2, arXiv:2307.08691, Sec. 3.1.1,
    "Causal masking": blocks with every entry masked are skipped, a 1.7-1.8x speedup
    over running the whole square). Under ring context parallelism the steps together
    compute the same tiles. A non-causal model executes the whole square either way."""
    if kernel == "eager" or not attends_causally(model):
        return 1.0
    tiles = math.ceil(sequence_length / FUSED_ATTENTION_TILE_TOKENS)
    return (tiles + 1) / (2 * tiles)


def forward_flops_per_sequence(
    model: Model, sequence_length: int, causal: bool = False,
    kernel: AttentionKernel = "eager",
) -> ForwardFlops:
    """Forward FLOPs for one sequence.

    Per layer and token: 2 x (weights of every matrix) for projections; per
    layer 2 x s x s x (heads x qk_head_dim) for Q.K^T and 2 x s x s x (heads x
    value_head_dim) for scores.V, which is 2 x 2 x s x s x (heads x head_dim)
    outside MLA (DeepSeek-V2's MLA: qk_head_dim = qk_nope + qk_rope, values
    v_head_dim). The causal convention counts half the s x s square; sliding
    windows keep the full square, as eager attention computes it. BERT's pooler
    runs once per sequence. `kernel` decides the executed attention FLOPs
    (`executed_attention_share`), `causal` only the counted ones.
    """
    assert model.has_architecture
    assert model.num_layers is not None and model.hidden_size is not None
    assert model.vocab_size is not None
    h, s = model.hidden_size, sequence_length
    score_width = model.query_width + model.attention_output_width
    projections = 2.0 * s * active_matmul_weights(model)
    if model.pooler:
        projections += 2.0 * h * h
    square = 2.0 * s * s * score_width * model.num_attention_layers
    attention = square / 2 if causal else square
    logits = 2.0 * h * model.vocab_size * s
    executed = square * executed_attention_share(model, s, kernel)
    sparse = model.sparse_attention
    if sparse is not None:
        attention, executed = _sparse_attention(model, s, attention, executed, causal, kernel)
    if model.mixer_pattern is not None:
        recurrent = s * sum(count * recurrent_mixer_flops_per_token(model, kind, s)
                            for kind, count in model.mixers_in(0, model.num_layers).items()
                            if kind != "attention")
        attention, executed = attention + recurrent, executed + recurrent
    return ForwardFlops(projections=projections, attention=attention, logits=logits,
                        executed_attention=executed)


def _sparse_attention(model: Model, s: int, attention: float, executed: float,
                      causal: bool, kernel: AttentionKernel) -> tuple[float, float]:
    """DeepSeek sparse attention (DeepSeek-V3.2-Exp report, Sec. 2.1): MLA's products over
    the top_k keys each query keeps, the dense count scaled by the share of (query, key)
    pairs kept, sum over i of min(i, k) against the causal s (s + 1) / 2 (all of them when
    s <= k); and the indexer's scores, every causal pair's dot products over index_heads
    heads of index_head_dim and their weighted sum over the heads, 2 x heads x (width + 1)
    FLOPs a pair, counted as attention's square is (`[training] attention_flops`)."""
    sparse = model.sparse_attention
    assert sparse is not None and model.num_layers is not None
    k = sparse.top_k
    kept = (k * (k + 1) / 2 + (s - k) * k) if s > k else s * (s + 1) / 2
    share = kept / (s * (s + 1) / 2)
    square = 2.0 * s * s * sparse.index_heads * (sparse.index_head_dim + 1) * model.num_layers
    index = square / 2 if causal else square
    return (attention * share + index,
            executed * share + square * executed_attention_share(model, s, kernel))


def recurrent_mixer_flops_per_token(model: Model, kind: str, sequence_length: int) -> float:
    """Forward FLOPs per token of one recurrent layer's own products, beside its projections
    (`mixer_matmul_weights`), as the chunked training kernels compute them; the depthwise
    convolution counts 2 x kernel taps per channel.

    Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464, Sec. 3.3, the chunkwise form of the
    delta rule, as flash-linear-attention's chunk_gated_delta_rule and transformers'
    torch_chunk_gated_delta_rule run it), per value head, chunk C, widths d_k and d_v:
    within a chunk K_beta.K^T and Q.K^T (2 x 2 C d_k), the UT transform applied to V_beta
    and to the decayed K_beta (2 C d_v + 2 C d_k) and the masked scores times the new
    values (2 C d_v); across chunks the state read by W and by Q and its update K^T.V
    (3 x 2 d_k d_v). The triangular solve of the UT transform (C^3 / 3 per chunk) is left
    out, as softmax is for attention.

    Mamba-2's SSD (Dao and Gu 2024, arXiv:2405.21060, Sec. 6, the four steps of the chunked
    algorithm, as mamba_ssm's ssd_combined kernels run them), chunk Q, state N, head width P:
    C.B^T once per group (2 Q N), per head the masked scores times x (2 Q P), the chunk's
    state B^T.x (2 N P) and the output's read of the state C.h (2 N P); the scan of states
    across chunks is elementwise (not counted)."""
    del sequence_length  # the chunked forms are linear in the tokens
    if kind == "linear_attention":
        linear = model.linear_attention
        assert linear is not None
        c, dk, dv = linear.chunk_size, linear.key_head_dim, linear.value_head_dim
        per_head = 2.0 * (2 * c * dk + c * dv + c * dk + c * dv + 3 * dk * dv)
        return (linear.num_value_heads * per_head
                + 2.0 * linear.conv_kernel_size * linear.conv_width)
    mamba = model.mamba
    assert kind == "mamba" and mamba is not None
    q, n, p = mamba.chunk_size, mamba.state_size, mamba.head_dim
    return (2.0 * mamba.num_groups * q * n + 2.0 * mamba.num_heads * (q * p + 2 * n * p)
            + 2.0 * mamba.conv_kernel_size * mamba.conv_width)


def mixer_matmul_weights(model: Model, kind: str) -> int:
    """Weights of one layer's token mixer's projections, by kind (`Model.mixers_in`)."""
    if kind == "linear_attention":
        return linear_attention_matmul_weights(model)
    if kind == "mamba":
        return mamba_matmul_weights(model)
    return attention_matmul_weights(model)


def mlp_matmul_weights(model: Model, width: int) -> int:
    """Weights of one MLP's matrices (2 or 3 of hidden x width)."""
    assert model.hidden_size is not None
    return (3 if model.gated else 2) * model.hidden_size * width


def moe_matmul_weights(model: Model) -> int:
    """Matrix weights one token multiplies through in one MoE layer: its top-k routed
    experts, the shared experts, the router and the shared expert's gate."""
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    h = model.hidden_size
    shared_width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
    return (moe.experts_per_token * mlp_matmul_weights(model, moe.expert_ffn_hidden_size)
            + moe.num_shared_experts * mlp_matmul_weights(model, shared_width)
            + h * moe.num_experts + (h if moe.shared_expert_gate else 0))


def mla_up_projection_weights(model: Model) -> int:
    """MLA's query projection (its up-projection from the query latent, or the whole
    projection without one) and key/value up-projection: what Megatron-Core's
    mla_up_proj reruns (qkv_up_proj_and_rope_apply in multi_latent_attention.py)."""
    mla = model.mla
    assert mla is not None and model.hidden_size is not None
    assert model.num_attention_heads is not None
    a = model.num_attention_heads
    query_in = model.hidden_size if mla.q_lora_rank is None else mla.q_lora_rank
    return (query_in * a * mla.qk_head_dim
            + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim))


def module_rerun_weights(model: Model, modules: Collection[str], moe: bool) -> int:
    """Matrix weights one token multiplies through again in one dense (`moe`: MoE) layer
    when selective recomputation reruns `modules`' forward (Megatron-Core's
    --recompute-modules): mlp the dense MLP, moe the MoE block (router, routed and shared
    experts), shared_experts the shared experts alone (and their gate), mla_up_proj MLA's
    up-projections. core_attn reruns attention products, not weights; layernorm and
    moe_act are elementwise."""
    total = 0
    if "mla_up_proj" in modules and model.mla is not None:
        total += mla_up_projection_weights(model)
    if not moe:
        if "mlp" in modules:
            assert model.ffn_hidden_size is not None
            total += mlp_matmul_weights(model, model.ffn_hidden_size)
        return total
    moe_config = model.moe
    assert moe_config is not None and model.hidden_size is not None
    if "moe" in modules:
        return total + moe_matmul_weights(model)
    if "shared_experts" in modules and moe_config.num_shared_experts:
        width = moe_config.shared_expert_ffn_hidden_size or moe_config.expert_ffn_hidden_size
        total += (moe_config.num_shared_experts * mlp_matmul_weights(model, width)
                  + (model.hidden_size if moe_config.shared_expert_gate else 0))
    return total


def module_rerun_flops_per_sequence(model: Model, sequence_length: int,
                                    modules: Collection[str]) -> float:
    """Forward FLOPs of one sequence that rerunning `modules` adds, all layers: 2 FLOPs
    per weight and token (`module_rerun_weights`)."""
    if not modules:
        return 0.0
    weights = model.num_dense_layers * module_rerun_weights(model, modules, False)
    if model.num_moe_layers:
        weights += model.num_moe_layers * module_rerun_weights(model, modules, True)
    return 2.0 * sequence_length * weights


def active_matmul_weights(model: Model) -> int:
    """Matrix weights one token multiplies through in all layers (MoE: its experts
    and the router only), and in BERT's MLM transform; not the output layer."""
    assert model.hidden_size is not None
    if model.mixer_pattern is None:
        total = (model.num_layers or 0) * attention_matmul_weights(model)
    else:
        total = sum(count * mixer_matmul_weights(model, kind)
                    for kind, count in model.mixers_in(0, model.num_layers or 0).items())
    if model.num_dense_layers:  # none in a model of mixers alone (Mamba2ForCausalLM)
        assert model.ffn_hidden_size is not None
        total += model.num_dense_layers * mlp_matmul_weights(model, model.ffn_hidden_size)
    if model.moe is not None:
        total += model.num_moe_layers * moe_matmul_weights(model)
    if model.mlm_head:
        total += model.hidden_size * model.hidden_size
    return total


def six_nd_flops(parameters: float, tokens: float) -> float:
    """C = 6 N D (Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1)."""
    return 6.0 * parameters * tokens
