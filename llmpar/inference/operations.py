"""The operations of one forward step on one GPU, layer by layer, each with its FLOPs and
the bytes it moves to and from HBM (summed along the pipeline: one GPU per stage).

FLOPs: 2 per multiply-accumulate (as `llmpar.footprint.flops`), split as tensor
parallelism splits the weights. Bytes: each weight read once per step, the KV cache read by
attention, activations read and written once per operation. Per layer:
- attention projections: Q, K, V and output (MLA: its down, up and output projections);
- attention: Q.K^T and scores.V over the (query, key) pairs the causal mask and the
  window leave; FlashAttention reads K and V once per tile of FUSED_ATTENTION_TILE_TOKENS queries
  (Dao 2023, FlashAttention-2, arXiv:2307.08691, Sec. 3.1); decode reads each sequence's
  cache once for all the query heads sharing it. A serving engine's attention kernel
  (`llmpar.inference.engine.attention_kernel`) sets its shares of bandwidth and peak and a
  fixed time per call. MLA decode attends in the latent space
  with the up-projections absorbed into the query and output (DeepSeek-V2,
  arXiv:2405.04434, Sec. 2.1.2): 2 x (kv_lora_rank + qk_rope_head_dim + kv_lora_rank)
  FLOPs per head and pair, against 2 x (qk_head_dim + v_head_dim) unabsorbed; its query
  and output live in the latent space too (`absorbed_widths`): the key up-projection
  writes each head's kv_lora_rank-wide query, the kernel reads it with its rope part and
  writes a kv_lora_rank-wide output per head, which the value up-projection reads, in
  place of the unabsorbed keys, values and head-wide query and output;
- MLP, or router + routed experts + shared experts: tokens routed evenly, so each expert
  rank multiplies k x its tokens; a step reads only the experts some token picked, in
  expectation E_local x (1 - (1 - k/E)^N) for N tokens across the expert group under
  uniform routing (the balance auxiliary losses aim for; Fedus et al. 2021, Switch
  Transformer, arXiv:2101.03961, Sec. 2.2);
- recurrent layers (gated DeltaNet, Mamba-2): their projections, split by heads, and their
  scan: the chunked products over a prefill's tokens, one state step per decoded token,
  each sequence's fixed-size state read and written once (`recurrent_scan`);
- with an engine's FP8 block-scaled product kernel (`llmpar.inference.engine.gemm_kernel`),
  the projections, MLPs and experts in its format take its fixed time per call (a layer's
  projections as DeepSeek-V3 runs them: the query and key/value down projections fused,
  the query and key/value up projections, the output: 4 calls with MLA, 2 without; an
  MLP's or experts' gate-up and down: 2) and its shares of bandwidth and peak for the rows
  of each call (the step's tokens; a routed expert's tokens) and the depths of its
  matrices;
- norms and residual adds: vLLM's fused add-RMSNorm reads the input and the residual and
  writes both, 4 passes of h per token, twice a layer;
- with an engine's small elementwise kernels measured (`[elementwise_kernels]`,
  `llmpar.inference.elementwise.per_kernel`), the elementwise operations above, the
  router's top-k and MLA decode's own small kernels take their fixed time per kernel
  beside their bytes at the kernels' bandwidth share.
Outside the layers: the embedding rows looked up, and the output layer for sampled rows.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.footprint.flops import (
    FUSED_ATTENTION_TILE_TOKENS,
    mixer_matmul_weights,
    mlp_matmul_weights,
    recurrent_mixer_flops_per_token,
)
from llmpar.footprint.parameters import attention_matmul_weights, indexer_matmul_weights
from llmpar.inference.elementwise import (
    EXCHANGE_KERNELS,
    activation,
    elementwise_kernel,
    exchange_passes,
    latent_decode,
    per_kernel,
    permutation,
    product_io_passes,
    quantization,
    received_tokens,
    separate_activation,
    separate_permutation,
    separate_quantization,
)
from llmpar.inference.engine import (
    attention_kernel,
    gemm_compute_efficiency,
    gemm_depth_factor,
    gemm_kernel,
    kernel_compute_efficiency,
    weight_efficiency,
)
from llmpar.inference.formats import bytes_per_parameter, format_matmul_dtype
from llmpar.inference.kv_cache import kv_bytes_per_token, state_elements_per_sequence
from llmpar.inference.serving import Serving
from llmpar.inference.weights import weight_bytes_by_group
from llmpar.inference.workspace import attention_width, mlp_width
from llmpar.roofline import Operation
from llmpar.spec import Model
from llmpar.spec.inference import (
    QUANTIZED_FORMATS,
    AttentionKernel,
    ElementwiseKernel,
    GemmKernel,
)
from llmpar.spec.model import NO_MIXER, mixer_parts
from llmpar.strategies.common import expert_tensor_degree
from llmpar.strategies.tensor import attention_divisor, mamba_divisor

NORM_PASSES = 8
"""Passes of h per token and layer over norms and residual adds (2 fused add-norms x 4)."""


@attrs.frozen(kw_only=True)
class Step:
    """One forward step of a phase, on one GPU."""

    tokens: float
    """New tokens this GPU's projections process."""
    rows: float
    """Sequences whose next token this step samples."""
    sequences: float
    """Sequences whose attention this step computes (per replica)."""
    queries: float
    """New tokens of each of those sequences."""
    prior: float
    """Tokens each of them held before the step."""
    phase: str = "prefill"
    """"prefill" or "decode" (MLA runs absorbed in decode)."""

    @property
    def absorbed(self) -> bool:
        return self.phase == "decode"


