"""Which transformers modeling code a model runs, and what that code keeps.

The model fields say the architecture; a few facts that change what autograd keeps
are only in the modeling code of transformers 5.24 (modeling_<model_type>.py):
how a norm casts, whether projections are fused, which dtype the eager softmax
uses, which GELU formula runs and how the router computes its weights. A model read
from a config.json (llmpar.model_from_hf, the presets) names its transformers
class in its source; otherwise the family follows from the fields.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from llmpar.spec.model import Model

NORMS = ("llama", "olmo2", "gemma", "fp32-weight", "layernorm")
ROUTERS = ("softmax-fp32", "softmax-cast", "deepseek", "topk-softmax", "topk-softmax-cast",
           "softmax-clamp", "sigmoid")


@attrs.frozen(kw_only=True)
class Family:
    """The parts of one transformers modeling file that decide the saved tensors."""

    name: str
    norm: str = "llama"
    """llama: x.float() -> x * rsqrt(mean(x^2)) -> weight * x_hat.to(dtype), keeping the
    fp32 input, rsqrt and the normalized x in the activations' dtype; olmo2: weight *
    x_hat before the cast, keeping x_hat in fp32; gemma: x_hat * (1 + weight.float()),
    keeping x_hat in fp32 and the fp32 (1 + weight); fp32-weight: (weight.float() *
    x_hat).to(dtype) (NemotronHRMSNorm), keeping x_hat and the weight's copy in fp32;
    layernorm: ATen's native_layer_norm keeping its input, mean and rstd."""
    fused_qkv: bool = False
    """Q, K and V are slices of one projection's output (GPT-2 c_attn, Phi-3 qkv_proj)."""
    rope: bool = True
    rope_fp32: bool = False
    """RoPE's cos and sin stay fp32 (OLMo 2's rotary embedding skips the cast to the
    activations' dtype and casts q and k back after the rotation)."""
    softmax_fp32: bool = True
    """Eager attention takes softmax(dtype=float32).to(dtype) (Llama and its
    descendants); GPT-2 and BERT take the softmax in the activations' dtype."""
    gelu_formula: bool = False
    """GELU written out as 0.5 x (1 + tanh(...)) (GPT-2's gelu_new, NewGELUActivation),
    which keeps four tensors; otherwise F.gelu/F.silu keep only their input."""
    residual_dropout: bool = False
    """Dropout modules on the residual branches (GPT-2, BERT, Phi-3)."""
    router: str = "softmax-cast"
    """softmax-fp32: Mixtral's softmax(logits.float()) with fp32 routing weights;
    softmax-cast: Qwen-MoE's softmax(dtype=float) cast back to the activations' dtype;
    deepseek: an fp32 router, sigmoid scores and group-limited top-k; topk-softmax:
    Granite's top-k of the fp32 logits, then softmax over the k, cast back;
    topk-softmax-cast: gpt-oss's top-k of the logits (a linear with a bias), then softmax
    over the k in the activations' dtype (GptOssTopKRouter);
    softmax-clamp: ERNIE 4.5's fp32 linear on an fp32 copy of the input, softmax, top-k of
    the probabilities plus the correction bias, the chosen probabilities gathered and
    divided by their sum clamped at moe_norm_min (out of place), cast back; sigmoid:
    MiniMax-M2's linear in the weights' dtype, sigmoid of the fp32 logits, top-k of the
    scores plus the correction bias, the chosen scores renormalized in place, fp32."""
    norm_topk: bool = True
    """The top-k routing weights are renormalized in place (Mixtral always; Qwen3-MoE and
    DeepSeek-V3 by their published norm_topk_prob)."""
    causal_lm: bool = True
    """Labels are shifted for next-token prediction; BERT's MLM loss takes them as given."""
    loss_upcast: bool = True
    """The loss runs on logits.float() (ForCausalLMLoss); BertForMaskedLM calls
    CrossEntropyLoss on the logits as they are."""
    rope_concat: bool = False
    """RoPE rotates a part of each head and concatenates the rest (apply_rotary_pos_emb
    of Qwen3-Next, GLM-4.5 and MiniMax-M2): q comes out a new b x a x s x d tensor, so SDPA's
    output is laid out the same and transposed by a copy."""
    query_scale: bool = False
    """Each layer scales the rotated queries by 1 + beta log(1 + floor(position /
    original_max_position_embeddings)) (get_llama_4_attn_scale of Ministral 3), an s-long
    vector cast to the activations' dtype in every layer, which the product keeps."""
    attention_sinks: bool = False
    """The eager attention concatenates a learned sink logit per head to the scores,
    subtracts the row maximum and drops the sink column after the softmax, which runs in
    the activations' dtype (gpt-oss's eager_attention_forward): the softmax keeps its
    s + 1 columns and the maximum its int64 indices."""
    sdpa: bool = True
    """transformers runs the model with SDPA (GptOssPreTrainedModel._supports_sdpa =
    False: SDPA has no sink logits)."""
    clamped_swiglu: bool = False
    """The experts' gate and up halves are interleaved columns of one projection (with a
    bias), clamped at swiglu_limit and combined as (up + 1) * gate * sigmoid(alpha *
    gate) (GptOssExperts._apply_gate)."""
    rope_half: bool = False
    """RoPE's cos and sin are head_dim / 2 wide: the frequencies are not repeated
    (GptOssRotaryEmbedding, whose rotation pairs the two halves of each head)."""
    residual_fp32: bool = False
    """The residual stream is fp32 (Mamba2Block's residual_in_fp32): the final norm's
    input needs no upcast and its normalized x stays fp32 (weight * x.to(input_dtype))."""
    rope_per_layer_fp32: bool = False
    """RoPE rotates interleaved pairs in fp32 (ERNIE 4.5's apply_rotary_pos_emb): the
    rotary embedding's cos and sin stay fp32 and every layer repeats each half's values
    (repeat_interleave) into its own fp32 s x d_head copies, which the products with
    q.float() and k.float() keep; the shared ones are kept by nothing."""
    rope_complex: bool = False
    """RoPE multiplies q.float() and k.float(), viewed as complex pairs, by freqs_cis
    (Llama 4's apply_rotary_emb): the products keep only the complex frequencies, s x
    head_dim / 2 complex64 (the bytes of bf16 cos and sin), shared by the layers."""
    nope_layers: bool = False
    """Every sliding_window_pattern-th layer skips RoPE (Llama 4's no_rope_layers: the
    global layers, the others chunked): a RoPE layer takes the weightless L2 norm of q
    and k where the model has it (qk_l2_norm; Llama4TextL2Norm on x.float(), keeping the
    fp32 copy and the rsqrt per head), a NoPE layer scales the queries by an fp32
    per-position temperature (attn_scales, kept by the product)."""
    experts_every_copy: bool = False
    """Llama4TextMoe: the router's top-k logits are scattered into -inf and their
    sigmoid taken in fp32, the input repeated once per expert and scaled by its score,
    and every expert runs (torch.bmm) on its own copy of every token."""
    rope_per_window: bool = False
    """The rotary embedding computes its cos and sin once per attention kind the layers
    have (Gemma3RotaryEmbedding: a local base for the sliding-window layers, a global one
    for the others; Gemma3TextModel.forward over set(layer_types)): a model with both
    kinds keeps two sets."""
    mask_always: bool = False
    """The attention mask is built in every forward and passed to SDPA: DeepseekV32Model
    calls create_causal_mask with allow_is_causal_skip=False and each layer folds its
    indexer's top-k selection into it (DeepseekV32Attention.forward,
    modeling_deepseek_v32.py of transformers 5.24.0), where other models skip the mask
    for is_causal; SDPA's flash kernel keeps it as a sliding window's is kept."""
    rope_per_sample: bool = False
    """RoPE's cos and sin are b x s x d_rope: the multimodal rotary embedding of Qwen3.5
    (Qwen3_5TextRotaryEmbedding, interleaved mrope) expands position_ids to 3 x b x s, so
    every sample has its own; otherwise they are computed for position_ids of 1 x s."""


