"""Small facts several strategies need about the model and workload on one GPU."""

from __future__ import annotations

from llmpar.dtypes import bytes_per_element
from llmpar.spec import Spec
from llmpar.strategy import Layout

TENSOR_SPLIT_GROUPS = frozenset({"embedding", "attention", "mlp", "experts", "shared_experts",
                                 "head"})
"""Parameter groups Megatron-style tensor parallelism splits (norms and router stay whole)."""
EXPERT_GROUPS = frozenset({"experts"})
"""Parameters that live on expert-parallel ranks."""


def micro_batches_per_step(spec: Spec, layout: Layout) -> int:
    """Gradient-accumulation steps: global batch / (micro-batch x data degree)."""
    training = spec.training
    if training.global_batch_size is None:
        return 1
    return max(1, training.global_batch_size // (training.micro_batch_size
                                                 * layout.degree("data")))


def layers_per_stage(spec: Spec, layout: Layout) -> float:
    """Layers one pipeline stage holds, on average."""
    return (spec.model.num_layers or 0) / layout.degree("pipeline")


def hidden_state_bytes(spec: Spec, layout: Layout) -> float:
    """One micro-batch's hidden states on one context rank: b * (s / cp) * h * d."""
    training = spec.training
    hidden = spec.model.hidden_size or 0
    tokens = training.micro_batch_size * training.sequence_length / layout.degree("context")
    return tokens * hidden * bytes_per_element(spec.precision.activations)


def sequence_parallel(spec: Spec) -> bool:
    """Whether sequence parallelism is on: `[parallel.sequence]` present and enabled."""
    config = spec.parallel.get("sequence")
    return config is not None and bool(getattr(config, "enabled", True))


def forward_passes_per_micro_batch(spec: Spec) -> int:
    """Forward passes over the layers per micro-batch: 2 under full recomputation."""
    return 2 if spec.training.recompute == "full" else 1


def backward_input_gradient_calls(spec: Spec, layout: Layout) -> float:
    """Calls per step of the backward pass's two input-gradient reductions per layer (of
    the column-parallel Q/K/V and first MLP projections), over the layers of one stage:
    the part of `layer_collective_calls` that can run behind the weight gradients."""
    return 2 * layers_per_stage(spec, layout) * micro_batches_per_step(spec, layout)


def layer_collective_calls(spec: Spec, layout: Layout) -> float:
    """Calls per step of a per-layer collective issued twice per forward pass (attention
    and MLP) and twice per backward pass: 4 per layer and micro-batch, 6 with full
    recomputation (Narayanan et al. 2021, Sec. 3.2), over the layers of one stage."""
    per_micro_batch = 2 * (forward_passes_per_micro_batch(spec) + 1)
    return per_micro_batch * layers_per_stage(spec, layout) * micro_batches_per_step(spec, layout)