@attrs.frozen(kw_only=True)
class LayerKind:
    moe: bool
    window: int | None
    mixer: str = "attention"
    """The token mixer (`Model.mixer_of`): attention, a recurrent kind, or "none" (an MLP
    alone)."""
    mlp: bool = True
    """Whether the layer has an MLP (dense or experts); False for a token mixer alone."""


def causal_pairs(tokens: float, window: int | None) -> float:
    """(query, key) pairs of positions 1..tokens under a causal mask and a window:
    sum over i of min(i, window)."""
    if window is None or tokens <= window:
        return tokens * (tokens + 1) / 2
    return window * (window + 1) / 2 + (tokens - window) * window


def attention_pairs(step: Step, window: int | None, context: int) -> float:
    """Pairs one context rank computes in one layer: its share of every sequence's keys."""
    per_sequence = (causal_pairs(step.prior + step.queries, window)
                    - causal_pairs(step.prior, window))
    return step.sequences * per_sequence / context


def count_layer_kinds(serving: Serving) -> tuple[tuple[LayerKind, int], ...]:
    """How many layers of each kind (MoE or dense MLP, window) the model has."""
    model, inference = serving.spec.model, serving.inference
    honoured = inference.sliding_window is not False
    counts: Counter[LayerKind] = Counter()
    if model.mixer_pattern is not None:  # one visit per layer, once per serving spec
        for index in range(model.num_layers or 0):
            counts[LayerKind(moe=model.is_moe_layer(index), window=None,
                             mixer=model.mixer_of(index), mlp=model.has_mlp(index))] += 1
        return tuple(sorted(counts.items(), key=lambda item: repr(item[0])))
    for (moe, windowed), number in model.layer_kinds_in(0, model.num_layers or 0).items():
        window = model.sliding_window if windowed and honoured else None
        counts[LayerKind(moe=moe, window=window)] += number
    return tuple(sorted(counts.items(), key=lambda item: repr(item[0])))


def layer_kinds(serving: Serving) -> tuple[tuple[LayerKind, int], ...]:
    """The serving's layer kinds, counted once (`Serving.layer_counts`)."""
    return serving.layer_counts or count_layer_kinds(serving)


def weights_by_group(serving: Serving) -> dict[str, float]:
    """All weights on one GPU by group, computed once (`Serving.weights_by_group`)."""
    return dict(serving.weights_by_group) or weight_bytes_by_group(
        serving.spec, serving.footprint.parameters.by_group, list(serving.transforms))


def _per_layer(serving: Serving, group: str, layers: int) -> float:
    by_group = serving.weights_by_group or weights_by_group(serving)
    return by_group.get(group, 0.0) / max(1, layers)


@attrs.frozen(kw_only=True)
class OperationConstants:
    """What the operations of a step read whatever the step (its tokens, rows, sequences):
    formats, the engine's shares and kernels, weights per rank and per layer, widths per
    token. Computed once per serving spec (`Serving.constants`): every step of every
    search reads them, and none of them changes with the batch, the prompt or the chunk."""

    act_bytes: float
    """Bytes of one activation element."""
    matmul: str
    unquantized: str
    quantized_reads: float | None
    unquantized_reads: float | None
    projection_weights: float
    """One layer's attention matrices on one tensor rank."""
    projection_width: float
    """Elements per token the projections read and write: 2h and the attention block."""
    projection_bytes: float
    attention_width: float
    """Query and attention-output elements per token, all tensor ranks."""
    kv_bytes_per_token: float
    pair_flops: float
    absorbed_pair_flops: float
    prefill_kernel: AttentionKernel | None
    decode_kernel: AttentionKernel | None
    mlp_weights: float
    mlp_width: float
    mlp_bytes: float
    norm_module_bytes: float
    """One module's norm weights of a layer (half a block's; a single-module layer's own)."""
    lookup_bytes: float
    """Bytes per element of an embedding row looked up and written."""
    head_bytes: float
    """The output layer's weights on one GPU."""
    moe: MoeConstants | None
    gemm: GemmKernel | None = None
    """The engine's FP8 block-scaled product kernel for the blocks' weights; None: none."""
    projection_depth: float = 1.0
    """The depth share of the attention projections' products under `gemm`."""
    mlp_depth: float = 1.0
    """The depth share of a dense MLP's products under `gemm`."""
    activation: bool = False
    """Whether the MLPs' activation is an operation of its own (`separate_activation`)."""
    quantization: bool = False
    """Whether the block-FP8 products' inputs are quantized by an operation of their own
    (`separate_quantization`)."""
    projection_inputs: float = 0.0
    """Input elements per token of one layer's attention products (their depths)."""
    mlp_inner: float = 0.0
    """A dense MLP's intermediates per token on one tensor rank (`mlp_width`)."""
    mlp_down: float = 0.0
    """A dense MLP's down-projection input per token on one tensor rank."""
    permutation: bool = False
    """Whether a prefill's routed tokens are permuted by operations of their own
    (`separate_permutation`)."""
    absorbed_projection_width: float = 0.0
    """MLA decode: elements per token the projections read and write
    (`absorbed_widths`); 0: projection_width in every phase."""
    absorbed_attention_width: float = 0.0
    """MLA decode: the latent query and output elements per token the attention kernel
    reads and writes on one tensor rank (`absorbed_widths`); 0: attention_width / t."""
    absorbed_inputs: float = 0.0
    """MLA decode: input elements per token of one layer's products as they run absorbed
    (`absorbed_widths`: the key/value up-projection's latent input replaced by the
    absorbed products' non-rope query and latent output)."""
    elementwise: ElementwiseKernel | None = None
    """The engine's small elementwise kernels' law (`elementwise_kernel`); None: none."""