LLAMA = Family(name="llama")
FAMILIES: Mapping[str, Family] = MappingProxyType({
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": attrs.evolve(LLAMA, name="mistral"),
    "MixtralForCausalLM": attrs.evolve(LLAMA, name="mixtral", router="softmax-fp32"),
    "Qwen2ForCausalLM": attrs.evolve(LLAMA, name="qwen2"),
    "Qwen3ForCausalLM": attrs.evolve(LLAMA, name="qwen3"),
    "Qwen2MoeForCausalLM": attrs.evolve(LLAMA, name="qwen2-moe", norm_topk=False),
    "Qwen3MoeForCausalLM": attrs.evolve(LLAMA, name="qwen3-moe"),
    "Phi3ForCausalLM": attrs.evolve(LLAMA, name="phi3", fused_qkv=True, residual_dropout=True),
    "Olmo2ForCausalLM": attrs.evolve(LLAMA, name="olmo2", norm="olmo2", rope_fp32=True),
    "Gemma2ForCausalLM": attrs.evolve(LLAMA, name="gemma2", norm="gemma"),
    "Gemma3ForCausalLM": attrs.evolve(LLAMA, name="gemma3", norm="gemma",
                                      rope_per_window=True),
    "DeepseekV2ForCausalLM": attrs.evolve(LLAMA, name="deepseek-v2", router="deepseek"),
    "DeepseekV3ForCausalLM": attrs.evolve(LLAMA, name="deepseek-v3", router="deepseek"),
    "DeepseekV32ForCausalLM": attrs.evolve(LLAMA, name="deepseek-v3.2", router="deepseek",
                                           mask_always=True),
    "Mamba2ForCausalLM": attrs.evolve(LLAMA, name="mamba2", rope=False, residual_fp32=True),
    "NemotronHForCausalLM": attrs.evolve(LLAMA, name="nemotron-h", norm="fp32-weight",
                                         rope=False, router="deepseek"),
    "GraniteMoeHybridForCausalLM": attrs.evolve(LLAMA, name="granite-moe-hybrid",
                                                router="topk-softmax", norm_topk=False),
    "FalconH1ForCausalLM": attrs.evolve(LLAMA, name="falcon-h1"),
    "Qwen3NextForCausalLM": attrs.evolve(LLAMA, name="qwen3-next", norm="gemma",
                                         rope_concat=True),
    "Qwen3_5ForCausalLM": attrs.evolve(LLAMA, name="qwen3.5", norm="gemma",
                                       rope_concat=True, rope_per_sample=True),
    "Qwen3_5MoeForCausalLM": attrs.evolve(LLAMA, name="qwen3.5-moe", norm="gemma",
                                          rope_concat=True, rope_per_sample=True),
    "Ministral3ForCausalLM": attrs.evolve(LLAMA, name="ministral3", query_scale=True),
    "SmolLM3ForCausalLM": attrs.evolve(LLAMA, name="smollm3"),
    "Llama4ForCausalLM": attrs.evolve(LLAMA, name="llama4", softmax_fp32=False,
                                      rope_complex=True, nope_layers=True,
                                      experts_every_copy=True),
    "GptOssForCausalLM": attrs.evolve(LLAMA, name="gpt-oss", norm="olmo2", softmax_fp32=False,
                                      router="topk-softmax-cast",
                                      norm_topk=False, attention_sinks=True, sdpa=False,
                                      clamped_swiglu=True, rope_half=True),
    "Ernie4_5_MoeForCausalLM": attrs.evolve(LLAMA, name="ernie4.5-moe", router="softmax-clamp",
                                            rope_per_layer_fp32=True),
    "Glm4MoeForCausalLM": attrs.evolve(LLAMA, name="glm4-moe", router="deepseek",
                                       rope_concat=True),
    "MiniMaxM2ForCausalLM": attrs.evolve(LLAMA, name="minimax-m2", router="sigmoid",
                                         rope_concat=True),
    "GPT2LMHeadModel": Family(name="gpt2", norm="layernorm", fused_qkv=True, rope=False,
                              softmax_fp32=False, gelu_formula=True, residual_dropout=True),
    "BertForMaskedLM": Family(name="bert", norm="layernorm", rope=False, softmax_fp32=False,
                              residual_dropout=True, causal_lm=False, loss_upcast=False),
})
"""By transformers class, the names llmpar.hf writes into a model's source."""

CLASS_IN_SOURCE = re.compile(r"transformers' (\w+)")


def family_of(model: Model) -> Family:
    """The family named by the model's source, else the one its fields describe."""
    named = CLASS_IN_SOURCE.search(model.source or "")
    if named and named.group(1) in FAMILIES:
        return FAMILIES[named.group(1)]
    if model.norm_placement == "post" and model.embedding_norm:
        return FAMILIES["BertForMaskedLM"]
    if model.position_embedding == "learned" and model.norm == "layernorm":
        return FAMILIES["GPT2LMHeadModel"]
    if model.norm_placement == "sandwich":
        return FAMILIES["Gemma2ForCausalLM"]
    if model.norm_placement == "post":
        return FAMILIES["Olmo2ForCausalLM"]
    if model.sparse_attention is not None:
        return FAMILIES["DeepseekV32ForCausalLM"]
    if model.mla is not None:
        return FAMILIES["DeepseekV3ForCausalLM"]
    if model.moe is not None:
        return FAMILIES["Qwen3MoeForCausalLM"]
    return LLAMA
