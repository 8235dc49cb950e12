"""The model: an architecture, or only a parameter count for quick estimates."""

from __future__ import annotations

import math

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import Count

FFN_ACTIVATIONS = ("gelu", "relu", "relu2", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")
NORM_PLACEMENTS = ("pre", "post", "sandwich")
QK_NORM_SCOPES = ("head", "projection")
MIXERS = {"A": "attention", "L": "linear_attention", "M": "mamba", "P": "attention+mamba",
          "-": "none", "E": "none"}
"""The letters of `Model.mixer_pattern`: the token mixer each layer has. "P" is attention and
Mamba-2 side by side on the same input, their outputs summed (Falcon-H1's parallel hybrid
layer, FalconH1DecoderLayer in transformers 5.24). "-" is a layer without a token mixer: its
MLP alone, behind one norm (Nemotron-H's "-" block, NemotronHBlock in transformers 5.24).
"E" is a layer of the experts alone (`[model.moe]`), behind one norm (Nemotron-H's "E" block,
NemotronHMoE in transformers 5.24)."""
EXPERTS_ALONE = "E"
"""The letter of a layer that is its experts alone: with it in `Model.mixer_pattern` the
pattern places the MoE layers, not `MoE.dense_layers` and `MoE.layer_frequency`."""
MLP_ALONE = ("-", EXPERTS_ALONE)
"""The letters of a layer that is an MLP (dense or experts) alone, without a token mixer."""
ALONE = {"a": "A", "l": "L", "m": "M"}
"""Lower-case letters of `Model.mixer_pattern`: a layer that is its token mixer alone, behind
one norm and without an MLP (Nemotron-H's "M" and "*" blocks, NemotronHBlock in transformers
5.24: a block is one norm, one module and its residual)."""
PATTERN_LETTERS = "".join(MIXERS) + "".join(ALONE)
NO_MIXER = "none"
"""The token mixer of a layer that is an MLP alone."""
NO_MLP = "none"
"""The MLP kind (beside "dense" and "moe") of a layer that is its token mixer alone."""


def mixer_parts(mixer: str) -> tuple[str, ...]:
    """The token mixers of one layer kind (`Model.mixer_of`): ("attention", "mamba") for a
    parallel hybrid layer, none for an MLP alone, else the one mixer."""
    return () if mixer == NO_MIXER else tuple(mixer.split("+"))


def _letter_mixer(letter: str) -> str:
    return MIXERS[ALONE.get(letter, letter)]

ARCHITECTURE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "vocab_size",
)
"""The fields without which a model is only a size (`Model.architecture_fields`: a model
without attention layers needs no num_attention_heads, one without MLP layers no
ffn_hidden_size)."""


@attrs.frozen(kw_only=True)
class MoE:
    """`[model.moe]`: a mixture of experts in place of some layers' MLP.

    Layer i (from 0) is an MoE layer when i >= dense_layers and (i + 1) is a
    multiple of layer_frequency (Hugging Face's `decoder_sparse_step` convention;
    DeepSeek's `first_k_dense_replace` is `dense_layers`). At least one layer must have
    experts: a table that leaves none is an error, not a dense model.
    """

    num_experts: int = attrs.field(validator=v.positive)
    """Routed experts per MoE layer."""
    experts_per_token: int = attrs.field(validator=v.positive)
    """Routed experts each token goes to (top-k); at most num_experts."""
    expert_ffn_hidden_size: int = attrs.field(validator=v.positive)
    """Inner width of one expert's MLP."""
    num_shared_experts: int = attrs.field(default=0, validator=v.non_negative)
    """Experts every token goes to (DeepSeek, Qwen2-MoE)."""
    shared_expert_ffn_hidden_size: int | None = attrs.field(
        default=attrs.Factory(lambda self: self.expert_ffn_hidden_size, takes_self=True),
        validator=v.positive)
    """Inner width of one shared expert. Default: expert_ffn_hidden_size."""
    dense_layers: int = attrs.field(default=0, validator=v.non_negative)
    """The first layers keep a dense MLP of ffn_hidden_size; fewer than num_layers."""
    layer_frequency: int = attrs.field(default=1, validator=v.positive)
    """Every layer_frequency-th layer (after dense_layers) is an MoE layer; at most
    num_layers."""
    capacity_factor: float | None = attrs.field(default=None, validator=v.positive)
    """Token capacity per expert, as a multiple of the balanced share; None: no dropping."""
    router_bias: bool = False
    """A per-expert bias in the router (parameters: num_experts per MoE layer)."""
    shared_expert_gate: bool = False
    """A sigmoid gate on the shared expert's output (Qwen2-MoE: hidden_size weights)."""


