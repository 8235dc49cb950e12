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

from llmpar.footprint.parameters import (
    embedding_parameters,
    head_parameters,
    norm_parameters,
    outer_norm_parameters,
    parameter_groups,
)
from llmpar.spec import Model

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