PROJECTION_CALLS_MLA = 4
"""Product calls of one layer's MLA projections: the fused query and key/value down
projections (DeepGEMM's N = 1536 + 576 = 2112 shape), the query up, the key/value up and
the output projection (DeepGEMM README, Performance: the DeepSeek-V3 shapes it lists)."""
PROJECTION_CALLS_MLA_ABSORBED = 5
"""Product calls of one layer's MLA projections in decode: the key/value up projection
runs as two absorbed products, the key part by the query and the value part by the
attention's output (SGLang 0.4.6, deepseek_v2.py forward_absorb: bmm or DeepGEMM's masked
grouped product by w_kc and by w_vc)."""
PROJECTION_CALLS = 2
"""Product calls of one layer's attention projections without MLA: fused QKV, output."""
MLP_CALLS = 2
"""Product calls of one MLP or one grouped expert product: gate and up fused, down."""


def projection_matrices(model: Model, tensor: int) -> list[tuple[float, float]]:
    """One layer's attention matrices as (weights, depth k), for their depth shares
    (`gemm_depth_factor`): the input projections of depth h (MLA's up projections of
    their latent ranks), the output projection of the heads' width on one tensor rank."""
    assert model.hidden_size is not None and model.num_attention_heads is not None
    h, a, mla = model.hidden_size, model.num_attention_heads, model.mla
    output = (float(model.attention_output_width * h), model.attention_output_width / tensor)
    if mla is None:
        return [(float(attention_matmul_weights(model)) - output[0], float(h)), output]
    down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + indexer_matmul_weights(model)
    up = [(float(mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)),
           float(mla.kv_lora_rank))]
    if mla.q_lora_rank is None:
        down += h * a * mla.qk_head_dim
    else:
        down += h * mla.q_lora_rank
        up.append((float(mla.q_lora_rank * a * mla.qk_head_dim), float(mla.q_lora_rank)))
    return [(float(down), float(h)), *up, output]


def mlp_matrices(model: Model, width: float, tensor: int) -> list[tuple[float, float]]:
    """One MLP's matrices of inner `width` on 1/tensor of it, as (weights, depth k): gate
    and up of depth h, down of depth width / tensor."""
    assert model.hidden_size is not None
    h, inner = model.hidden_size, width / tensor
    return [((2 if model.gated else 1) * h * inner, float(h)), (h * inner, inner)]


def product(name: str, flops: float, moved: float, dtype: str, kernel: GemmKernel | None,
            rows: float, depth: float, calls: int, reads: float | None) -> Operation:
    """A product operation: at the kernel's shares and fixed time for `rows` rows a call and
    `calls` calls, or at the weight-read share `reads` without one."""
    if kernel is None:
        return Operation(name=name, flops=flops, bytes=moved, dtype=dtype,
                         memory_efficiency=reads)
    return Operation(name=name, flops=flops, bytes=moved, dtype=dtype,
                     memory_efficiency=kernel.memory_efficiency,
                     matmul_efficiency=gemm_compute_efficiency(kernel, rows, depth),
                     fixed_seconds=calls * kernel.fixed_seconds)


def absorbed_widths(model: Model, tensor: int) -> tuple[float, float]:
    """(projections, attention) elements per token of MLA's absorbed decode on one tensor
    rank of heads a / t, as SGLang 0.4.6 runs it (python/sglang/srt/models/deepseek_v2.py,
    DeepseekV2AttentionMLA.forward_absorb; FlashMLA's flash_mla_with_kvcache takes the
    same shapes: a query of kv_lora_rank + qk_rope_head_dim and an output of kv_lora_rank
    per head, deepseek-ai/FlashMLA README):
    - the projections: hidden in and out (2h), the latents (kv_lora_rank +
      qk_rope_head_dim, q_lora_rank), the query up-projection's a x qk_head_dim, the key
      up-projection's (the bmm by w_kc) kv_lora_rank-wide query per head, the value
      up-projection's (the bmm by w_vc) read of the kv_lora_rank-wide output per head and
      its a x v_head_dim for the output projection; no keys or values up-projected;
    - the kernel: each head's latent query (kv_lora_rank + qk_rope_head_dim) read and its
      kv_lora_rank-wide output written.
    (0, 0) without MLA."""
    mla = model.mla
    if mla is None or model.hidden_size is None or model.num_attention_heads is None:
        return 0.0, 0.0
    heads = model.num_attention_heads / tensor
    latents = (model.latent_kv_width or 0) + (mla.q_lora_rank or 0)
    projections = (2 * model.hidden_size + latents + model.query_width / tensor
                   + 2 * heads * mla.kv_lora_rank + model.attention_output_width / tensor)
    attention = heads * (2 * mla.kv_lora_rank + mla.qk_rope_head_dim)
    return projections, attention


def _norm_module_bytes(serving: Serving) -> float:
    """The norm weights one module of a layer reads: half of a block's two, or a
    single-module layer's one (`Model.norms_in`)."""
    model = serving.spec.model
    layers = model.num_layers or 1
    weights = _per_layer(serving, "norms", layers)
    if model.single_module_layers:  # the norm weights of one module's half of a block
        return weights * layers / model.norms_in(0, layers)
    return weights / 2


