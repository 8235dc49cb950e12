"""The matrix products of a training step on one GPU, and the time they lose when they
are memory-bound.

Compute time counts FLOPs at the GPU's matmul efficiency; that holds while a product
does enough arithmetic per byte it moves. A product whose weights and operands take
longer to stream from HBM than its FLOPs take to compute runs at the memory's pace
instead: the roofline of `llmpar.roofline` (Williams et al. 2009). In training that
happens where few tokens meet many weights: a small micro-batch x sequence / context
degree per GPU, thin slices (hidden size / tensor degree), experts that each see a
few tokens. Per layer and micro-batch, on one GPU:
- attention projections: Q, K, V and output (MLA: its own), weights split as tensor
  parallelism splits them (KV heads copied past t > kv);
- MLP, or router + routed experts + shared experts: tokens routed evenly, so the
  E/e experts of a GPU see k x tokens x e / E tokens each and all their weights are
  read;
- once per model: the output layer.
Bytes: the weights once (in the weights' format), the input and output activations
once. Each product's backward pass (input and weight gradients) computes and moves
twice what its forward does; full recomputation reruns the forward. Attention itself
(Q.K^T, scores.V) runs as FlashAttention, compute-bound at training lengths, and adds
nothing here.
"""

from __future__ import annotations

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.flops import BACKWARD_TO_FORWARD, mlp_matmul_weights
from llmpar.footprint.parameters import attention_matmul_weights
from llmpar.inference.workspace import attention_width, mlp_width
from llmpar.roofline import Operation, Rates, compute_seconds, memory_seconds
from llmpar.spec import Spec
from llmpar.strategies.tensor import attention_divisor


@attrs.frozen(kw_only=True)
class RankShape:
    """What decides the shapes of one GPU's products."""

    tensor: int = 1
    context: int = 1
    expert: int = 1
    micro_batch_size: int = 1


def _tokens(spec: Spec, shape: RankShape) -> float:
    return shape.micro_batch_size * spec.training.sequence_length / shape.context


def _operation(name: str, flops: float, weights: float, io: float, spec: Spec) -> Operation:
    weight_bytes = bytes_per_element(spec.precision.weights)
    act_bytes = bytes_per_element(spec.precision.activations)
    return Operation(name=name, flops=flops, bytes=weights * weight_bytes + io * act_bytes,
                     dtype=spec.precision.compute)


def _attention(spec: Spec, shape: RankShape, tokens: float) -> Operation:
    model = spec.model
    assert model.hidden_size is not None
    weights = attention_matmul_weights(model) / attention_divisor(spec, shape.tensor)
    io = tokens * (2 * model.hidden_size + attention_width(model, shape.tensor))
    return _operation("attention projections", 2 * tokens * weights, weights, io, spec)


def _mlp(spec: Spec, shape: RankShape, tokens: float) -> Operation:
    model, t = spec.model, shape.tensor
    assert model.hidden_size is not None and model.ffn_hidden_size is not None
    weights = mlp_matmul_weights(model, model.ffn_hidden_size) / t
    io = tokens * (2 * model.hidden_size + 2 * mlp_width(model, model.ffn_hidden_size, t))
    return _operation("mlp", 2 * tokens * weights, weights, io, spec)


def _moe(spec: Spec, shape: RankShape, tokens: float) -> list[Operation]:
    model, t, e = spec.model, shape.tensor, shape.expert
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    h, width = model.hidden_size, moe.expert_ffn_hidden_size
    routed = tokens * moe.experts_per_token
    expert_weights = mlp_matmul_weights(model, width) / t
    shared_width = moe.shared_expert_ffn_hidden_size or width
    shared = moe.num_shared_experts * mlp_matmul_weights(model, shared_width) / t
    ops = [
        _operation("router", 2 * tokens * h * moe.num_experts, h * moe.num_experts,
                   tokens * (h + moe.num_experts), spec),
        _operation("routed experts", 2 * routed * expert_weights,
                   moe.num_experts / e * expert_weights,
                   routed * (2 * h + 2 * mlp_width(model, width, t)), spec),
    ]
    if shared:
        io = tokens * 2 * (h + moe.num_shared_experts * mlp_width(model, shared_width, t))
        ops.append(_operation("shared experts", 2 * tokens * shared, shared, io, spec))
    return ops


def layer_matmuls(spec: Spec, shape: RankShape) -> list[tuple[Operation, float]]:
    """Each product of one micro-batch's forward pass through every layer, on one GPU
    of each pipeline stage, with how many layers run it."""
    model = spec.model
    tokens = _tokens(spec, shape)
    ops: list[tuple[Operation, float]] = [(_attention(spec, shape, tokens),
                                           float(model.num_layers or 0))]
    if model.num_dense_layers:
        ops.append((_mlp(spec, shape, tokens), float(model.num_dense_layers)))
    if model.moe is not None and model.num_moe_layers:
        ops += [(op, float(model.num_moe_layers)) for op in _moe(spec, shape, tokens)]
    return ops


def output_layer(spec: Spec, shape: RankShape) -> Operation:
    model = spec.model
    assert model.hidden_size is not None and model.vocab_size is not None
    tokens = _tokens(spec, shape)
    head = model.hidden_size * model.vocab_size / shape.tensor
    io = tokens * (model.hidden_size + model.vocab_size / shape.tensor)
    return _operation("output layer", 2 * tokens * head, head, io, spec)


def _excess(op: Operation, rates: Rates) -> float:
    return max(0.0, memory_seconds(op, rates) - compute_seconds(op, rates))


def memory_bound_seconds(spec: Spec, shape: RankShape, rates: Rates, recompute: str,
                         recomputed_fraction: float) -> float:
    """Seconds one micro-batch's products spend beyond their FLOPs' time in a training
    pass, summed along the pipeline: max(0, memory time - compute time) per product,
    times its forward-pass equivalents (forward, backward = 2 x forward, and the rerun
    of the recomputed share of layers)."""
    if not spec.model.has_architecture:
        return 0.0
    passes = 1.0 + BACKWARD_TO_FORWARD
    rerun = recomputed_fraction if recompute == "full" else 0.0
    layers = sum(count * _excess(op, rates) for op, count in layer_matmuls(spec, shape))
    return layers * (passes + rerun) + _excess(output_layer(spec, shape), rates) * passes
