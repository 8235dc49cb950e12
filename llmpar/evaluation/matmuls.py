"""The matrix products of a training step on one GPU, and the time their shapes cost
beyond their FLOPs.

Compute time counts FLOPs at the GPU's matmul efficiency, the rate large products
reach. A product of C[m x n] = A[m x k] B[k x n] takes

    fixed + max(FLOPs / (peak * matmul_efficiency),
                bytes / (HBM bandwidth * memory_efficiency))

every product pays a launch and first-tile latency (`matmul_fixed_seconds`, plus the
host time the framework profile adds to a launch, `kernel_overhead_seconds`; once per
launch for batched and grouped products), and a product whose weights and operands
take longer to stream from HBM than its FLOPs take to compute runs at the memory's
pace (the roofline, Williams et al. 2009). This law is checked against measured GEMMs
(validation/published/gemm/, tests/test_matmul_shapes.py). Small token counts per GPU
(micro-batch x sequence / context degree), thin slices (hidden size / tensor degree),
attention products over short head widths and experts that each see few tokens are
where training loses time.

The products, on one GPU, per micro-batch, along the whole pipeline:
- attention projections: Q, K and V together and the output (MLA: its down and up
  projections and the output; a gated attention's output gate; DeepSeek sparse
  attention's indexer), split as tensor parallelism splits them (KV heads copied past
  t > kv), in the layers whose token mixer is attention;
- a recurrent layer's projections in place of attention's (`Model.mixers_in`, the
  weights `llmpar.footprint.parameters` counts): Mamba-2's in_proj (to z, x, B, C and
  dt) and out_proj, gated DeltaNet's input projection (queries, keys, values, z, beta
  and a) and out_proj, each split over the tensor ranks as Megatron-Core builds them
  (ColumnParallelLinear in, RowParallelLinear out: megatron/core/ssm/mamba_mixer.py,
  megatron/core/ssm/gated_delta_net.py); their scans are their own kernels, timed
  with attention's products (`llmpar.footprint.flops.recurrent_mixer_flops_per_token`);
- MLP (gate and up together, then down), or router + routed experts + shared
  experts: tokens routed evenly, so each of a GPU's E/e experts sees k x tokens x
  e / E tokens (x / t of that with an expert tensor degree x below the tensor degree
  t), one grouped launch for them;
- where attention materializes its scores (activation models that keep them, i.e.
  not FlashAttention): Q.K^T and scores.V as batched products per head, reducing over
  the head width and the sequence; otherwise FlashAttention's kernels, compute-bound at
  training lengths, which pay the fixed time once per layer and pass, and once per ring
  step under ring context parallelism;
- once per model: the output layer.
Each runs forward, and backward as the input gradient and the weight gradient (the
same FLOPs and, to this accounting, the same bytes); full recomputation reruns the
forward of the recomputed layers, selective recomputation the attention products (and
the products of the modules `[training] recompute_modules` names).
Bytes: A, B and C once, B in the weights' format when it is a weight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from llmpar.arrays import Value, logical_and, maximum, where
from llmpar.dtypes import bytes_per_element
from llmpar.footprint.inventory import MODULE_PARENTS
from llmpar.footprint.op_checkpoint import rerun_shares
from llmpar.roofline import Rates
from llmpar.spec import Spec


@attrs.frozen(kw_only=True)
class RankShape:
    """What decides the shapes of one GPU's products."""

    tensor: int = 1
    context: int = 1
    expert: int = 1
    expert_tensor: int | None = None
    """Ranks each routed expert splits over; unset: the tensor degree."""
    micro_batch_size: Any = 1
    """Sequences per micro-batch (an array over a search node where it varies)."""
    attention_steps: Any = None
    """Attention kernels per layer and pass under context parallelism, each over
    1/steps of the sequence's keys for context / steps of the heads' share: the context
    degree for a ring (None, the default), 1 for all-to-all, the ring's degree for the
    hybrid (an array where it varies)."""

    @property
    def context_steps(self) -> Any:
        """`attention_steps`, with a ring's where none is given."""
        return self.context if self.attention_steps is None else self.attention_steps

    @property
    def experts_split(self) -> int:
        return self.tensor if self.expert_tensor is None else self.expert_tensor


