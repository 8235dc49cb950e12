"""Model FLOPs of a training step, per operation, from the architecture.

Convention: a multiply-accumulate is 2 FLOPs; only matrix products count
(projections, attention scores and values, output logits), as in Narayanan et
al. 2021 (arXiv:2104.04473, Sec. 5.1) and in `torch.utils.flop_counter`;
norms, activations and softmax are left out. Backward is twice the forward
(gradients with respect to inputs and to weights), so a training pass is 3x.
"""

from __future__ import annotations

import attrs

from llmpar.spec import Model

BACKWARD_TO_FORWARD = 2.0
"""Backward costs two forward matmuls per forward matmul (Narayanan et al. 2021, Sec. 5.1)."""


@attrs.frozen(kw_only=True)
class ForwardFlops:
    """Forward FLOPs of one sequence of `sequence_length` tokens, by operation."""

    projections: float
    """Q, K, V, output and MLP matrix products, all layers."""
    attention: float
    """Q.K^T scores and scores.V, all layers."""
    logits: float
    """The output layer."""

    @property
    def total(self) -> float:
        return self.projections + self.attention + self.logits


def forward_flops_per_sequence(
    model: Model, sequence_length: int, causal: bool = False
) -> ForwardFlops:
    """Forward FLOPs for one sequence.

    Per layer and token: 2 x (weights of every matrix) for projections and
    2 x 2 x s x (heads x head_dim) for scores and values; the causal
    convention counts half the s x s square.
    """
    assert model.has_architecture
    assert model.num_layers is not None and model.hidden_size is not None
    assert model.vocab_size is not None
    h, s, layers = model.hidden_size, sequence_length, model.num_layers
    qw = model.query_width
    projections = 2.0 * s * active_matmul_weights(model)
    attention = 2.0 * 2.0 * s * s * qw * layers
    if causal:
        attention /= 2
    logits = 2.0 * h * model.vocab_size * s
    return ForwardFlops(projections=projections, attention=attention, logits=logits)


def mlp_matmul_weights(model: Model, width: int) -> int:
    """Weights of one MLP's matrices (2 or 3 of hidden x width)."""
    assert model.hidden_size is not None
    return (3 if model.gated else 2) * model.hidden_size * width


def active_matmul_weights(model: Model) -> int:
    """Matrix weights one token multiplies through in all layers (MoE: its experts
    and the router only)."""
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    h, qw, kvw = model.hidden_size, model.query_width, model.kv_width
    attention = h * qw + 2 * h * kvw + qw * h
    total = (model.num_layers or 0) * attention
    total += model.num_dense_layers * mlp_matmul_weights(model, model.ffn_hidden_size)
    moe = model.moe
    if moe is not None:
        shared_width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
        per_layer = (moe.experts_per_token * mlp_matmul_weights(model, moe.expert_ffn_hidden_size)
                     + moe.num_shared_experts * mlp_matmul_weights(model, shared_width)
                     + h * moe.num_experts)
        total += model.num_moe_layers * per_layer
    return total


def six_nd_flops(parameters: float, tokens: float) -> float:
    """C = 6 N D (Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1)."""
    return 6.0 * parameters * tokens
