"""Multi-token-prediction modules (`Model.mtp_layers`): their parameters and the
checkpoint's total.

DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv:2412.19437), Sec. 2.2, Eq. 21-23:
depth k combines the previous depth's hidden state (the main model's last one at k = 1)
with the embedding of token i + k, each through an RMSNorm, by the projection
M_k in R^(h x 2h), runs one transformer block TRM_k and the shared output head.
The checkpoint holds per depth: enorm and hnorm, eh_proj (2h x h, no bias), the block
(model.layers.61.self_attn and mlp, "structure identical to the Main Model hidden
layers") and shared_head.norm (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3; Qwen3-Next's
and Qwen3.5's mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.fc, mtp.layers.0
and mtp.norm, the same parts). The block is of the kind of the model's last layer: an
MoE layer for DeepSeek-V3 and GLM-4.5, a full-attention layer with experts for
Qwen3-Next (its mtp.layers.0 attends), as vLLM's deepseek_mtp.py and qwen3_next_mtp.py
build them.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.flops import AttentionKernel, ForwardFlops, forward_flops_per_sequence
from llmpar.footprint.parameters import (
    embedding_parameters,
    head_parameters,
    norm_parameters,
    outer_norm_parameters,
    parameter_groups,
)
from llmpar.spec import Model, Spec

MTP_NORMS = 3
"""RMSNorms per depth outside its block: enorm, hnorm and shared_head.norm (DeepSeek-V3's
README_WEIGHTS.md; Qwen3-Next's pre_fc_norm_embedding, pre_fc_norm_hidden and norm)."""
SHARED_TABLES = ("embedding", "head")
"""Groups an MTP module shares with the main model (arXiv:2412.19437, Sec. 2.2)."""


def mtp_block_model(model: Model, depth: int | None = None) -> Model:
    """`depth` blocks (default: mtp_layers) each of the kind of the model's last layer
    (its experts or dense MLP, its token mixer, its window), as a model of their own."""
    assert model.num_layers is not None
    last = model.num_layers - 1
    moe, pattern = model.moe, model.mixer_pattern
    if pattern is not None:
        pattern = pattern[last % len(pattern)]
    if moe is not None:
        if not model.is_moe_layer(last):
            moe = None
        elif not model.experts_placed:
            moe = attrs.evolve(moe, dense_layers=0, layer_frequency=1)
    window, window_pattern = model.sliding_window, None
    if not model.is_sliding_window_layer(last):
        window = None
    return attrs.evolve(model, num_layers=model.mtp_layers if depth is None else depth,
                        moe=moe, mixer_pattern=pattern, sliding_window=window,
                        sliding_window_pattern=window_pattern, mtp_layers=0,
                        mtp_table_copies=False)


def mtp_parameter_groups(model: Model, depth: int | None = None) -> dict[str, int]:
    """Parameters of `depth` MTP modules (default: mtp_layers) by group, without the
    embedding and output head they share: their blocks' groups, "norms" with the three
    norms of each depth, and "projection", M of each depth (2h x h). Empty without
    modules."""
    depth = model.mtp_layers if depth is None else depth
    if not depth:
        return {}
    assert model.hidden_size is not None
    block = mtp_block_model(model, depth)
    groups = {name: count for name, count in parameter_groups(block).items()
              if name not in SHARED_TABLES}
    h = model.hidden_size
    groups["norms"] += (depth * MTP_NORMS * norm_parameters(model, h)
                        - outer_norm_parameters(block))
    groups["projection"] = depth * 2 * h * h
    return groups


def mtp_stored_copies(model: Model) -> int:
    """The copies of the embedding and output head the checkpoint stores with its modules
    (`Model.mtp_table_copies`: DeepSeek-V3's model.layers.61.embed_tokens and
    shared_head.head); 0 without them."""
    if not model.mtp_table_copies or not model.mtp_layers:
        return 0
    untied = attrs.evolve(model, tie_embeddings=False, mlm_head=False)
    return model.mtp_layers * (embedding_parameters(model) + head_parameters(untied))


def checkpoint_parameters(model: Model, main_total: float) -> float:
    """Parameters the checkpoint stores: the main model's (`main_total`, from
    count_parameters), its MTP modules' and the tables stored with them (DeepSeek-V3:
    671B + 14B = 685B, README of deepseek-ai/DeepSeek-V3)."""
    if not model.mtp_layers or not model.has_architecture:
        return main_total
    return main_total + sum(mtp_parameter_groups(model).values()) + mtp_stored_copies(model)


HELD_AS = {"projection": "attention"}
"""The group a trained module's part is held in: its projection is split like the
attention's projections (Megatron-Core's eh_proj is a column-parallel linear,
megatron/core/transformer/multi_token_prediction.py)."""


def trained_depth(spec: Spec) -> int:
    """The MTP depths a training run trains (`[training] multi_token_prediction`); 0
    without it, and in serving (which drafts with them: `llmpar.inference.speculative`)."""
    if not spec.training.multi_token_prediction or spec.inference is not None:
        return 0
    return spec.model.mtp_layers


def trained_mtp_groups(spec: Spec) -> dict[str, int]:
    """The trained modules' parameters by the main model's groups they are held in
    (`HELD_AS`); empty unless the run trains them."""
    if not trained_depth(spec):
        return {}
    held: dict[str, int] = {}
    for group, count in mtp_parameter_groups(spec.model).items():
        name = HELD_AS.get(group, group)
        held[name] = held.get(name, 0) + count
    return held


def mtp_forward_flops(model: Model, sequence_length: int, causal: bool,
                      kernel: AttentionKernel) -> ForwardFlops:
    """Forward FLOPs of one sequence through every MTP depth (arXiv:2412.19437, Sec. 2.2):
    its block (`mtp_block_model`, the main model's rules), the projection M_k of the
    concatenated 2h-wide input (2 x s x 2h x h) and one more pass of the output layer
    (2 x s x h x V), as Megatron-LM counts them (megatron/training/training.py,
    num_floating_point_operations: "MTP eh proj" and logits x (mtp_num_layers + 1)); the
    norms' elementwise work is not counted, as elsewhere."""
    depth = model.mtp_layers
    assert model.hidden_size is not None
    block = forward_flops_per_sequence(mtp_block_model(model, depth), sequence_length,
                                       causal, kernel)
    h = model.hidden_size
    return ForwardFlops(projections=block.projections + depth * 2.0 * sequence_length
                        * 2 * h * h, attention=block.attention,
                        executed_attention=block.executed_attention,
                        logits=depth * block.logits)


def plus_flops(main: ForwardFlops, extra: ForwardFlops) -> ForwardFlops:
    """Two counts of forward FLOPs together, operation by operation."""
    return ForwardFlops(projections=main.projections + extra.projections,
                        attention=main.attention + extra.attention,
                        executed_attention=main.executed_attention + extra.executed_attention,
                        logits=main.logits + extra.logits)