@attrs.frozen(kw_only=True)
class Product:
    """`count` products C[m x n] = A[m x k] B[k x n] of one micro-batch on one GPU."""

    name: str
    m: Any
    n: Any
    k: Any
    count: Any = 1.0
    batch: Any = 1.0
    """Products one kernel launch runs together (heads of a batched product, experts of
    a grouped one): the fixed time is paid once per launch."""
    weights: bool = True
    """B is a weight matrix (else both operands are activations)."""
    layer: bool = True
    """Part of a layer (recomputation reruns it), not the output layer."""
    module: str = ""
    """The Megatron-Core module that reruns it under selective recomputation by module
    (`[training] recompute_modules`: mlp, moe, shared_experts, mla_up_proj), or ""."""


def _tokens(spec: Spec, shape: RankShape) -> Value:
    return shape.micro_batch_size * spec.training.sequence_length / shape.context


def _attention(spec: Spec, shape: RankShape, tokens: Value, layers: float) -> list[Product]:
    model, t = spec.model, shape.tensor
    assert model.hidden_size is not None and model.num_attention_heads is not None
    h, a = model.hidden_size, model.num_attention_heads
    mla = model.mla
    if mla is None:
        assert model.head_dim is not None and model.num_kv_heads is not None
        kv = max(1.0, model.num_kv_heads / t) * model.head_dim
        # a gated attention's q_proj also projects the output gate (Qwen3-Next)
        query = (2 if model.attention_output_gate else 1) * model.query_width / t
        return [Product(name="Q/K/V", m=tokens, n=query + 2 * kv, k=h, count=layers),
                Product(name="attention output", m=tokens, n=h,
                        k=model.attention_output_width / t, count=layers)]
    found = []
    up = "mla_up_proj"
    if mla.q_lora_rank is None:
        found.append(Product(name="Q", m=tokens, n=a * mla.qk_head_dim / t, k=h, count=layers,
                             module=up))
    else:
        found += [Product(name="Q down", m=tokens, n=mla.q_lora_rank, k=h, count=layers),
                  Product(name="Q up", m=tokens, n=a * mla.qk_head_dim / t, k=mla.q_lora_rank,
                          count=layers, module=up)]
    sparse = model.sparse_attention
    if sparse is not None:
        # DeepSeek sparse attention's lightning indexer, on every GPU whole
        # (`llmpar.footprint.parameters.indexer_matmul_weights`)
        assert mla.q_lora_rank is not None
        found += [Product(name="indexer Q", m=tokens, n=sparse.index_heads * sparse.index_head_dim,
                          k=mla.q_lora_rank, count=layers),
                  Product(name="indexer K and weights", m=tokens,
                          n=sparse.index_head_dim + sparse.index_heads, k=h, count=layers)]
    return found + [
        Product(name="KV down", m=tokens, n=mla.kv_lora_rank + mla.qk_rope_head_dim, k=h,
                count=layers),
        Product(name="KV up", m=tokens, n=a * (mla.qk_nope_head_dim + mla.v_head_dim) / t,
                k=mla.kv_lora_rank, count=layers, module=up),
        Product(name="attention output", m=tokens, n=h, k=a * mla.v_head_dim / t,
                count=layers),
    ]


def _mamba(spec: Spec, shape: RankShape, tokens: Value, layers: float) -> list[Product]:
    """Mamba-2's projections (`llmpar.footprint.parameters.mamba_matmul_weights`)."""
    model, t = spec.model, shape.tensor
    mamba = model.mamba
    assert mamba is not None and model.hidden_size is not None
    projected = mamba.inner_width + mamba.conv_width + mamba.num_heads
    return [Product(name="mamba in", m=tokens, n=projected / t, k=model.hidden_size,
                    count=layers),
            Product(name="mamba out", m=tokens, n=model.hidden_size,
                    k=mamba.inner_width / t, count=layers)]