def operation_constants(serving: Serving) -> OperationConstants:
    """The step-independent parts of every operation (`OperationConstants`)."""
    spec, t = serving.spec, serving.degree("tensor")
    model, inference = spec.model, serving.inference
    assert model.hidden_size is not None
    engine = inference.engine is not None
    ffn = model.ffn_hidden_size
    attends = model.num_attention_heads is not None and model.head_dim is not None
    gemm = gemm_kernel(serving, inference.weights)
    absorbed_projection, absorbed_attention = (absorbed_widths(model, t) if attends
                                               else (0.0, 0.0))
    return OperationConstants(
        act_bytes=_act(serving), matmul=_matmul(serving), unquantized=_unquantized(serving),
        quantized_reads=_quantized_reads(serving), unquantized_reads=_unquantized_reads(serving),
        projection_weights=(attention_matmul_weights(model) / attention_divisor(spec, t)
                            if attends else 0.0),
        projection_width=(2 * model.hidden_size + attention_width(model, t)
                          if attends else 0.0),
        projection_bytes=_per_layer(serving, "attention", model.num_attention_layers or 1),
        attention_width=model.query_width + model.attention_output_width if attends else 0.0,
        kv_bytes_per_token=(kv_bytes_per_token(model, inference.kv_cache, t)
                            if attends else 0.0),
        pair_flops=_pair_flops(serving, False) if attends else 0.0,
        absorbed_pair_flops=_pair_flops(serving, True) if attends else 0.0,
        prefill_kernel=attention_kernel(serving, "prefill") if engine else None,
        decode_kernel=attention_kernel(serving, "decode") if engine else None,
        mlp_weights=mlp_matmul_weights(model, ffn) / t if ffn is not None else 0.0,
        mlp_width=(2 * model.hidden_size
                   + product_io_passes(serving) * mlp_width(model, ffn, t)
                   if ffn is not None else 0.0),
        mlp_bytes=_per_layer(serving, "mlp", model.num_dense_layers),
        norm_module_bytes=_norm_module_bytes(serving),
        lookup_bytes=bytes_per_parameter("embedding", inference, spec.precision.activations)
        + _act(serving),
        head_bytes=_per_layer(serving, "embedding" if model.tie_embeddings else "head", 1),
        moe=moe_constants(serving), gemm=gemm,
        projection_depth=(gemm_depth_factor(gemm, projection_matrices(model, t))
                          if gemm is not None and attends else 1.0),
        mlp_depth=(gemm_depth_factor(gemm, mlp_matrices(model, ffn, t))
                   if gemm is not None and ffn is not None else 1.0),
        activation=separate_activation(serving), quantization=separate_quantization(serving),
        permutation=separate_permutation(serving),
        projection_inputs=(sum(depth for _, depth in projection_matrices(model, t))
                           if attends else 0.0),
        mlp_inner=mlp_width(model, ffn, t) if ffn is not None else 0.0,
        mlp_down=ffn / t if ffn is not None else 0.0,
        absorbed_projection_width=absorbed_projection,
        absorbed_attention_width=absorbed_attention,
        absorbed_inputs=(_absorbed_inputs(model, t) if attends else 0.0),
        elementwise=elementwise_kernel(serving))


def _absorbed_inputs(model: Model, tensor: int) -> float:
    """Input elements per token of one layer's products in MLA's absorbed decode: those of
    `projection_matrices` with the key/value up-projection's kv_lora_rank replaced by the
    absorbed products' a x qk_nope_head_dim query and a x kv_lora_rank output; 0 without
    MLA."""
    mla = model.mla
    if mla is None or model.num_attention_heads is None:
        return 0.0
    heads = model.num_attention_heads / tensor
    depths = sum(depth for _, depth in projection_matrices(model, tensor))
    return depths - mla.kv_lora_rank + heads * (mla.qk_nope_head_dim + mla.kv_lora_rank)


def constants_of(serving: Serving) -> OperationConstants:
    """The serving's operation constants, computed once (`Serving.constants`)."""
    found: OperationConstants | None = serving.constants  # set by `serving_of`, or None
    return found if found is not None else operation_constants(serving)


def _act(serving: Serving) -> float:
    return bytes_per_element(serving.spec.precision.activations)


def _matmul(serving: Serving) -> str:
    spec = serving.spec
    return format_matmul_dtype(serving.inference.weights, spec.precision.activations,
                               spec.hardware.gpu)


def _expert_matmul(serving: Serving, experts: str) -> str:
    """The format of the routed experts' products, in `experts` (`[inference]
    expert_weights`)."""
    spec = serving.spec
    return format_matmul_dtype(experts, spec.precision.activations, spec.hardware.gpu)


def _unquantized(serving: Serving) -> str:
    """The format of products with weights a quantized checkpoint keeps in 16-bit."""
    if serving.inference.weights in QUANTIZED_FORMATS:
        return serving.spec.precision.activations
    return _matmul(serving)


def _quantized_reads(serving: Serving) -> float | None:
    """The engine's bandwidth share reading the blocks' linear weights (their format)."""
    return weight_efficiency(serving, serving.inference.weights)


def _unquantized_reads(serving: Serving) -> float | None:
    """The engine's bandwidth share reading weights a quantized checkpoint keeps 16-bit."""
    inference = serving.inference
    if inference.engine is None:
        return None
    if inference.weights in QUANTIZED_FORMATS:
        return weight_efficiency(serving, serving.spec.precision.activations)
    return weight_efficiency(serving, inference.weights)


def projections(serving: Serving, step: Step) -> Operation:
    """Q, K, V and output projections of one layer."""
    c = constants_of(serving)
    width = (c.absorbed_projection_width if step.absorbed and c.absorbed_projection_width
             else c.projection_width)
    io = step.tokens * width * c.act_bytes
    calls = PROJECTION_CALLS
    if serving.spec.model.mla is not None:
        calls = PROJECTION_CALLS_MLA_ABSORBED if step.absorbed else PROJECTION_CALLS_MLA
    return product("attention projections", 2 * step.tokens * c.projection_weights,
                   c.projection_bytes + io, c.matmul, c.gemm, step.tokens,
                   c.projection_depth, calls, c.quantized_reads)


