"""Tensor parallelism (Megatron-LM: Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3).

Splits each attention block by heads and each MLP by its inner width over the
tensor group, and the vocabulary of the embedding and output layer. Activations
inside the block split with them (Korthikanti et al. 2022, Eq. 2:
sbh(10 + 24/t + 5as/(ht))). Each layer all-reduces its attention and MLP outputs
in the forward pass and their input gradients in the backward pass; the backward
all-reduces can run behind the weight-gradient products (`overlap_backward`). When the
degree exceeds the key/value heads, each rank keeps a copy of one KV head
(grouped-query attention as Megatron-Core and vLLM implement it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs

from llmpar.arrays import logical_and
from llmpar.dtypes import bytes_per_element
from llmpar.footprint.inventory import SPLIT_TENSOR
from llmpar.footprint.parameters import attention_parameters, embedding_parameters, mlp_parameters
from llmpar.hookspecs import hookimpl
from llmpar.placement import Axis
from llmpar.search.dimension import SearchDimension
from llmpar.spec import Spec
from llmpar.spec.validators import positive
from llmpar.strategies.common import (
    EXPERT_GROUPS,
    TENSOR_SPLIT_GROUPS,
    backward_input_gradient_calls,
    expert_tensor_degree,
    has_expert_groups,
    hidden_state_bytes,
    layer_collective_calls,
)
from llmpar.strategy import (
    ActivationSplit,
    Collective,
    ForwardStep,
    Layout,
    ProductSplit,
    Rule,
    Strategy,
    StrategyContext,
    Transform,
    checked_collective,
    checked_shard,
)

LAYER_OUTPUT = "tensor.layer-output"
"""The all-reduces of the attention and MLP outputs (forward) and of their output
gradients (backward)."""
SERVING_LAYER_OUTPUT = "tensor.serving-layer-output"
"""Serving: the all-reduces of every layer's attention and MLP outputs, and the embedding's."""
SERVING_LOGITS = "tensor.serving-logits-all-gather"
"""Serving: the all-gather of the sampled rows' logits over the split vocabulary."""
INPUT_GRADIENT = "tensor.input-gradient"
"""The all-reduces of the input gradients of the column-parallel projections (backward)."""
COMPONENTS = ("weights", "gradients", "optimizer")


@attrs.frozen(kw_only=True)
class TensorConfig:
    """`[parallel.tensor]`."""

    degree: int = attrs.field(default=1, validator=positive)
    """GPUs each layer is split over."""
    overlap_backward: bool = True
    """Run the backward pass's input-gradient all-reduces of the column-parallel
    projections behind their weight-gradient products (Megatron-LM's asynchronous
    tensor-parallel all-reduce, `LinearWithGradAccumulationAndAsyncCommunication`);
    false: every all-reduce on the critical path."""


def attention_divisor(spec: Spec, t: int) -> float:
    """How many ways the attention weights split, with KV heads copied past t > kv."""
    model = spec.model
    if model.num_kv_heads is None or model.hidden_size is None or model.head_dim is None:
        return float(t)
    h, qw, kvw = model.hidden_size, model.query_width, model.kv_width
    kv_heads_per_rank = max(1.0, model.num_kv_heads / t)
    per_rank = 2 * h * qw / t + 2 * h * model.head_dim * kv_heads_per_rank
    return (2 * h * qw + 2 * h * kvw) / per_rank


REPLICATED_SOURCE = ("Megatron-Core: RowParallelLinear keeps its bias whole on every rank, added "
                     "after the reduction (megatron/core/tensor_parallel/layers.py; Transformer "
                     "Engine's Linear with parallel_mode='row' the same); the learned position "
                     "and token-type tables are torch.nn.Embedding, not vocabulary-parallel "
                     "(megatron/core/models/common/embeddings/language_model_embedding.py); "
                     "vLLM's RowParallelLinear and its GPT-2/OPT position tables likewise")


def _kept_whole(total: float, whole: float, divisor: float) -> float:
    """A group's divisor when `whole` of its `total` parameters stay on every rank and the
    rest split `divisor` ways: total / ((total - whole) / divisor + whole)."""
    if total <= 0 or whole <= 0:
        return divisor
    return total / ((total - whole) / divisor + whole)


def group_divisors(spec: Spec, t: int) -> dict[str, float]:
    """What tensor parallelism divides the embedding, attention and dense MLP groups by on
    one GPU: the token table by t (vocabulary-parallel) but the learned position and
    token-type tables whole; the attention projections by heads (`attention_divisor`) but
    the output projection's bias whole; the MLP's matrices and column-parallel biases by t
    but the down projection's bias whole (REPLICATED_SOURCE). A model given by its size
    alone: every group by t (the attention by heads)."""
    model = spec.model
    attention = attention_divisor(spec, t)
    if model.hidden_size is None or model.vocab_size is None:
        return {"embedding": float(t), "attention": attention, "mlp": float(t)}
    h = model.hidden_size
    found = {"embedding": _kept_whole(embedding_parameters(model),
                                      embedding_parameters(model) - model.vocab_size * h, t)}
    output_bias = h if model.attention_output_bias or model.linear_bias else 0
    found["attention"] = (_kept_whole(attention_parameters(model), output_bias, attention)
                          if model.num_attention_heads else attention)
    down_bias = h if model.linear_bias or model.mlp_bias else 0
    found["mlp"] = (_kept_whole(mlp_parameters(model, model.ffn_hidden_size), down_bias, t)
                    if model.ffn_hidden_size else float(t))
    return found


