"""Parameter counts by group, from the architecture.

Each count is the number of elements of the parameter tensors Hugging Face
`transformers` allocates for the architecture (tied weights once; buffers such
as DeepSeek-V3's e_score_correction_bias are not parameters). A tensor belongs
to the group of the module that owns it, as `validation/measure_hf.py` groups
the measured counts: norms inside the attention module (per-head or whole-width
q/k norms, MLA's latent norms) count as attention; `norms` holds the blocks'
norms, the final norm, the embedding norm and the norm of BERT's MLM head.
"""

from __future__ import annotations

from types import MappingProxyType

import attrs

from llmpar.spec import Model

GROUPS = ("embedding", "attention", "linear_attention", "mamba", "mlp", "experts",
          "shared_experts", "router", "norms", "head", "pooler")
MOE_GROUPS = ("experts", "shared_experts", "router")
MIXER_GROUPS = ("linear_attention", "mamba")
"""The groups of the recurrent token mixers, present only in models that have them."""
BLOCK_NORMS = {"pre": 2, "post": 2, "sandwich": 4}
"""Norms per block by `Model.norm_placement`."""


@attrs.frozen(kw_only=True)
class ParameterCount:
    """Parameters of one replica; `by_group` is empty for a model given by size."""

    total: float
    active: float
    """Parameters one token passes through (MoE: only its experts); 6ND uses these."""
    by_group: dict[str, int] = attrs.field(factory=dict, hash=False)


def norm_parameters(model: Model, width: int) -> int:
    """A norm over `width` channels: LayerNorm has weight and bias, RMSNorm only weight."""
    return 2 * width if model.norm == "layernorm" else width


def attention_matmul_weights(model: Model) -> int:
    """Weights of one layer's attention matrices: Q, K, V and output, or MLA's."""
    assert model.hidden_size is not None
    if model.mla is not None:
        return mla_matmul_weights(model) + indexer_matmul_weights(model)
    h, qw, kvw = model.hidden_size, model.query_width, model.kv_width
    gate = h * qw if model.attention_output_gate else 0  # q_proj twice as wide
    return h * qw + gate + 2 * h * kvw + qw * h


def mla_matmul_weights(model: Model) -> int:
    """MLA's matrices (DeepSeek-V2, arXiv:2405.04434, Eqs. 9-13 and 37-38): query down and
    up (or one query projection), the joint key/value-and-rope-key down projection, the
    key/value up projection and the output projection."""
    mla = model.mla
    assert mla is not None and model.hidden_size is not None
    assert model.num_attention_heads is not None
    h, a = model.hidden_size, model.num_attention_heads
    rank = mla.q_lora_rank
    query = h * a * mla.qk_head_dim if rank is None else h * rank + rank * a * mla.qk_head_dim
    key_value = (h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
                 + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim))
    return query + key_value + a * mla.v_head_dim * h


def indexer_matmul_weights(model: Model) -> int:
    """DeepSeek sparse attention's lightning indexer (transformers' DeepseekV32Indexer):
    wq_b from the query latent to index_heads x index_head_dim, wk from the hidden state to
    one key of index_head_dim, weights_proj to one weight per head; 0 without it."""
    sparse, mla = model.sparse_attention, model.mla
    if sparse is None or mla is None:
        return 0
    assert mla.q_lora_rank is not None and model.hidden_size is not None
    h, heads, width = model.hidden_size, sparse.index_heads, sparse.index_head_dim
    return mla.q_lora_rank * heads * width + h * width + h * heads