def recurrent_projections(serving: Serving, step: Step, mixer: str) -> Operation:
    """The input and output projections of one recurrent layer (`mixer_matmul_weights`),
    split by heads over the tensor ranks."""
    spec, t = serving.spec, serving.degree("tensor")
    model = spec.model
    assert model.hidden_size is not None
    divisor = mamba_divisor(spec, t) if mixer == "mamba" else t
    weights = mixer_matmul_weights(model, mixer) / divisor
    layers = model.mixers_in(0, model.num_layers or 0).get(mixer, 1)
    io = step.tokens * (2 * model.hidden_size + 2 * weights / model.hidden_size) * _act(serving)
    return Operation(name=f"{mixer} projections", flops=2 * step.tokens * weights,
                     bytes=_per_layer(serving, mixer, layers) + io,
                     dtype=_matmul(serving), memory_efficiency=_quantized_reads(serving))


def recurrent_step_flops_per_token(model: Model, mixer: str) -> float:
    """Decode FLOPs of one token through one recurrent layer's state, beside its
    projections: gated DeltaNet's delta-rule step (Yang et al. 2024, arXiv:2412.06464,
    Eq. 10: the state read by the key and by the query, and its rank-one update, 3 x 2 d_k
    d_v per value head); Mamba-2's step (Dao and Gu 2024, arXiv:2405.21060, Eq. 1: the
    update B x^T and the read C^T h, 2 x 2 P N per head); 2 x kernel taps per channel of
    the convolution."""
    linear, mamba = model.linear_attention, model.mamba
    if mixer == "linear_attention" and linear is not None:
        return (linear.num_value_heads * 6.0 * linear.key_head_dim * linear.value_head_dim
                + 2.0 * linear.conv_kernel_size * linear.conv_width)
    assert mamba is not None
    return (mamba.num_heads * 4.0 * mamba.head_dim * mamba.state_size
            + 2.0 * mamba.conv_kernel_size * mamba.conv_width)


def recurrent_scan(serving: Serving, step: Step, mixer: str) -> Operation:
    """One recurrent layer's own products: the chunked scan over a prefill's new tokens
    (`recurrent_mixer_flops_per_token`), or one step per decoded token; each sequence's
    state read and written once."""
    model, t = serving.spec.model, serving.degree("tensor")
    per_token = (recurrent_step_flops_per_token(model, mixer) if step.phase == "decode"
                 else recurrent_mixer_flops_per_token(model, mixer, int(step.queries)))
    state = (state_elements_per_sequence(model, t)
             * bytes_per_element(serving.inference.kv_cache))
    return Operation(name=f"{mixer} scan", flops=step.tokens * per_token / t,
                     bytes=2 * step.sequences * state,
                     dtype=serving.spec.precision.activations)


def _pair_flops(serving: Serving, absorbed: bool) -> float:
    """FLOPs per (query, key) pair and layer on one tensor rank, both products."""
    model = serving.spec.model
    assert model.num_attention_heads is not None
    heads = model.num_attention_heads / serving.degree("tensor")
    if model.mla is not None and absorbed:
        return 2 * heads * (2 * model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)
    return 2 * heads * (model.qk_head_dim + model.value_head_dim)


def indexer(serving: Serving, step: Step) -> Operation:
    """DeepSeek sparse attention's lightning indexer in one layer: every causal (query, key)
    pair scored by index_heads dot products of index_head_dim and their weighted sum
    (2 x heads x (width + 1) FLOPs a pair; DeepSeek-V3.2-Exp report, Sec. 2.1), on every
    tensor rank (vLLM keeps the indexer whole on each), reading the cached index keys once
    per tile of queries."""
    model = serving.spec.model
    sparse = model.sparse_attention
    assert sparse is not None
    pairs = attention_pairs(step, None, serving.degree("context"))
    tile = min(step.queries, FUSED_ATTENTION_TILE_TOKENS)
    key = sparse.index_head_dim * bytes_per_element(serving.inference.kv_cache)
    return Operation(name="indexer", flops=pairs * 2 * sparse.index_heads
                     * (sparse.index_head_dim + 1), bytes=pairs / tile * key,
                     dtype=serving.spec.precision.activations)


def attention(serving: Serving, step: Step, window: int | None) -> Operation:
    """Q.K^T and scores.V of one layer, reading the cache and writing the new tokens'
    (with DeepSeek sparse attention, of the top_k keys the indexer keeps per query)."""
    model, t, c = serving.spec.model, serving.degree("tensor"), constants_of(serving)
    if model.sparse_attention is not None:
        window = model.sparse_attention.top_k
    pairs = attention_pairs(step, window, serving.degree("context"))
    per_token = c.kv_bytes_per_token
    tile = min(step.queries, FUSED_ATTENTION_TILE_TOKENS)
    width = (c.absorbed_attention_width if step.absorbed and c.absorbed_attention_width
             else c.attention_width / t)
    io = step.tokens * width * c.act_bytes
    name = "attention" if window is None else f"attention (window {window:,})"
    if model.sparse_attention is not None:
        name = f"attention (top {window:,} keys)"
    # the engine's kernel, if it states one (`attention_kernel`)
    kernel = c.decode_kernel if step.phase == "decode" else c.prefill_kernel
    queries = step.sequences * step.queries
    return Operation(name=name,
                     flops=pairs * (c.absorbed_pair_flops if step.absorbed else c.pair_flops),
                     bytes=pairs / tile * per_token + step.tokens * per_token + io,
                     dtype=serving.spec.precision.activations,
                     memory_efficiency=kernel.memory_efficiency if kernel else None,
                     matmul_efficiency=(kernel_compute_efficiency(kernel, pairs / queries)
                                        if kernel and queries > 0 else None),
                     fixed_seconds=kernel.fixed_seconds if kernel else 0.0)