def _linear_attention(spec: Spec, shape: RankShape, tokens: Value,
                      layers: float) -> list[Product]:
    """Gated DeltaNet's projections, its two input projections as one (Megatron-Core's
    fused in_proj; `llmpar.footprint.parameters.linear_attention_matmul_weights`)."""
    model, t = spec.model, shape.tensor
    linear = model.linear_attention
    assert linear is not None and model.hidden_size is not None
    projected = 2 * linear.key_width + 2 * linear.value_width + 2 * linear.num_value_heads
    return [Product(name="linear attention in", m=tokens, n=projected / t,
                    k=model.hidden_size, count=layers),
            Product(name="linear attention out", m=tokens, n=model.hidden_size,
                    k=linear.value_width / t, count=layers)]


MIXER_PRODUCTS: Mapping[str, Callable[[Spec, RankShape, Value, float], list[Product]]] = (
    MappingProxyType({"attention": _attention, "mamba": _mamba,
                      "linear_attention": _linear_attention}))
"""Each token mixer's projections, by the kinds `Model.mixers_in` names."""


def _scores(spec: Spec, shape: RankShape, layers: float) -> list[Product]:
    """Q.K^T and scores.V per head, as eager attention runs them: under ring context
    parallelism one pair per ring step, each over the chunk of keys at hand; under
    all-to-all context parallelism over the whole sequence for 1/c of the heads; under
    the hybrid, r ring steps over s/r tokens for r/c of the heads."""
    model = spec.model
    assert model.num_attention_heads is not None
    s, c, steps = spec.training.sequence_length, shape.context, shape.context_steps
    heads = shape.micro_batch_size * model.num_attention_heads / shape.tensor * layers
    length = s / steps
    heads = heads * steps / c
    per_launch = heads / layers
    return [Product(name="Q.K^T", m=length, n=length, k=model.qk_head_dim, count=heads * steps,
                    batch=per_launch, weights=False),
            Product(name="scores.V", m=length, n=model.value_head_dim, k=length,
                    count=heads * steps, batch=per_launch, weights=False)]


def _mlp(spec: Spec, tokens: Value, width: float, t: int, count: float,
         label: str, module: str, batch: float = 1.0) -> list[Product]:
    model = spec.model
    assert model.hidden_size is not None
    up = (2 if model.gated else 1) * width / t
    return [Product(name=f"{label} up", m=tokens, n=up, k=model.hidden_size, count=count,
                    batch=batch, module=module),
            Product(name=f"{label} down", m=tokens, n=model.hidden_size, k=width / t,
                    count=count, batch=batch, module=module)]


def _moe(spec: Spec, shape: RankShape, tokens: Value, layers: float) -> list[Product]:
    model = spec.model
    moe = model.moe
    assert moe is not None and model.hidden_size is not None
    # With fewer expert tensor ranks than tensor ranks each GPU routes only its
    # sequence-parallel slice of the tokens (x / t of them).
    x = shape.experts_split
    per_expert = tokens * moe.experts_per_token * shape.expert / moe.num_experts * x / shape.tensor
    local = moe.num_experts / shape.expert
    found = [Product(name="router", m=tokens, n=moe.num_experts, k=model.hidden_size,
                     count=layers, module="moe")]
    found += _mlp(spec, per_expert, moe.expert_ffn_hidden_size, x, local * layers,
                  "expert", "moe", batch=local)  # grouped: one launch for a GPU's experts
    if moe.num_shared_experts:
        width = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size
                                          or moe.expert_ffn_hidden_size)
        found += _mlp(spec, tokens, width, shape.tensor, layers, "shared expert",
                      "shared_experts")
        if moe.shared_expert_gate:  # one sigmoid weight per token (Qwen2-MoE, Qwen3-Next)
            found.append(Product(name="shared expert gate", m=tokens, n=1,
                                 k=model.hidden_size, count=layers, module="shared_experts"))
    return found


