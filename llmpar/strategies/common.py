"""Facts several strategies need about the model, the workload and the layout on one GPU.

These are public: a third-party strategy uses them instead of carrying its own copy.
Every function takes array settings as well as plain ones (`llmpar.arrays`): the micro-
batch size and the recomputation mode may be arrays over a search node, and whether a
strategy is on may be a boolean array.
"""

from __future__ import annotations

from typing import Any

from llmpar.arrays import logical_and, maximum, where
from llmpar.dtypes import bytes_per_element
from llmpar.spec import Spec
from llmpar.strategy import Layout, StrategyContext

TENSOR_SPLIT_GROUPS = frozenset({"embedding", "attention", "linear_attention", "mamba", "mlp",
                                 "experts", "shared_experts", "head"})
"""Parameter groups Megatron-style tensor parallelism splits (norms and router stay whole);
the recurrent mixers split by heads, as Megatron-Core's MambaMixer and vLLM's Mamba-2 and
gated DeltaNet layers do (their per-head parameters and norms with them)."""
EXPERT_GROUPS = frozenset({"experts", "expert_adapters"})
"""Parameters that live on expert-parallel ranks: the routed experts, and the LoRA
adapters of their linear layers (`[finetune]`), which sit beside each expert."""
EXPERT_TENSOR = "expert_tensor"
"""The layout key of the expert tensor degree (`[parallel.expert] tensor_degree`)."""

__all__ = ["EXPERT_GROUPS", "EXPERT_TENSOR", "TENSOR_SPLIT_GROUPS", "backward_input_gradient_calls",
           "bytes_per_element", "data_context_stride", "expert_group_stride",
           "expert_tensor_degree", "forward_passes_per_micro_batch", "has_expert_groups",
           "hidden_state_bytes",
           "layer_collective_calls", "layers_per_stage", "micro_batches_per_step",
           "blocks_per_stage",
           "op_checkpoint_collective_reruns",
           "recomputed_block_forwards", "sequence_parallel"]


def has_expert_groups(ctx: StrategyContext) -> bool:
    """Whether the model has parameters on expert-parallel ranks (routed experts, or
    their adapters): only then do shards and collectives of the expert groups exist."""
    return not EXPERT_GROUPS.isdisjoint(ctx.footprint.parameters_by_group)


def micro_batches_per_step(spec: Spec, layout: Layout) -> Any:
    """Gradient-accumulation steps: global batch / (micro-batch x data degree), at least 1."""
    training = spec.training
    if training.global_batch_size is None:
        return 1
    return maximum(1, training.global_batch_size // (training.micro_batch_size
                                                     * layout.degree("data")))


def layers_per_stage(spec: Spec, layout: Layout) -> float:
    """Layers one pipeline stage holds, on average."""
    return (spec.model.num_layers or 0) / layout.degree("pipeline")


def blocks_per_stage(spec: Spec, layout: Layout) -> Any:
    """Layers one pipeline stage holds, on average, counted as blocks of a token mixer and
    an MLP: a single-module layer (a mixer or an MLP alone) is half of one, since each of
    its modules issues one of a block's two per-pass collectives (`Model.norms_in`)."""
    model = spec.model
    layers = model.num_layers or 0
    if not model.single_module_layers:
        return layers_per_stage(spec, layout)
    return model.norms_in(0, layers) / 2 / layout.degree("pipeline")


def hidden_state_bytes(spec: Spec, layout: Layout) -> Any:
    """One micro-batch's hidden states on one context rank: b * (s / cp) * h * d."""
    training = spec.training
    hidden = spec.model.hidden_size or 0
    tokens = training.micro_batch_size * training.sequence_length / layout.degree("context")
    return tokens * hidden * bytes_per_element(spec.precision.activations)


def sequence_parallel(layout: Layout) -> Any:
    """Whether sequence parallelism is on over a tensor group of more than one GPU."""
    return logical_and(layout.is_active("sequence"), layout.degree("tensor") > 1)


