"""The pipeline runs at the pace of its slowest stage.

Every stage processes every micro-batch and hands it to the next, so in a synchronous
schedule a step takes as long as the stage with the most work: with uneven layer
counts, or with the output layer on the last stage (a large vocabulary: Llama 3's 128K,
BLOOM's 250K), that stage sets the pace and the others wait (Megatron-LM's
--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers exist to
even it out). Per stage: its layers' products (attention projections, MLP or MoE, attention
scores and values) at their training-pass multiple, and the output layer's on the last.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmpar.footprint.flops import (
    BACKWARD_TO_FORWARD,
    mlp_matmul_weights,
    module_rerun_weights,
    moe_matmul_weights,
)
from llmpar.footprint.mtp import mtp_block_model, trained_depth
from llmpar.footprint.op_checkpoint import rerun_weights as op_rerun_weights
from llmpar.footprint.parameters import attention_matmul_weights
from llmpar.spec import Spec
from llmpar.strategy import Stage

TRAINING_PASSES = 1.0 + BACKWARD_TO_FORWARD


def _layer_flops(spec: Spec, moe: bool, rerun: float, attention_rerun: float,
                 attention_share: float) -> float:
    """Hardware FLOPs of one dense (or MoE) layer for one token, per unit of 2 x sequence,
    attention as its kernel executes it (`attention_share` of the s x s square), with
    the forward of the modules selective recomputation reruns."""
    model = spec.model
    if moe:
        block = moe_matmul_weights(model)
    else:
        assert model.ffn_hidden_size is not None
        block = mlp_matmul_weights(model, model.ffn_hidden_size)
    projections = attention_matmul_weights(model) + block
    s = spec.training.sequence_length
    scores = s * (model.query_width + model.attention_output_width) * attention_share
    modules = spec.training.recomputed_modules
    reruns = module_rerun_weights(model, modules, moe) if modules else 0
    policy = spec.training.recompute_policy
    if policy is not None and spec.training.recompute == "selective":
        reruns += op_rerun_weights(model, policy, moe)  # the products the policy does not save
    return (projections * (TRAINING_PASSES + rerun) + reruns
            + scores * (TRAINING_PASSES + rerun + attention_rerun))


def stage_flops(spec: Spec, stages: Sequence[Stage], recomputed_fraction: float,
                attention_share: float = 1.0) -> list[float]:
    """Hardware FLOPs of each stage for one token (up to a common factor), counted by
    kind of layer in closed form; `attention_share` is the share of the s x s square the
    attention kernel executes (`llmpar.footprint.flops.executed_attention_share`)."""
    model = spec.model
    assert model.hidden_size is not None and model.vocab_size is not None
    recompute = spec.training.recompute
    rerun = recomputed_fraction if recompute == "full" else 0.0
    attention_rerun = (TRAINING_PASSES if recompute == "selective"
                       and "core_attn" in spec.training.selective_modules else 0.0)
    head = model.hidden_size * model.vocab_size * TRAINING_PASSES
    dense_layer = (_layer_flops(spec, False, rerun, attention_rerun, attention_share)
                   if model.ffn_hidden_size is not None else 0.0)
    moe_layer = (_layer_flops(spec, True, rerun, attention_rerun, attention_share)
                 if model.moe else 0.0)
    depth = trained_depth(spec)
    if depth:  # the trained MTP modules on the last stage: blocks, projections, heads
        block = mtp_block_model(model, depth)
        head += (block.num_dense_layers * dense_layer + block.num_moe_layers * moe_layer
                 + depth * (2 * model.hidden_size ** 2 * TRAINING_PASSES + head))
    found = []
    for stage in stages:
        moe = model.moe_layers_in(stage.first_layer, stage.num_layers)
        found.append((stage.num_layers - moe) * dense_layer + moe * moe_layer
                     + (head if stage.has_head else 0.0))
    return found


def slowest_stage_factor(spec: Spec, stages: Sequence[Stage],
                         recomputed_fraction: float, attention_share: float = 1.0) -> float:
    """The slowest stage's work over the average stage's: how much longer the pipeline
    takes than an even split of the same FLOPs (1 without a pipeline). A stage with a
    mirror (`Stage.mirror`, DualPipe) runs half the micro-batches through each of its two
    stages (deepseek-ai/DualPipe dualpipe.py: half of the chunks enter from each end):
    its work is the mean of the two."""
    if len(stages) <= 1 or not spec.model.has_architecture:
        return 1.0
    work = stage_flops(spec, stages, recomputed_fraction, attention_share)
    mirrors = [stage.mirror for stage in stages]
    if any(mirror is not None for mirror in mirrors):
        paired = stage_flops(spec, [stage if mirror is None else mirror
                                    for stage, mirror in zip(stages, mirrors)],
                             recomputed_fraction, attention_share)
        work = [(own + other) / 2 for own, other in zip(work, paired)]
    return max(work) * len(work) / sum(work)