def dense_mlp(serving: Serving, step: Step) -> Operation:
    c = constants_of(serving)
    io = step.tokens * c.mlp_width * c.act_bytes
    return product("mlp", 2 * step.tokens * c.mlp_weights, c.mlp_bytes + io, c.matmul,
                   c.gemm, step.tokens, c.mlp_depth, MLP_CALLS, c.quantized_reads)


def _expert_share(serving: Serving) -> float:
    """Each rank's share of its tensor group's tokens that it routes: 1 with the experts
    split by the tensor ranks (each holds all the tokens), x / t when expert ranks fold
    into the tensor ranks (MoE parallel folding, Liu et al. 2025, arXiv:2504.14960:
    sequence parallelism gives each tensor rank 1/t of the tokens, and the x ranks of an
    expert's tensor group gather theirs)."""
    return expert_tensor_degree(serving.layout) / serving.degree("tensor")


def active_local_experts(serving: Serving, tokens: float) -> float:
    """Expected experts of one GPU that some token of the expert group picks: the group's
    e ranks route tokens x e x share distinct tokens (tensor ranks share theirs)."""
    moe = serving.spec.model.moe
    assert moe is not None
    e = serving.degree("expert")
    routed = tokens * e * _expert_share(serving)
    # float ** float is typed Any (a negative base gives a complex); this base is in [0, 1]
    active: float = moe.num_experts / e * (
        1 - (1 - moe.experts_per_token / moe.num_experts) ** routed)
    return active


@attrs.frozen(kw_only=True)
class MoeConstants:
    """The step-independent parts of an MoE layer's operations (`moe_ops`)."""

    router_bytes: float
    expert_bytes: float
    """One routed expert's weights on one GPU."""
    share: float
    """`_expert_share`."""
    expert_weights: float
    """One routed expert's matrices, whole."""
    expert_tensor: int
    expert_width: float
    """Elements per (token, expert) pair the routed experts read and write."""
    routed: str
    routed_reads: float | None
    shared: float
    """The shared experts' matrices on one tensor rank."""
    shared_bytes: float
    shared_width: float
    """Elements per token the shared experts read and write, halved."""
    routed_gemm: GemmKernel | None = None
    """The engine's FP8 block-scaled product kernel for the routed experts; None: none."""
    expert_depth: float = 1.0
    """The depth share of one routed expert's products under `routed_gemm`."""
    shared_gemm: GemmKernel | None = None
    """The kernel for the shared experts (the blocks' weights); None: none."""
    shared_depth: float = 1.0
    """The depth share of the shared experts' products under `shared_gemm`."""
    expert_inner: float = 0.0
    """A routed expert's intermediates per (token, expert) pair (`mlp_width`, 1/x)."""
    expert_down: float = 0.0
    """A routed expert's down-projection input per pair (its inner width, 1/x)."""
    shared_inner: float = 0.0
    """The shared experts' intermediates per token on one tensor rank."""
    shared_down: float = 0.0
    """The shared experts' down-projection input per token on one tensor rank."""


def moe_constants(serving: Serving) -> MoeConstants | None:
    """`MoeConstants` of the serving's MoE layers; None without experts."""
    model, t, e = serving.spec.model, serving.degree("tensor"), serving.degree("expert")
    moe = model.moe
    if moe is None or model.hidden_size is None:
        return None
    h, layers = model.hidden_size, model.num_moe_layers
    x = expert_tensor_degree(serving.layout)
    width = moe.expert_ffn_hidden_size
    shared_width = moe.shared_expert_ffn_hidden_size or width
    experts = serving.inference.expert_weights
    routed, routed_reads = ((_matmul(serving), _quantized_reads(serving)) if experts is None
                            else (_expert_matmul(serving, experts),
                                  weight_efficiency(serving, experts)))
    routed_gemm = gemm_kernel(serving, experts or serving.inference.weights)
    shared_gemm = gemm_kernel(serving, serving.inference.weights)
    shared_inner = moe.num_shared_experts * shared_width
    return MoeConstants(
        router_bytes=_per_layer(serving, "router", layers),
        expert_bytes=_per_layer(serving, "experts", layers) / (moe.num_experts / e),
        share=_expert_share(serving), expert_weights=mlp_matmul_weights(model, width),
        expert_tensor=x,
        expert_width=2 * h + product_io_passes(serving) * mlp_width(model, width, x),
        routed=routed, routed_reads=routed_reads,
        shared=moe.num_shared_experts * mlp_matmul_weights(model, shared_width) / t,
        shared_bytes=_per_layer(serving, "shared_experts", layers),
        shared_width=h + moe.num_shared_experts * shared_width / t,
        routed_gemm=routed_gemm,
        expert_depth=(gemm_depth_factor(routed_gemm, mlp_matrices(model, width, x))
                      if routed_gemm is not None else 1.0),
        shared_gemm=shared_gemm,
        shared_depth=(gemm_depth_factor(shared_gemm, mlp_matrices(model, shared_inner, t))
                      if shared_gemm is not None and shared_inner else 1.0),
        expert_inner=mlp_width(model, width, x), expert_down=width / x,
        shared_inner=moe.num_shared_experts * mlp_width(model, shared_width, t),
        shared_down=shared_inner / t)