def products(spec: Spec, shape: RankShape, materialized_scores: bool) -> list[Product]:
    """Every product of one micro-batch's forward pass, on one GPU of each stage."""
    model = spec.model
    assert model.hidden_size is not None and model.vocab_size is not None
    tokens = _tokens(spec, shape)
    found: list[Product] = []
    for kind, count in model.mixers_in(0, model.num_layers or 0).items():
        found += MIXER_PRODUCTS[kind](spec, shape, tokens, float(count))
    if materialized_scores and model.num_attention_layers:
        found += _scores(spec, shape, float(model.num_attention_layers))
    if model.num_dense_layers:
        assert model.ffn_hidden_size is not None
        found += _mlp(spec, tokens, model.ffn_hidden_size, shape.tensor,
                      float(model.num_dense_layers), "mlp", "mlp")
    if model.moe is not None and model.num_moe_layers:
        found += _moe(spec, shape, tokens, float(model.num_moe_layers))
    found.append(Product(name="output layer", m=tokens, n=model.vocab_size / shape.tensor,
                         k=model.hidden_size, layer=False))
    return found


def pass_seconds(product: Product, spec: Spec, rates: Rates) -> tuple[Value, Value]:
    """(time, time of its FLOPs alone) of one pass of one of `product`'s instances, its
    share of its launch's fixed time included."""
    flops = 2 * product.m * product.n * product.k
    compute = flops / product_rate(spec, rates, product_format(spec, product))
    act = bytes_per_element(spec.precision.activations)
    weight = bytes_per_element(spec.precision.weights) if product.weights else act
    moved = (product.m * product.k + product.m * product.n) * act + product.k * product.n * weight
    memory = moved / (rates.bandwidth * rates.memory_efficiency)
    fixed = launch_seconds(spec, rates) / product.batch
    return fixed + maximum(compute, memory), compute


def output_layer_format(spec: Spec) -> str:
    """The output layer's format: the linear layers' where the profile runs it with them
    (`Framework.fp8_output_layer`), else `[precision] compute`."""
    precision = spec.precision
    if spec.training.profile.fp8_output_layer:
        return precision.linear_format
    return precision.compute


def product_format(spec: Spec, product: Product) -> str:
    """The format `product` runs in: attention's for products of activations alone, the
    output layer's for it (`output_layer_format`), else the linear layers'."""
    if not product.weights:
        return spec.precision.attention_format
    return spec.precision.linear_format if product.layer else output_layer_format(spec)


def product_rate(spec: Spec, rates: Rates, dtype: str) -> float:
    """FLOP/s one GPU sustains on products in `dtype`: the peak of its tensor cores times
    `matmul_efficiency` for the `[precision] compute` format, else the efficiency the GPU
    states for that format (`Gpu.matmul_efficiency_for`: fp8's), else `matmul_efficiency`."""
    efficiency = (rates.matmul_efficiency if dtype == spec.precision.compute
                  else rates.gpu.matmul_efficiency_for(dtype) or rates.matmul_efficiency)
    return rates.peak(dtype) * efficiency


def launch_seconds(spec: Spec, rates: Rates) -> float:
    """The fixed time of one kernel launch: the GPU's launch and first tile
    (`matmul_fixed_seconds`, fitted on GEMM tables) plus the host time the framework
    profile adds to each launch (`kernel_overhead_seconds`)."""
    return ((rates.gpu.matmul_fixed_seconds or 0.0)
            + spec.training.profile.kernel_overhead_seconds)


def shape_seconds(product: Product, spec: Spec, rates: Rates) -> tuple[Value, Value]:
    """(forward, backward) seconds all `count` products lose to their shape: their time
    beyond their FLOPs' at the matmul efficiency. The backward pass is two products of
    the forward's size (input and weight gradients)."""
    time, flops = pass_seconds(product, spec, rates)
    lost = product.count * (time - flops)
    return lost, 2 * lost