def forward_passes_per_micro_batch(spec: Spec) -> Any:
    """Forward passes over the layers per micro-batch: 2 under full recomputation."""
    return where(spec.training.recompute == "full", 2, 1)


def backward_input_gradient_calls(spec: Spec, layout: Layout) -> Any:
    """Calls per step of the backward pass's two input-gradient reductions per layer (of
    the column-parallel Q/K/V and first MLP projections), over the layers of one stage:
    the part of `layer_collective_calls` that can run behind the weight gradients."""
    return 2 * blocks_per_stage(spec, layout) * micro_batches_per_step(spec, layout)


def recomputed_block_forwards(spec: Spec, moe: bool) -> Any:
    """Extra forward passes per micro-batch of one dense (`moe`: MoE) layer's MLP block
    under selective recomputation by module: 1 when `[training] recompute_modules` names
    mlp (moe), whose checkpoint wraps the whole block and so reruns the collectives
    inside it (Megatron-Core transformer_layer.py and moe_layer.py), else 0."""
    modules = spec.training.recompute_modules
    if modules is None:
        return 0
    reruns = ("moe" if moe else "mlp") in modules
    return where(spec.training.recompute == "selective", int(reruns), 0)


def op_checkpoint_collective_reruns(spec: Spec) -> Any:
    """Per layer and micro-batch, the tensor-parallel collectives an op-level
    `[training] recompute_policy` issues again: its recomputation reruns the block's
    forward, whose all-gathers (all-reduces without sequence parallelism) are not in
    torchtitan's save list, while the reduce-scatters' outputs are saved (torchtitan
    v0.2.2 `_op_sac_save_list`: _c10d_functional.reduce_scatter_tensor): 2, else 0."""
    if spec.training.recompute_policy is None:
        return 0
    return where(spec.training.recompute == "selective", 2, 0)


def layer_collective_calls(spec: Spec, layout: Layout) -> Any:
    """Calls per step of a per-layer collective issued twice per forward pass (attention
    and MLP) and twice per backward pass: 4 per layer and micro-batch, 6 with full
    recomputation (Narayanan et al. 2021, Sec. 3.2), over the layers of one stage; one
    more per layer whose MLP or MoE block selective recomputation reruns, two under an
    op-level policy (`op_checkpoint_collective_reruns`)."""
    per_micro_batch = (2 * (forward_passes_per_micro_batch(spec) + 1)
                       + op_checkpoint_collective_reruns(spec))
    calls = per_micro_batch * blocks_per_stage(spec, layout)
    if spec.training.recompute_modules is not None and spec.model.num_layers:
        model = spec.model
        share = (model.num_dense_layers * recomputed_block_forwards(spec, False)
                 + model.num_moe_layers * recomputed_block_forwards(spec, True))
        calls = calls + share / layout.degree("pipeline")
    return calls * micro_batches_per_step(spec, layout)


def expert_tensor_degree(layout: Layout) -> int:
    """Ranks each routed expert's matrices split over: `[parallel.expert] tensor_degree`,
    by default the tensor degree."""
    return layout.degrees.get(EXPERT_TENSOR, layout.degree("tensor"))


def data_context_stride(layout: Layout) -> int:
    """Where Megatron-Core's data x context block of ranks starts."""
    return layout.block_stride(("data", "context"))


def expert_group_stride(layout: Layout) -> int:
    """Rank distance between the members of an expert group. Expert ranks are the
    innermost data x context ranks, or, when experts split over fewer ranks than the
    layers (MoE parallel folding, Liu et al. 2025, arXiv:2504.14960), they fold into the
    tensor ranks."""
    tensor, folded = layout.degree("tensor"), expert_tensor_degree(layout)
    if folded < tensor:
        return layout.stride("tensor") * folded
    return data_context_stride(layout)