def moe_ops(serving: Serving, step: Step) -> list[Operation]:
    """Router, routed experts and shared experts of one MoE layer."""
    model, c = serving.spec.model, constants_of(serving)
    moe, m = model.moe, c.moe
    assert moe is not None and m is not None and model.hidden_size is not None
    h, n, act = model.hidden_size, step.tokens, c.act_bytes
    # (token, expert) pairs this rank computes, each on 1/x of the expert's matrices:
    # k x n / t x x, the same work as k x n pairs on 1/t of them.
    pairs = n * moe.experts_per_token * m.share
    active = active_local_experts(serving, n)
    # a routed expert's rows: the pairs over the experts some token picked
    expert_rows = pairs / active if active > 0 else 0.0
    router = Operation(name="router", flops=2 * n * h * moe.num_experts,
                       bytes=m.router_bytes + n * (h + moe.num_experts) * act,
                       dtype=c.unquantized, memory_efficiency=c.unquantized_reads)
    return [
        per_kernel(router, 1, c.elementwise),  # its top-k
        product("routed experts", 2 * pairs * m.expert_weights / m.expert_tensor,
                active * m.expert_bytes + pairs * m.expert_width * act, m.routed,
                m.routed_gemm, expert_rows, m.expert_depth, MLP_CALLS, m.routed_reads),
        product("shared experts", 2 * n * m.shared,
                m.shared_bytes + n * 2 * m.shared_width * act, c.matmul, m.shared_gemm, n,
                m.shared_depth, MLP_CALLS, c.quantized_reads),
    ]


def norms(serving: Serving, step: Step, modules: int = 2) -> Operation:
    """The norms and residual adds of one layer of `modules` modules: a mixer and an MLP
    (2), or one of them alone (1: half of the norm weights and passes, `Model.norms_in`)."""
    model, c = serving.spec.model, constants_of(serving)
    assert model.hidden_size is not None
    op = Operation(name="norms and residuals", flops=0.0,
                   bytes=(c.norm_module_bytes * modules + step.tokens * model.hidden_size
                          * NORM_PASSES * c.act_bytes * modules / 2),
                   dtype=serving.spec.precision.activations)
    return per_kernel(op, modules, c.elementwise)  # one fused add-RMSNorm a module


EXCHANGE_PASSES = "expert exchange passes"
"""The operation of DeepEP's low-latency send and receive kernels on the compute stream."""


def _exchange_hooked(serving: Serving) -> bool:
    """Whether a decode step's expert exchange runs DeepEP's low-latency kernels with their
    receive behind a hook: its dispatcher DeepEP, under two-batch overlap
    (`llmpar.inference.elementwise`, expert exchange passes)."""
    expert = serving.spec.parallel.get("expert")
    return (serving.inference.two_batch_overlap and serving.degree("expert") > 1
            and getattr(expert, "dispatcher", "all-to-all") == "deepep")


def elementwise_ops(serving: Serving, step: Step, kind: LayerKind) -> list[Operation]:
    """The engine's elementwise kernels of one layer of `kind` beside its products
    (`llmpar.inference.elementwise`): the MLPs' activations, the quantization of the
    block-FP8 products' inputs, and MLA decode's latent norms and rotary embedding, each
    with its kernels' fixed time where the engine measures them (`per_kernel`)."""
    c = constants_of(serving)
    model = serving.spec.model
    latent = (c.elementwise is not None and step.absorbed and model.mla is not None
              and "attention" in mixer_parts(kind.mixer))
    exchange = kind.moe and step.phase == "decode" and _exchange_hooked(serving)
    if not (c.activation or c.quantization or c.permutation or latent or exchange):
        return []
    act, dtype = c.act_bytes, serving.spec.precision.activations
    assert model.hidden_size is not None
    n, h, t, kernel = step.tokens, model.hidden_size, serving.degree("tensor"), c.elementwise
    found = []
    if latent:
        op, kernels = latent_decode("latent norms and rotary", n, model, t, act, dtype)
        found.append(per_kernel(op, kernels, kernel))
    if c.quantization and c.gemm is not None and "attention" in mixer_parts(kind.mixer):
        absorbed = step.absorbed and c.absorbed_inputs > 0
        inputs, calls = ((c.absorbed_inputs, PROJECTION_CALLS_MLA_ABSORBED) if absorbed
                         else (c.projection_inputs, PROJECTION_CALLS_MLA
                               if model.mla is not None else PROJECTION_CALLS))
        found.append(per_kernel(quantization("projection inputs quantization", n * inputs,
                                             act, dtype), calls, kernel))
    if not kind.mlp:
        return found
    if not kind.moe:
        if c.activation:
            found.append(per_kernel(activation("mlp activation", n, c.mlp_inner,
                                               model.gated, act, dtype), 1, kernel))
        if c.quantization and c.gemm is not None:
            found.append(per_kernel(quantization("mlp inputs quantization",
                                                 n * (h + c.mlp_down), act, dtype),
                                    MLP_CALLS, kernel))
        return found
    moe, m = model.moe, c.moe
    assert moe is not None and m is not None
    pairs = n * moe.experts_per_token * m.share
    routed = c.quantization and m.routed_gemm is not None
    # decode: DeepEP's low-latency dispatch quantizes the tokens and the masked path's
    # activation writes the down input in FP8 (`llmpar.inference.elementwise`)
    fused = routed and step.phase == "decode"
    if c.activation:
        found.append(per_kernel(activation("routed experts activation", pairs,
                                           m.expert_inner, model.gated, act, dtype,
                                           fused_quantization=fused), 1, kernel))
        if m.shared_inner:
            found.append(per_kernel(activation("shared experts activation", n,
                                               m.shared_inner, model.gated, act, dtype),
                                    1, kernel))
    values = n * h + pairs * m.expert_down if routed and not fused else 0.0
    calls = MLP_CALLS if values else 0
    if c.quantization and m.shared_gemm is not None and m.shared_inner:
        values += n * (h + m.shared_down)
        calls += MLP_CALLS
    if values:
        found.append(per_kernel(quantization("experts inputs quantization", values, act,
                                             dtype), calls, kernel))
    if step.phase == "decode" and pairs and _exchange_hooked(serving):
        found.append(per_kernel(exchange_passes(EXCHANGE_PASSES, n, pairs,
                                                moe.experts_per_token, h, act, dtype),
                                EXCHANGE_KERNELS, kernel))
    if c.permutation and m.routed_gemm is not None and step.phase == "prefill" and pairs:
        received = received_tokens(pairs, moe.experts_per_token, serving.degree("expert"))
        found.append(per_kernel(permutation("routed experts permutation", pairs, received,
                                            h, act, dtype), 2, kernel))  # scatter, gather
    return found