def shape_loss_seconds(spec: Spec, shape: RankShape, rates: Rates, recompute: Any,
                       recomputed_fraction: Any, materialized_scores: bool) -> Value:
    """Seconds one micro-batch's products lose to their shapes in a training pass,
    summed along the pipeline: forward, backward, and the reruns recomputation adds."""
    if not spec.model.has_architecture:
        return 0.0
    total: Value = 0.0
    modules = spec.training.selective_modules
    policy = spec.training.recompute_policy
    shares = None if policy is None else rerun_shares(spec.model, policy)
    for product in products(spec, shape, materialized_scores):
        forward, backward = shape_seconds(product, spec, rates)
        total = total + (forward * (1.0 + reruns(product, recompute, recomputed_fraction,
                                                  modules, shares))
                         + backward)
    if not materialized_scores:
        total = total + _fused_attention_launches(spec, shape, recompute, recomputed_fraction,
                                                  "core_attn" in modules) * (
            launch_seconds(spec, rates))
    return total


def launches_per_micro_batch(spec: Spec, shape: RankShape, recompute: Any,
                             recomputed_fraction: Any, materialized_scores: bool
                             ) -> tuple[Value, Value]:
    """(in the layers, outside them) kernel launches of one micro-batch's products and
    attention along the pipeline: each launch forward, again for each rerun, and twice in
    the backward (input and weight gradients, or the two gradients of a product of
    activations); a fused attention kernel once per layer and pass
    (`_fused_attention_launches`). The host issues each one (`llmpar.evaluation.launches`)."""
    if not spec.model.has_architecture:
        return 0.0, 0.0
    modules = spec.training.selective_modules
    policy = spec.training.recompute_policy
    shares = None if policy is None else rerun_shares(spec.model, policy)
    layers: Value = 0.0
    outside: Value = 0.0
    for product in products(spec, shape, materialized_scores):
        launched = product.count / product.batch * (
            3.0 + reruns(product, recompute, recomputed_fraction, modules, shares))
        if product.layer:
            layers = layers + launched
        else:
            outside = outside + launched
    if not materialized_scores:
        layers = layers + _fused_attention_launches(spec, shape, recompute, recomputed_fraction,
                                                    "core_attn" in modules)
    return layers, outside


def _fused_attention_launches(spec: Spec, shape: RankShape, recompute: Any,
                              recomputed_fraction: Any, core_attention: bool) -> Value:
    """FlashAttention kernels of one micro-batch along the pipeline: one per attention
    layer and pass (a hybrid model's recurrent layers run no attention kernel:
    `Model.num_attention_layers`, the mixer inventory the FLOP counts use), and under
    ring context parallelism one per ring step (each step attends to the chunk at hand;
    Liu et al. 2023, arXiv:2310.01889), forward, backward and rerun (`core_attention`:
    selective recomputation reruns the attention)."""
    steps = shape.context_steps
    reruns = where(recompute == "full", recomputed_fraction,
                   where(recompute == "selective", float(core_attention), 0.0))
    return spec.model.num_attention_layers * steps * (2.0 + reruns)


def reruns(product: Product, recompute: Any, recomputed_fraction: Any,
           modules: tuple[str, ...], op_shares: Mapping[str, float] | None = None) -> Value:
    """Extra forward passes recomputation makes of `product`: full recomputation reruns
    the recomputed share of the layers, selective recomputation the attention products
    (core_attn: Korthikanti et al. 2022, Sec. 5) and the products of the other modules
    it names (Megatron-Core's --recompute-modules), or under an op-level
    `recompute_policy` the share of each product it does not save (`op_shares`,
    `llmpar.footprint.op_checkpoint.rerun_shares`)."""
    full = where(logical_and(recompute == "full", product.layer), recomputed_fraction, 0.0)
    if op_shares is not None:
        share = op_shares.get(product.name, 0.0) if product.layer else 0.0
        return full + where(recompute == "selective", share, 0.0)
    rerun = ("core_attn" in modules if not product.weights
             else bool(product.module) and (product.module in modules
                                            or MODULE_PARENTS.get(product.module) in modules))
    selective = where(logical_and(recompute == "selective", rerun), 1.0, 0.0)
    return full + selective