def attention_bias_parameters(model: Model) -> int:
    """Biases of the attention projections (MLA: of its down projections and output)."""
    assert model.hidden_size is not None
    qkv = model.qkv_bias or model.linear_bias
    output = model.hidden_size if model.attention_output_bias or model.linear_bias else 0
    if not qkv:
        return output
    mla = model.mla
    if mla is None:
        query = model.query_width * (2 if model.attention_output_gate else 1)
        return output + query + 2 * model.kv_width
    return output + (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim


def attention_norm_parameters(model: Model) -> int:
    """Norms inside the attention module: q/k norms and MLA's latent norms."""
    total = 0
    if model.qk_norm and model.qk_norm_scope == "projection":
        total += norm_parameters(model, model.query_width) + norm_parameters(model,
                                                                             model.kv_width)
    elif model.qk_norm:
        total += 2 * norm_parameters(model, model.qk_head_dim)
    if model.mla is not None:
        total += norm_parameters(model, model.mla.kv_lora_rank)
        total += norm_parameters(model, model.mla.q_lora_rank or 0)
    if model.sparse_attention is not None:  # the indexer's key norm: nn.LayerNorm
        total += 2 * model.sparse_attention.index_head_dim
    return total


def attention_sink_parameters(model: Model) -> int:
    """gpt-oss's sinks: one logit per query head (GptOssAttention.sinks, transformers)."""
    if not model.attention_sinks:
        return 0
    assert model.num_attention_heads is not None
    return model.num_attention_heads


def attention_parameters(model: Model) -> int:
    """One layer's attention module: projections, biases, the norms inside it and
    attention sinks."""
    return (attention_matmul_weights(model) + attention_bias_parameters(model)
            + attention_norm_parameters(model) + attention_sink_parameters(model))


def linear_attention_matmul_weights(model: Model) -> int:
    """Weights of one gated DeltaNet layer's projections (transformers' Qwen3NextGatedDeltaNet):
    in_proj_qkvz (h to queries, keys, values and z), in_proj_ba (h to beta and a, one each
    per value head) and out_proj (values to h); no biases."""
    linear = model.linear_attention
    assert linear is not None and model.hidden_size is not None
    h = model.hidden_size
    qkvz = 2 * linear.key_width + 2 * linear.value_width
    return h * qkvz + h * 2 * linear.num_value_heads + linear.value_width * h


def linear_attention_parameters(model: Model) -> int:
    """One gated DeltaNet layer: its projections, the depthwise convolution (conv_width x
    kernel, no bias), dt_bias and A_log (one per value head) and the gated RMSNorm of
    value_head_dim (Qwen3NextRMSNormGated: a weight only)."""
    linear = model.linear_attention
    assert linear is not None
    return (linear_attention_matmul_weights(model)
            + linear.conv_width * linear.conv_kernel_size + 2 * linear.num_value_heads
            + linear.value_head_dim)


def mamba_matmul_weights(model: Model) -> int:
    """Weights of one Mamba-2 layer's projections (transformers' Mamba2Mixer): in_proj (h
    to z and x of inner_width, B and C of num_groups x state_size, one dt per head) and
    out_proj (inner_width to h)."""
    mamba = model.mamba
    assert mamba is not None and model.hidden_size is not None
    h = model.hidden_size
    projected = mamba.inner_width + mamba.conv_width + mamba.num_heads
    return h * projected + mamba.inner_width * h


def mamba_parameters(model: Model) -> int:
    """One Mamba-2 layer: its projections (with biases when projection_bias), the depthwise
    convolution over conv_width channels (with a bias when conv_bias), dt_bias, A_log and D
    (one per head) and, with gated_norm, the gated RMSNorm of inner_width (a weight only;
    FalconH1Mixer builds it only with mamba_rms_norm)."""
    mamba = model.mamba
    assert mamba is not None and model.hidden_size is not None
    biases = 0
    if mamba.projection_bias:
        biases = mamba.inner_width + mamba.conv_width + mamba.num_heads + model.hidden_size
    conv = mamba.conv_width * mamba.conv_kernel_size + (mamba.conv_width
                                                        if mamba.conv_bias else 0)
    return (mamba_matmul_weights(model) + biases + conv + 3 * mamba.num_heads
            + (mamba.inner_width if mamba.gated_norm else 0))


MIXER_PARAMETERS = MappingProxyType({"attention": attention_parameters,
                                     "linear_attention": linear_attention_parameters,
                                     "mamba": mamba_parameters})
"""One layer's token mixer, by kind, as `Model.mixers_in` names them."""


def mlp_parameters(model: Model, width: int) -> int:
    """One MLP of inner width `width`: gate/up/down (gated) or up/down, with biases."""
    assert model.hidden_size is not None
    h = model.hidden_size
    matrices = 3 if model.gated else 2
    biased = model.linear_bias or model.mlp_bias
    biases = (matrices - 1) * width + h if biased else 0
    return matrices * h * width + biases


def layer_norm_parameters(model: Model) -> int:
    """The norms of a block outside attention: 2 (pre or post) or 4 (sandwich); a
    single-module layer has half of them (`Model.norms_in`)."""
    assert model.hidden_size is not None
    return BLOCK_NORMS[model.norm_placement] * norm_parameters(model, model.hidden_size)


def embedding_parameters(model: Model) -> int:
    """Token, learned position and token-type tables."""
    assert model.hidden_size is not None and model.vocab_size is not None
    rows = model.vocab_size + model.type_vocab_size
    if model.position_embedding == "learned":
        assert model.max_position_embeddings is not None
        rows += model.max_position_embeddings
    return rows * model.hidden_size


def head_parameters(model: Model) -> int:
    """The untied output projection (vocab_size x hidden_size, no bias), and BERT's MLM
    head: a dense transform with bias and an output bias of vocab_size."""
    assert model.hidden_size is not None and model.vocab_size is not None
    h, vocab = model.hidden_size, model.vocab_size
    total = 0 if model.tie_embeddings else vocab * h
    if model.mlm_head:
        total += h * h + h + vocab
    return total


def outer_norm_parameters(model: Model) -> int:
    """Norms outside the blocks: final, embedding and MLM-head norms."""
    assert model.hidden_size is not None
    count = int(model.final_norm) + int(model.embedding_norm) + int(model.mlm_head)
    return count * norm_parameters(model, model.hidden_size)


def moe_layer_groups(model: Model) -> dict[str, int]:
    """Routed experts, shared experts and router of one MoE layer."""
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    shared_width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
    shared = moe.num_shared_experts * mlp_parameters(model, shared_width)
    if moe.shared_expert_gate:
        shared += model.hidden_size
    router = model.hidden_size * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
    return {"experts": moe.num_experts * mlp_parameters(model, moe.expert_ffn_hidden_size),
            "shared_experts": shared, "router": router}


def idle_expert_parameters(model: Model) -> int:
    """Parameters of the routed experts a token does not go to, all MoE layers."""
    moe = model.moe
    if moe is None:
        return 0
    idle = moe.num_experts - moe.experts_per_token
    return model.num_moe_layers * idle * mlp_parameters(model, moe.expert_ffn_hidden_size)


def parameter_groups(model: Model) -> dict[str, int]:
    """Every group of an architecture (MoE groups only with experts, pooler only with one)."""
    assert model.hidden_size is not None
    layers = model.num_layers or 0
    groups = dict.fromkeys(GROUPS, 0)
    groups["embedding"] = embedding_parameters(model)
    if model.mixer_pattern is None:
        groups["attention"] = layers * attention_parameters(model)
    else:
        for kind, count in model.mixers_in(0, layers).items():
            groups[kind] = count * MIXER_PARAMETERS[kind](model)
    if model.num_dense_layers:  # none in a model of mixers alone (Mamba2ForCausalLM)
        assert model.ffn_hidden_size is not None
        groups["mlp"] = model.num_dense_layers * mlp_parameters(model, model.ffn_hidden_size)
    groups["norms"] = (model.norms_in(0, layers) * layer_norm_parameters(model) // 2
                       + outer_norm_parameters(model))
    groups["head"] = head_parameters(model)
    groups["pooler"] = model.hidden_size * model.hidden_size + model.hidden_size
    if model.moe is not None:
        for name, count in moe_layer_groups(model).items():
            groups[name] = model.num_moe_layers * count
    dropped = set() if model.moe is not None else set(MOE_GROUPS)
    dropped |= {name for name in MIXER_GROUPS if not groups[name]}
    if not model.pooler:
        dropped.add("pooler")
    return {name: count for name, count in groups.items() if name not in dropped}


def count_parameters(model: Model) -> ParameterCount:
    """Parameters of `model`, exact for an architecture, as given for a size."""
    if not model.has_architecture:
        assert model.parameters is not None
        return ParameterCount(total=float(model.parameters), active=float(model.parameters))
    groups = parameter_groups(model)
    total = float(sum(groups.values()))
    return ParameterCount(total=total, active=total - idle_expert_parameters(model),
                          by_group=groups)