def layer_modules(kind: LayerKind) -> int:
    """Modules of a layer of `kind`, each behind its norm: its token mixers (one norm for
    Falcon-H1's two side by side) and its MLP."""
    return (kind.mixer != NO_MIXER) + kind.mlp


def layer_ops(serving: Serving, step: Step, kind: LayerKind) -> list[Operation]:
    """The operations of one layer of `kind`."""
    return [op for piece in layer_pieces(serving, kind) for op in piece(step)]


def _recurrent_piece(serving: Serving, mixer: str, step: Step) -> list[Operation]:
    return [recurrent_projections(serving, step, mixer), recurrent_scan(serving, step, mixer)]


OperationPiece = Callable[[Step], list[Operation]]
"""Some consecutive operations of a layer (or of the outer layers) as a function of the
step: `layer_pieces`."""


def layer_pieces(serving: Serving, kind: LayerKind) -> list[OperationPiece]:
    """The operations of one layer of `kind` in the pieces that make them, in order: each
    token mixer's, the MLP block's (dense, or router + routed + shared experts) and the
    norms'. A search over one step's size (`llmpar.inference.phases.compute_bound_batch`)
    recomputes only the pieces that do not grow along a straight line."""
    pieces: list[OperationPiece] = []
    for mixer in mixer_parts(kind.mixer):  # both of a parallel hybrid layer
        if mixer != "attention":
            pieces.append(functools.partial(_recurrent_piece, serving, mixer))
        elif serving.spec.model.sparse_attention is not None:
            pieces.append(lambda step: [projections(serving, step),
                                        attention(serving, step, kind.window),
                                        indexer(serving, step)])
        else:
            pieces.append(lambda step: [projections(serving, step),
                                        attention(serving, step, kind.window)])
    if kind.mlp:
        pieces.append((lambda step: moe_ops(serving, step)) if kind.moe
                      else (lambda step: [dense_mlp(serving, step)]))
    pieces.append(lambda step: elementwise_ops(serving, step, kind))
    modules = layer_modules(kind)
    pieces.append(lambda step: [norms(serving, step, modules)])
    return pieces


def outer_ops(serving: Serving, step: Step) -> list[Operation]:
    """Embedding lookup and output layer (the sampled rows only)."""
    spec, t, c = serving.spec, serving.degree("tensor"), constants_of(serving)
    model, act = spec.model, c.act_bytes
    assert model.hidden_size is not None and model.vocab_size is not None
    h, vocab = model.hidden_size, model.vocab_size
    return [
        per_kernel(Operation(name="embedding", flops=0.0,
                             bytes=step.tokens * h * c.lookup_bytes,
                             dtype=spec.precision.activations), 1, c.elementwise),
        Operation(name="output layer", flops=2 * step.rows * h * vocab / t,
                  bytes=c.head_bytes + step.rows * (h + vocab / t) * act,
                  dtype=c.unquantized, memory_efficiency=c.unquantized_reads),
    ]


def scaled(op: Operation, count: int) -> Operation:
    """`count` identical operations as one (the roofline of each scales alike)."""
    return Operation(name=op.name, flops=op.flops * count, bytes=op.bytes * count,
                     dtype=op.dtype, memory_efficiency=op.memory_efficiency,
                     matmul_efficiency=op.matmul_efficiency,
                     fixed_seconds=op.fixed_seconds * count)


def counted_ops(serving: Serving, step: Step) -> list[tuple[Operation, int]]:
    """Every operation of one forward step along the pipeline, each with how many times
    it runs (once per layer of its kind)."""
    counted = [(op, 1) for op in outer_ops(serving, step)]
    for kind, count in layer_kinds(serving):
        counted += [(op, count) for op in layer_ops(serving, step, kind)]
    return counted


def counted_pieces(serving: Serving) -> list[tuple[OperationPiece, int]]:
    """`counted_ops` in pieces (`layer_pieces`), each with how many times it runs: their
    operations, in order, are `counted_ops`'."""
    found: list[tuple[OperationPiece, int]] = [(lambda step: outer_ops(serving, step), 1)]
    for kind, count in layer_kinds(serving):
        found += [(piece, count) for piece in layer_pieces(serving, kind)]
    return found


def step_ops(serving: Serving, step: Step) -> list[Operation]:
    """Every operation of one forward step, along the pipeline (each layer kind's as one)."""
    return [op if count == 1 else scaled(op, count) for op, count in counted_ops(serving, step)]