EXPERT_ADAPTERS = "expert_adapters"


def adapter_divisors(ctx: StrategyContext, t: int, experts: int) -> dict[str, float]:
    """What a tensor split divides each LoRA adapter group by on one GPU: of its P
    parameters, the split factor's S are divided by the degree and the rest stay whole,
    P / (P - S + S / degree) (llmpar.finetune.footprint, PEFT's LoraParallelLinear); the
    routed experts' adapters by the expert tensor degree."""
    tuned = ctx.footprint.finetune
    if tuned is None:
        return {}
    found = {}
    for group, total in tuned.adapters_by_group.items():
        degree = experts if group == EXPERT_ADAPTERS else t
        split = tuned.tensor_split_by_group.get(group, 0.0)
        if degree > 1 and total > 0 and split > 0:
            found[group] = total / (total - split + split / degree)
    return found


def whole_adapter_flops(ctx: StrategyContext, t: int, experts: int) -> Any:
    """The adapter products every tensor rank runs whole (A of column-parallel layers, B of
    row-parallel ones), once more on each of the other ranks, all GPUs, one step."""
    tuned = ctx.footprint.finetune
    if tuned is None or not tuned.tensor_whole_flops_by_group:
        return 0.0
    per_sequence = sum(flops * ((experts if group == EXPERT_ADAPTERS else t) - 1)
                       for group, flops in tuned.tensor_whole_flops_by_group.items())
    training = ctx.spec.training
    batch = training.global_batch_size or training.micro_batch_size * ctx.layout.degree("data")
    return per_sequence * batch


def mamba_divisor(spec: Spec, t: int) -> float:
    """How many ways a Mamba-2 layer's weights split: its heads (z, x, dt, the output
    projection) by t, its B and C by groups, each rank keeping a copy of one group past
    t > num_groups (vLLM's MambaMixer2 replicates the groups' B and C projections on the
    ranks that share them; Megatron-Core's MambaMixer needs num_groups % t == 0)."""
    model = spec.model
    mamba = model.mamba
    if mamba is None or model.hidden_size is None:
        return float(t)
    h, inner, heads = model.hidden_size, mamba.inner_width, mamba.num_heads
    grouped = 2 * h * mamba.num_groups * mamba.state_size
    split = 2 * h * inner + h * heads + inner * h
    per_rank = split / t + grouped * max(1.0, mamba.num_groups / t) / mamba.num_groups
    return (split + grouped) / per_rank


def _mixer_rules(t: int, spec: Spec, path: str) -> list[Rule]:
    """The recurrent mixers split by heads: t divides their head counts (vLLM's Qwen3-Next
    and Mamba-2 layers), and Mamba-2's groups and t divide one another."""
    linear, mamba = spec.model.linear_attention, spec.model.mamba
    found = []
    if linear is not None:
        found += [Rule(path, value % t != 0, functools.partial(
            _must_divide_message, t, f"linear_attention.{field}", value))
            for field, value in (("num_key_heads", linear.num_key_heads),
                                 ("num_value_heads", linear.num_value_heads))]
    if mamba is not None:
        groups = mamba.num_groups
        found.append(Rule(path, mamba.num_heads % t != 0, functools.partial(
            _must_divide_message, t, "mamba.num_heads", mamba.num_heads)))
        found.append(Rule(path, logical_and(groups % t != 0, t % groups != 0),
                          lambda: f"tensor degree ({t}) and model.mamba.num_groups "
                                  f"({groups}) must divide one another"))
    return found


def _must_divide_message(t: int, field: str, value: int | None) -> str:
    return f"tensor degree ({t}) must divide model.{field} ({value})"