@attrs.frozen(kw_only=True)
class MLA:
    """`[model.mla]`: multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2).

    Queries go through a low-rank bottleneck of q_lora_rank (or one full-rank
    projection when it is None); keys and values share a latent of kv_lora_rank,
    up-projected per head to qk_nope_head_dim (keys) and v_head_dim (values); a
    decoupled key of qk_rope_head_dim carries RoPE and is shared by all heads.
    Each latent has an RMSNorm (q_a_layernorm, kv_a_layernorm in Hugging Face's
    DeepseekV3Attention).
    """

    q_lora_rank: int | None = attrs.field(default=None, validator=v.positive)
    """Width of the query latent; None: a full-rank query projection (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = attrs.field(validator=v.positive)
    """Width of the compressed key/value latent."""
    qk_nope_head_dim: int = attrs.field(validator=v.positive)
    """Per-head query/key width without position encoding."""
    qk_rope_head_dim: int = attrs.field(validator=v.positive)
    """Per-head query/key width that carries RoPE (the key part is shared by all heads)."""
    v_head_dim: int = attrs.field(validator=v.positive)
    """Per-head value width."""

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@attrs.frozen(kw_only=True)
class LinearAttention:
    """`[model.linear_attention]`: gated DeltaNet layers (Yang, Kautz and Hatamizadeh 2024,
    "Gated Delta Networks", arXiv:2412.06464, Eq. 10), as Qwen3-Next builds them
    (transformers' Qwen3NextGatedDeltaNet): one projection of the hidden state to queries,
    keys, values and the output gate z, one to the per-head write strength beta and decay
    a; a depthwise causal convolution over queries, keys and values; a per-value-head
    state of key_head_dim x value_head_dim in place of a KV cache; a gated RMSNorm of
    value_head_dim and the output projection. Query/key heads serve
    num_value_heads / num_key_heads value heads each."""

    num_key_heads: int = attrs.field(validator=v.positive)
    """Query and key heads (linear_num_key_heads)."""
    num_value_heads: int = attrs.field(validator=v.positive)
    """Value heads, each with its own state (linear_num_value_heads); a multiple of
    num_key_heads."""
    key_head_dim: int = attrs.field(validator=v.positive)
    """Width of one query and key head (linear_key_head_dim)."""
    value_head_dim: int = attrs.field(validator=v.positive)
    """Width of one value head (linear_value_head_dim)."""
    conv_kernel_size: int = attrs.field(default=4, validator=v.positive)
    """Taps of the depthwise causal convolution (linear_conv_kernel_dim)."""
    chunk_size: int = attrs.field(default=64, validator=v.positive)
    """Tokens per chunk of the chunked delta rule (transformers' and flash-linear-
    attention's chunk_gated_delta_rule: 64); sets its FLOPs, not its parameters."""

    @property
    def key_width(self) -> int:
        """num_key_heads x key_head_dim: the width of the queries and of the keys."""
        return self.num_key_heads * self.key_head_dim

    @property
    def value_width(self) -> int:
        """num_value_heads x value_head_dim: the width of the values and of z."""
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: queries, keys and values."""
        return 2 * self.key_width + self.value_width


@attrs.frozen(kw_only=True)
class Mamba:
    """`[model.mamba]`: Mamba-2 layers (Dao and Gu 2024, "Transformers are SSMs",
    arXiv:2405.21060, Sec. 7 and Fig. 6), as transformers' Mamba2Mixer and its copies
    (GraniteMoeHybridMambaLayer, NemotronHMamba2Mixer) build them: one input projection
    to the gate z, the convolved x, B and C (num_groups x state_size each) and one dt per
    head; a depthwise causal convolution over x, B and C; per-head dt_bias, A_log and D; a
    gated RMSNorm of the inner width and the output projection. Each head keeps a state of
    head_dim x state_size in place of a KV cache."""

    num_heads: int = attrs.field(validator=v.positive)
    """SSM heads (mamba_n_heads)."""
    head_dim: int = attrs.field(validator=v.positive)
    """Channels per head (mamba_d_head); num_heads x head_dim is the inner width."""
    state_size: int = attrs.field(validator=v.positive)
    """State channels N per group (mamba_d_state, ssm_state_size)."""
    num_groups: int = attrs.field(default=1, validator=v.positive)
    """Groups of heads sharing B and C (mamba_n_groups); divides num_heads."""
    conv_kernel_size: int = attrs.field(default=4, validator=v.positive)
    """Taps of the depthwise causal convolution (mamba_d_conv)."""
    conv_bias: bool = True
    """A bias on the convolution (mamba_conv_bias)."""
    projection_bias: bool = False
    """Biases on the input and output projections (mamba_proj_bias)."""
    chunk_size: int = attrs.field(default=256, validator=v.positive)
    """Tokens per chunk of the SSD algorithm (mamba_chunk_size); sets its FLOPs."""
    gated_norm: bool = True
    """The gated RMSNorm of inner_width before the output projection (Falcon-H1's
    mamba_rms_norm; without it the scan's output is gated by silu(z) alone)."""

    @property
    def inner_width(self) -> int:
        """num_heads x head_dim (Mamba-2's d_inner = expand x hidden_size)."""
        return self.num_heads * self.head_dim

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.inner_width + 2 * self.num_groups * self.state_size


@attrs.frozen(kw_only=True)
class SparseAttention:
    """`[model.sparse_attention]`: DeepSeek sparse attention (DeepSeek-AI 2025,
    DeepSeek-V3.2-Exp technical report, Sec. 2.1): a lightning indexer scores every earlier
    token for each query with a few small heads, and MLA attends only to the top_k tokens
    it picks. The indexer (transformers' DeepseekV32Indexer) projects the query latent to
    index_heads heads of index_head_dim (wq_b), the hidden state to one shared key
    (wk, with a LayerNorm) and to one weight per head (weights_proj); its key is cached
    per token beside MLA's latent. Needs [model.mla] with a q_lora_rank."""

    index_heads: int = attrs.field(default=64, validator=v.positive)
    """Heads of the indexer (index_n_heads)."""
    index_head_dim: int = attrs.field(default=128, validator=v.positive)
    """Width of an indexer head and of its key (index_head_dim)."""
    top_k: int = attrs.field(default=2048, validator=v.positive)
    """Tokens each query attends to (index_topk); all of them up to this many."""


def _default_kv_heads(model: Model) -> int | None:
    return model.num_attention_heads


def _default_head_dim(model: Model) -> int | None:
    if model.mla is not None:
        return model.mla.qk_head_dim
    hidden, heads = model.hidden_size, model.num_attention_heads
    if hidden is None or not heads:
        return None
    if hidden % heads:
        # Flooring would silently give heads x head_dim != hidden_size; only the spec
        # knows which width is meant.
        raise v.FieldError("hidden_size", f"hidden_size ({hidden}) is not divisible by "
                                          f"num_attention_heads ({heads}): give head_dim")
    return hidden // heads


@attrs.frozen(kw_only=True, cache_hash=True)
class Model:
    """A decoder (or encoder) transformer.

    Give the architecture fields for exact parameter, FLOP and activation counts,
    or only `parameters` (optionally with `num_layers` and `hidden_size`) for the
    founding document's back-of-the-envelope estimates.
    """

    name: str = "custom"
    """Preset name or a label for reports."""
    source: str = ""
    """Where the numbers come from (config.json, paper)."""
    parameters: Count | None = attrs.field(default=None, validator=v.positive)
    """Total parameter count, for a model given only by its size."""
    num_layers: int | None = attrs.field(default=None, validator=v.positive)
    """Transformer blocks (L)."""
    hidden_size: int | None = attrs.field(default=None, validator=v.positive)
    """Width of the residual stream (h)."""
    num_attention_heads: int | None = attrs.field(default=None, validator=v.positive)
    """Query heads (a)."""
    num_kv_heads: int | None = attrs.field(
        default=attrs.Factory(_default_kv_heads, takes_self=True), validator=v.positive
    )
    """Key/value heads; fewer than query heads is GQA, one is MQA. Default: a."""
    mla: MLA | None = None
    """Multi-head latent attention in place of Q/K/V projections; None: standard attention."""
    head_dim: int | None = attrs.field(
        default=attrs.Factory(_default_head_dim, takes_self=True), validator=v.positive
    )
    """Width of one head. Default: hidden_size / num_attention_heads, which must divide
    evenly (MLA: the query/key head width, qk_nope_head_dim + qk_rope_head_dim; the counts
    use [model.mla]). Given, it wins: heads x head_dim may differ from hidden_size (Gemma)."""
    ffn_hidden_size: int | None = attrs.field(default=None, validator=v.positive)
    """Inner width of the MLP."""
    ffn_activation: str = attrs.field(default="gelu", validator=v.one_of(*FFN_ACTIVATIONS))
    """gelu/relu/relu2: two matrices; swiglu/geglu: three (gate, up, down). relu2 is the
    squared ReLU (So et al. 2021, Primer, arXiv:2109.08668; Nemotron-H's relu2)."""
    vocab_size: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens in the vocabulary (V)."""
    tie_embeddings: bool = False
    """The output layer reuses the input embedding matrix."""
    norm: str = attrs.field(default="layernorm", validator=v.one_of(*NORMS))
    """layernorm has a weight and a bias per channel, rmsnorm only a weight."""
    norm_placement: str = attrs.field(default="pre", validator=v.one_of(*NORM_PLACEMENTS))
    """Norms of a block: "pre" (before attention and MLP: Llama, GPT-2) and "post" (after
    them: BERT, OLMo 2) have two; "sandwich" (before and after each: Gemma 2/3) has four."""
    position_embedding: str = attrs.field(
        default="rope", validator=v.one_of(*POSITION_EMBEDDINGS)
    )
    """rope, alibi and none add no parameters; learned adds a table of positions."""
    rotary_fraction: float = attrs.field(default=1.0, validator=v.fraction)
    """The share of each query and key head that RoPE rotates, the rest passing
    unrotated (transformers' partial_rotary_factor: Phi-4-mini 0.75, GLM-4.5 and
    MiniMax-M2 0.5, Qwen3-Next and Qwen3.5 0.25): RoPE's cos and sin are
    int(head_dim x rotary_fraction) wide (`rotary_dim`, as transformers'
    compute_default_rope_parameters). No parameter, FLOP or cache count changes; the hf
    inventories keep cos and sin at that width. 1: the whole head; only with
    position_embedding = "rope" and without [model.mla] (MLA rotates its
    qk_rope_head_dim)."""
    max_position_embeddings: int | None = attrs.field(default=None, validator=v.positive)
    """Longest sequence; the size of a learned position table. A trained or served
    sequence past it is an error with learned positions, else a warning in the plan
    (long-context extension: RoPE scaling runs past it, untrained)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2). MLA: on the query and
    key/value down-projections (q_a_proj, kv_a_proj_with_mqa), as DeepSeek's attention_bias."""
    attention_output_bias: bool = False
    """A bias on the attention output projection (Llama's attention_bias sets it with
    qkv_bias); implied by linear_bias."""
    mlp_bias: bool = False
    """Biases on the MLP's (and experts') projections (Llama's mlp_bias); implied by
    linear_bias."""
    linear_bias: bool = False
    """Biases on every linear layer of the blocks (GPT-2, BERT)."""
    qk_norm: bool = False
    """A norm on queries and keys before Q.K^T (Qwen3, Gemma 3, OLMo 2); see qk_norm_scope."""
    qk_norm_scope: str = attrs.field(default="head", validator=v.one_of(*QK_NORM_SCOPES))
    """"head": one weight of head_dim shared by every head (Qwen3, Gemma 3); "projection":
    over the whole query and key projections, query_width and kv_width (OLMo 2)."""
    qk_l2_norm: bool = False
    """A weightless L2 norm of each query and key head after RoPE, on the layers that
    rotate (Llama 4 Scout's use_qk_norm; Maverick has none): no parameter, FLOP or cache
    count changes; the hf inventories keep its fp32 inputs and rsqrt."""
    sliding_window: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens a windowed layer attends to (Mistral, Gemma 2/3); None: full attention.
    No parameters; FLOPs keep the full s x s convention."""
    sliding_window_pattern: int | None = attrs.field(default=None, validator=v.positive)
    """With sliding_window: layer i (from 0) attends globally when (i + 1) is a multiple
    of it (Gemma 2: 2, Gemma 3: 6); None: every layer is windowed (Mistral)."""
    attention_sinks: bool = False
    """A learned logit per query head that joins every softmax as one more key without a
    value (gpt-oss, transformers' GptOssAttention.sinks; Xiao et al. 2023, arXiv:2309.17453):
    num_attention_heads parameters per layer, split with the heads; no cache, FLOPs of
    O(s) per head, not counted."""
    attention_logit_softcapping: float | None = attrs.field(default=None, validator=v.positive)
    """Attention scores become c * tanh(scores / c) (Gemma 2: 50). No parameters."""
    final_logit_softcapping: float | None = attrs.field(default=None, validator=v.positive)
    """Output logits become c * tanh(logits / c) (Gemma 2: 30). No parameters."""
    scale_embeddings: bool = False
    """Embeddings are multiplied by sqrt(hidden_size) (Gemma). No parameters."""
    type_vocab_size: int = attrs.field(default=0, validator=v.non_negative)
    """Segment (token type) embeddings, as in BERT."""
    embedding_norm: bool = False
    """A norm right after the embeddings, as in BERT."""
    final_norm: bool = True
    """A norm after the last block (pre-norm models); BERT's post-norm blocks have none."""
    pooler: bool = False
    """BERT's pooler: a hidden_size x hidden_size dense layer with bias on the first token."""
    mlm_head: bool = False
    """BERT's masked-LM head: a dense transform with bias and a norm before the output
    projection, and an output bias of vocab_size."""
    moe: MoE | None = None
    """Mixture of experts; None for a dense model."""
    attention_output_gate: bool = False
    """A sigmoid gate on the attention output, computed by a query projection twice as
    wide (Qwen3-Next's gated attention, attn_output_gate: q_proj of 2 x query_width)."""
    mixer_pattern: str | None = attrs.field(default=None, validator=v.optional_pattern(
        PATTERN_LETTERS))
    """The token mixer of each layer, one letter per layer, repeated from layer 0 until
    num_layers: "A" attention, "L" gated DeltaNet (`[model.linear_attention]`), "M" Mamba-2
    (`[model.mamba]`), "P" attention and Mamba-2 in parallel on the same input, their
    outputs summed (Falcon-H1); its length divides num_layers. Each of these layers has an
    MLP after its mixer. Single-module layers (Nemotron-H, Mamba-2 alone): "a", "l", "m" are
    the mixer alone, without an MLP, "-" is a dense MLP alone and "E" the experts alone
    (`[model.moe]`; the "E" layers are the MoE layers), without a mixer; each has one
    norm. Qwen3-Next: "LLLA", Falcon-H1: "P", Nemotron-H-8B: "m-m-m-ma-..." (its
    hybrid_override_pattern, "*" read as "a"), Nemotron 3 Nano: "mEmEmaE...", Mamba-2: "m";
    None: every layer attends. A model mixes attention with at most one recurrent kind; a
    model without attention layers needs no num_attention_heads, one without MLP layers no
    ffn_hidden_size."""
    linear_attention: LinearAttention | None = None
    """The gated DeltaNet layers' sizes, with "L" layers in mixer_pattern."""
    mamba: Mamba | None = None
    """The Mamba-2 layers' sizes, with "M" layers in mixer_pattern."""
    sparse_attention: SparseAttention | None = None
    """DeepSeek sparse attention on every attention layer (DeepSeek-V3.2); None: dense."""
    mtp_layers: int = attrs.field(default=0, validator=v.non_negative)
    """Multi-token-prediction modules the checkpoint holds after the num_layers blocks
    (DeepSeek-V3, GLM-4.5: num_nextn_predict_layers; Qwen3-Next, Qwen3.5:
    mtp_num_hidden_layers). Each depth (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 2.2) is one
    block of the kind of the model's last layer, two RMSNorms (of the embedding and of the
    previous depth's hidden state: enorm, hnorm), the projection M of the two concatenated
    (2h x h, eh_proj) and a norm before the output head (shared_head.norm); the embedding
    and output head are the main model's. Not in the main model's parameter count (671B
    for DeepSeek-V3) nor trained unless `[training] multi_token_prediction`; counted in the
    checkpoint (685B). 0: none."""
    mtp_table_copies: bool = False
    """The checkpoint stores a copy of the embedding and of the output head with each
    multi-token-prediction module (DeepSeek-V3's model.layers.61.embed_tokens and
    shared_head.head, README_WEIGHTS.md of deepseek-ai/DeepSeek-V3: "shares parameters"
    with the main model's, stored again): counted in the checkpoint's size, neither
    trained nor held twice."""

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (from 0) has experts instead of a dense MLP: an "E" layer
        of mixer_pattern when it has them, else by dense_layers and layer_frequency."""
        moe, pattern = self.moe, self.mixer_pattern
        if moe is None or not self.has_mlp(index):
            return False
        if self.experts_placed:
            assert pattern is not None
            return pattern[index % len(pattern)] == EXPERTS_ALONE
        return index >= moe.dense_layers and (index + 1) % moe.layer_frequency == 0

    @property
    def experts_placed(self) -> bool:
        """Whether mixer_pattern places the MoE layers (its "E" letters)."""
        return self.mixer_pattern is not None and EXPERTS_ALONE in self.mixer_pattern

    def has_mlp(self, index: int) -> bool:
        """Whether layer `index` (from 0) has an MLP (dense or experts): every layer but
        a token mixer alone (a lower-case letter of mixer_pattern)."""
        pattern = self.mixer_pattern
        return pattern is None or pattern[index % len(pattern)] not in ALONE

    @property
    def single_module_layers(self) -> bool:
        """Whether some layer is one module alone: a token mixer without an MLP or an MLP
        without a mixer (mixer_pattern's lower-case letters and "-")."""
        pattern = self.mixer_pattern
        return pattern is not None and bool(set(pattern) & {*ALONE, *MLP_ALONE})

    @property
    def layer_kinds_vary(self) -> bool:
        """Whether layers differ in more than their MLP and window: recurrent mixers or
        single-module layers; their layers are grouped by `hybrid_kinds_in`."""
        return self.recurrent_mixer is not None or self.single_module_layers

    def mlp_layers_in(self, first: int, count: int) -> int:
        """Layers with an MLP (dense or experts) among `count` layers from `first`, in
        closed form over the repeated pattern."""
        count = max(count, 0)
        pattern = self.mixer_pattern
        if pattern is None or not self.single_module_layers:
            return count
        return count - sum(number for letter, number in _letters_in(pattern, first, count)
                           if letter in ALONE)

    def norms_in(self, first: int, count: int) -> int:
        """Block norm sets among `count` layers from `first`, in halves of a two-module
        block: a layer of a mixer and an MLP counts 2, a single-module layer 1 (one norm
        before its one module: NemotronHBlock)."""
        count = max(count, 0)
        if not self.single_module_layers:
            return 2 * count
        assert self.mixer_pattern is not None
        return sum(number * (1 if letter in ALONE or letter in MLP_ALONE else 2)
                   for letter, number in _letters_in(self.mixer_pattern, first, count))

    def moe_layers_in(self, first: int, count: int) -> int:
        """Layers with experts among `count` layers from `first`, in closed form: the
        pattern's "E" layers when it has them, else the layers i >= dense_layers with
        (i + 1) a multiple of layer_frequency (the checks refuse experts beside other
        single-module layers without "E")."""
        moe = self.moe
        if moe is None or count <= 0:
            return 0
        if self.experts_placed:
            assert self.mixer_pattern is not None
            return sum(number for letter, number in _letters_in(self.mixer_pattern, first,
                                                                 count)
                       if letter == EXPERTS_ALONE)
        low, end = max(first, moe.dense_layers), first + count
        if end <= low:
            return 0
        return end // moe.layer_frequency - low // moe.layer_frequency

    def layer_kinds_in(self, first: int, count: int) -> dict[tuple[bool, bool], int]:
        """How many of `count` layers from `first` are of each kind (has experts, attends
        within a sliding window), in closed form: both are periodic in the layer index,
        so the kinds are counted by inclusion-exclusion over the multiples of the two
        periods (and of their least common multiple), never by visiting every layer."""
        count = max(count, 0)
        moe = self.moe_layers_in(first, count)
        pattern = self.sliding_window_pattern
        if self.sliding_window is None:
            return _kept({(True, False): moe, (False, False): count - moe})
        if pattern is None:
            return _kept({(True, True): moe, (False, True): count - moe})
        full = _multiples_in(first, count, pattern)  # global-attention layers
        both = 0 if self.moe is None else _multiples_in(
            max(first, self.moe.dense_layers), first + count - max(first, self.moe.dense_layers),
            math.lcm(pattern, self.moe.layer_frequency))
        return _kept({(True, False): both, (True, True): moe - both,
                      (False, False): full - both,
                      (False, True): count - moe - full + both})

    def mixers_in(self, first: int, count: int) -> dict[str, int]:
        """How many of `count` layers from `first` have each token mixer ("attention",
        "linear_attention", "mamba"), in closed form over the repeated pattern; a parallel
        hybrid layer ("P") counts under both of its mixers."""
        count = max(count, 0)
        pattern = self.mixer_pattern
        if pattern is None:
            return {"attention": count} if count else {}
        found: dict[str, int] = {}
        for letter, number in _letters_in(pattern, first, count):
            for kind in mixer_parts(_letter_mixer(letter)):
                found[kind] = found.get(kind, 0) + number
        return found

    def mixer_of(self, index: int) -> str:
        """The token mixer of layer `index` (from 0); "attention+mamba" for a parallel
        hybrid layer (`mixer_parts` splits it), "none" for an MLP alone."""
        if self.mixer_pattern is None:
            return "attention"
        return _letter_mixer(self.mixer_pattern[index % len(self.mixer_pattern)])

    def hybrid_kinds_in(self, first: int, count: int) -> dict[str, int]:
        """A hybrid model's layers among `count` from `first` by kind: the MLP ("dense",
        "moe", or "none" for a mixer alone) and the token mixer ("none" for an MLP alone),
        as "moe linear_attention", one visit per layer (used only for models whose
        `layer_kinds_vary`)."""
        found: dict[str, int] = {}
        for index in range(first, first + max(count, 0)):
            block = ("moe" if self.is_moe_layer(index) else "dense") if self.has_mlp(
                index) else NO_MLP
            kind = f"{block} {self.mixer_of(index)}"
            found[kind] = found.get(kind, 0) + 1
        return found

    @property
    def num_attention_layers(self) -> int:
        """Layers whose token mixer is attention (all of them without mixer_pattern)."""
        layers = self.num_layers or 0
        if self.mixer_pattern is None:
            return layers
        return self.mixers_in(0, layers).get("attention", 0)

    @property
    def recurrent_mixer(self) -> str | None:
        """The recurrent kind of the layers that are not attention ("linear_attention",
        "mamba"), None when every layer attends."""
        pattern = self.mixer_pattern
        if pattern is None:
            return None
        kinds = sorted({kind for letter in set(pattern)
                        for kind in mixer_parts(_letter_mixer(letter)) if kind != "attention"})
        return kinds[0] if kinds else None

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts."""
        return self.moe_layers_in(0, self.num_layers or 0)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP (not a token mixer alone, not experts)."""
        return self.mlp_layers_in(0, self.num_layers or 0) - self.num_moe_layers

    @property
    def architecture_fields(self) -> tuple[str, ...]:
        """The ARCHITECTURE_FIELDS this model needs: num_attention_heads only when some
        layer attends, ffn_hidden_size only when some layer has an MLP (a Mamba-2 model,
        Mamba2ForCausalLM, has neither)."""
        layers, pattern = self.num_layers, self.mixer_pattern
        if pattern is None or layers is None:
            return ARCHITECTURE_FIELDS
        unneeded = set()
        if not self.mixers_in(0, layers).get("attention"):
            unneeded.add("num_attention_heads")
        if not self.mlp_layers_in(0, layers):
            unneeded.add("ffn_hidden_size")
        return tuple(name for name in ARCHITECTURE_FIELDS if name not in unneeded)

    @property
    def has_architecture(self) -> bool:
        """True when every architecture field it needs is set (exact counts possible)."""
        return all(getattr(self, name) is not None for name in self.architecture_fields)

    @property
    def gated(self) -> bool:
        """A gated MLP (three matrices)."""
        return self.ffn_activation in GATED_ACTIVATIONS

    def is_sliding_window_layer(self, index: int) -> bool:
        """Whether layer `index` (from 0) attends only within sliding_window tokens."""
        if self.sliding_window is None:
            return False
        pattern = self.sliding_window_pattern
        return pattern is None or (index + 1) % pattern != 0

    @property
    def attends(self) -> bool:
        """Whether the model has attention heads: a model whose layers never attend (a
        Mamba-2 model) may leave num_attention_heads out, and its attention widths are 0."""
        return self.num_attention_heads is not None

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: head_dim (MLA: qk_nope + qk_rope); 0 without
        attention heads."""
        if not self.attends:
            return 0
        assert self.head_dim is not None
        return self.mla.qk_head_dim if self.mla is not None else self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Channels of a query or key head that RoPE rotates: int(head_dim x
        rotary_fraction), as transformers' compute_default_rope_parameters takes them
        (modeling_rope_utils.py, 5.24.0); MLA: qk_rope_head_dim; 0 without attention heads."""
        if not self.attends:
            return 0
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        assert self.head_dim is not None
        return int(self.head_dim * self.rotary_fraction)

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: head_dim (MLA: v_head_dim); 0 without attention heads."""
        if not self.attends:
            return 0
        assert self.head_dim is not None
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def query_width(self) -> int:
        """num_attention_heads * qk_head_dim: the width of Q (0 without attention heads)."""
        if not self.attends:
            return 0
        assert self.num_attention_heads is not None
        return self.num_attention_heads * self.qk_head_dim

    @property
    def kv_width(self) -> int:
        """The width of K: num_kv_heads * head_dim, also the width of V outside MLA.

        MLA: num_attention_heads * qk_head_dim, the keys as Hugging Face's attention
        materializes them from the latent (every head has its own key); values are
        value_width wide, and the KV cache holds latent_kv_width per token.
        """
        if self.mla is not None or not self.attends:
            return self.query_width
        assert self.num_kv_heads is not None and self.head_dim is not None
        return self.num_kv_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """The width of V: kv_width (MLA: num_attention_heads * v_head_dim)."""
        if self.mla is None:
            return self.kv_width
        assert self.num_attention_heads is not None
        return self.num_attention_heads * self.mla.v_head_dim

    @property
    def attention_output_width(self) -> int:
        """The input width of the attention output projection: heads x value head width."""
        if not self.attends:
            return 0
        assert self.num_attention_heads is not None
        return self.num_attention_heads * self.value_head_dim

    @property
    def latent_kv_width(self) -> int | None:
        """MLA: kv_lora_rank + qk_rope_head_dim, what one token keeps per layer in a KV
        cache (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2); None without MLA."""
        if self.mla is None:
            return None
        return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim


def _letters_in(pattern: str, first: int, count: int) -> list[tuple[str, int]]:
    """How often each position's letter of a pattern repeated from layer 0 falls among
    `count` layers from `first`, in closed form (one term per position)."""
    period = len(pattern)
    rounds, rest = divmod(max(count, 0), period)
    found = []
    for offset, letter in enumerate(pattern):
        number = rounds + ((offset - first) % period < rest)  # its first position in range
        if number:
            found.append((letter, number))
    return found


def _multiples_in(first: int, count: int, period: int) -> int:
    """Indices i in [first, first + count) with (i + 1) a multiple of `period`."""
    if count <= 0:
        return 0
    return (first + count) // period - first // period


def _kept(counts: dict[tuple[bool, bool], int]) -> dict[tuple[bool, bool], int]:
    return {kind: number for kind, number in counts.items() if number > 0}