class TensorParallel(Strategy[TensorConfig]):
    name = "tensor"
    config_type = TensorConfig
    phase = 20
    axis = Axis(token="tp", rank=10)
    vectorised = True

    def rules(self, config: TensorConfig, spec: Spec, layout: Layout) -> list[Rule]:
        t, model = config.degree, spec.model
        path = "$.parallel.tensor.degree"
        found = [Rule(path, value is not None and value % t != 0,
                      functools.partial(_must_divide_message, t, field, value))
                 for field, value in (("num_attention_heads", model.num_attention_heads),
                                      ("ffn_hidden_size", model.ffn_hidden_size))]
        kv = model.num_kv_heads
        found.append(Rule(path, kv is not None and t > 1 and kv % t != 0 and t % kv != 0,
                          lambda: f"tensor degree ({t}) and model.num_kv_heads ({kv}) must "
                                  "divide one another"))
        if model.recurrent_mixer is not None:
            found += _mixer_rules(t, spec, path)
        return found

    def transform(self, config: TensorConfig, ctx: StrategyContext) -> Transform:
        t = config.degree
        if t == 1:
            return Transform(strategy=self.name)
        whole = ctx.spec.training.profile.tensor_whole_parameters
        divisors = (group_divisors(ctx.spec, t) if whole
                    else {"attention": attention_divisor(ctx.spec, t)})
        experts = expert_tensor_degree(ctx.layout)
        # Each split once, (divisor, reason, groups); every model-state component alike.
        splits: list[tuple[Any, str, frozenset[str]]] = [
            (t, "split over tensor ranks",
             TENSOR_SPLIT_GROUPS - set(divisors) - {"mamba"} - EXPERT_GROUPS),
            (divisors["attention"], "heads split over tensor ranks" + (
                " (the output projection's bias whole)" if whole else ""),
             frozenset({"attention"}))]
        splits += [(divisors[group], reason, frozenset({group})) for group, reason in (
            ("embedding", "vocabulary split over tensor ranks (learned position and "
                          "token-type tables whole)"),
            ("mlp", "inner width split over tensor ranks (the down projection's bias "
                    "whole)")) if group in divisors]
        if ctx.spec.model.mamba is not None:
            splits.append((mamba_divisor(ctx.spec, t), "SSM heads split over tensor ranks",
                           frozenset({"mamba"})))
        if experts > 1 and has_expert_groups(ctx):  # a dense model has no experts to split
            splits.append((experts, "routed experts split over expert tensor ranks",
                           EXPERT_GROUPS - {EXPERT_ADAPTERS}))
        splits += [(divisor, "LoRA's split factor: B of column-parallel layers, A of "
                             "row-parallel ones (PEFT's LoraParallelLinear)", frozenset({group}))
                   for group, divisor in adapter_divisors(ctx, t, experts).items()]
        shards = [checked_shard(component=component, divisor=divisor, reason=reason,
                                groups=groups)
                  for component in COMPONENTS for divisor, reason, groups in splits]
        warnings = []
        kv = ctx.spec.model.num_kv_heads
        if kv is not None and t > kv:
            warnings.append(f"tensor degree ({t}) exceeds num_kv_heads ({kv}): key/value "
                            "weights are copied on every rank")
        return Transform(
            strategy=self.name, shards=tuple(shards),
            activation_splits=(ActivationSplit(tag=SPLIT_TENSOR, divisor=t,
                                               reason="tensors inside the split block"),),
            collectives=self._layer_outputs(config, ctx, t),
            product_split=ProductSplit(width=t),
            extra_flops_per_step=whole_adapter_flops(ctx, t, experts),
            warnings=tuple(warnings))

    def serving_collectives(self, config: TensorConfig, ctx: StrategyContext,
                            step: ForwardStep) -> tuple[Collective, ...]:
        """An all-reduce of the hidden states after attention and after the MLP in every
        layer (after its one module in a single-module layer, `Model.norms_in`), one after
        the vocabulary-parallel embedding, and an all-gather of the sampled rows' logits
        (vLLM's VocabParallelEmbedding and logits gather)."""
        t, model = config.degree, ctx.spec.model
        if t == 1:
            return ()
        assert model.hidden_size is not None and model.vocab_size is not None
        act = bytes_per_element(ctx.spec.precision.activations)
        common: dict[str, Any] = dict(strategy=self.name, group_size=t,
                                      group_stride=ctx.layout.stride(self.name))
        return (
            Collective(name=SERVING_LAYER_OUTPUT, operation="all-reduce",
                       buffer_bytes=step.tokens * model.hidden_size * act,
                       calls_per_step=model.norms_in(0, model.num_layers or 0) + 1,
                       reason=f"{step.phase}: attention and MLP outputs of every layer (one "
                              "output of a single-module layer), and the embedding", **common),
            Collective(name=SERVING_LOGITS, operation="all-gather",
                       buffer_bytes=step.rows * model.vocab_size * act, calls_per_step=1,
                       reason=f"{step.phase}: the sampled rows' logits over the split "
                              "vocabulary", **common))

    def _layer_outputs(self, config: TensorConfig, ctx: StrategyContext,
                       t: int) -> tuple[Collective, ...]:
        spec, layout = ctx.spec, ctx.layout
        backward = backward_input_gradient_calls(spec, layout)
        common: dict[str, Any] = dict(strategy=self.name, operation="all-reduce",
                                      buffer_bytes=hidden_state_bytes(spec, layout),
                                      group_size=t, group_stride=layout.stride(self.name))
        return (
            checked_collective(name=LAYER_OUTPUT,
                               calls_per_step=layer_collective_calls(spec, layout) - backward,
                               reason="attention and MLP outputs (forward, and again when "
                                      "recomputed), their output gradients (backward)",
                               **common),
            checked_collective(name=INPUT_GRADIENT, calls_per_step=backward,
                               overlap=1.0 if config.overlap_backward else 0.0,
                               hides_behind="weight-gradients",
                               reason="input gradients of the Q/K/V and first MLP projections "
                                      "(backward)" + (", behind the weight gradients"
                                                      if config.overlap_backward else ""),
                               **common),
        )


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(TensorParallel())


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="tensor", field="degree",
                             description="every divisor of the GPU count"))
