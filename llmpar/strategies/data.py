"""Data parallelism with ZeRO / FSDP sharding.

Replicas of the model each run their share of the batch. ZeRO (Rajbhandari et
al. 2020, arXiv:1910.02054, Sec. 5) shards the optimizer states (stage 1), the
gradients too (stage 2) and the weights too (stage 3, FSDP) across the data
ranks. The gradient all-reduce becomes a reduce-scatter from stage 2 on, and
updated weights are all-gathered; stage 3 gathers the weights in every forward
and backward pass, 1.5x the traffic of an all-reduce (ZeRO paper, Sec. 7.2.2).
Megatron-Core shards across data x context ranks; expert weights across the
expert-data ranks (data x context / expert).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from llmpar.dtypes import bytes_per_element
from llmpar.errors import Problem
from llmpar.hookspecs import hookimpl
from llmpar.placement import data_context_stride
from llmpar.search.dimension import SearchDimension
from llmpar.spec import Spec
from llmpar.spec.validators import FieldError
from llmpar.strategies.common import EXPERT_GROUPS, TENSOR_SPLIT_GROUPS, micro_batches_per_step
from llmpar.strategy import Collective, Layout, Shard, Strategy, StrategyContext, Transform

FSDP_PREFETCH_LAYERS = 2
"""FSDP keeps the gathered weights of the running layer and the prefetched next one
(PyTorch FSDP `forward_prefetch` / `backward_prefetch`; Zhao et al. 2023, arXiv:2304.11277)."""


def _degree_or_fill(_instance: Any, attribute: Any, value: int) -> None:
    if value != -1 and value < 1:
        raise FieldError(attribute.name, f"must be >= 1, or -1 for all GPUs left, got {value!r}")


def _zero_stage(_instance: Any, attribute: Any, value: int) -> None:
    if value not in (0, 1, 2, 3):
        raise FieldError(attribute.name, f"must be 0, 1, 2 or 3, got {value!r}")


@attrs.frozen(kw_only=True)
class DataConfig:
    """`[parallel.data]`."""

    degree: int = attrs.field(default=-1, validator=_degree_or_fill)
    """Replicas; -1 (the default) takes every GPU the other strategies leave."""
    zero: int = attrs.field(default=0, validator=_zero_stage)
    """ZeRO stage: 1 shards optimizer states, 2 adds gradients, 3 adds weights."""
    fsdp: bool = False
    """PyTorch FSDP: ZeRO-3 with prefetch buffers for the gathered weights."""
    overlap_grad_reduce: bool = True
    """Reduce gradients while the last micro-batch's backward pass runs."""
    overlap_param_gather: bool = True
    """Gather weights while compute runs (next forward, or prefetch under ZeRO-3)."""

    @property
    def stage(self) -> int:
        return 3 if self.fsdp else self.zero


def shard_degrees(ctx: StrategyContext) -> tuple[int, int]:
    """(ranks sharding dense weights, ranks sharding expert weights): data x context,
    and the expert-data ranks, tensor x data x context / (expert x expert tensor)."""
    layout = ctx.layout
    dense = layout.degree("data") * layout.degree("context")
    folded = dense * layout.degree("tensor") // layout.expert_tensor
    return dense, max(1, folded // layout.degree("expert"))


def parameters_per_gpu(ctx: StrategyContext, experts: bool) -> float:
    """Expert (or all other) parameters one GPU holds before ZeRO: split by tensor
    (in the groups it splits), expert (experts) and pipeline ranks, on average."""
    by_group = ctx.footprint.parameters.by_group or {"all": ctx.footprint.parameters.total}
    layout = ctx.layout
    total = 0.0
    for group, count in by_group.items():
        if (group in EXPERT_GROUPS) != experts:
            continue
        divisor = layout.degree("pipeline")
        if group in EXPERT_GROUPS:
            divisor *= layout.degree("expert") * layout.expert_tensor
        elif group in TENSOR_SPLIT_GROUPS or group == "all":
            divisor *= layout.degree("tensor")
        total += count / divisor
    return total


class DataParallel(Strategy):
    name = "data"
    config_type = DataConfig
    phase = 10
    always_active = True

    def neutral_config(self, layout: Layout) -> DataConfig | None:
        # Context ranks share the data group: one replica still shards over them and
        # reduces its gradients across them (Megatron-Core's DP x CP group).
        return DataConfig(degree=1) if layout.degree("context") == 1 else None

    def check(self, config: DataConfig, spec: Spec, layout: Layout) -> list[Problem]:
        training = spec.training
        degree = layout.degree(self.name)
        per_pass = training.micro_batch_size * degree
        batch = training.global_batch_size
        if batch is not None and batch % per_pass:
            return [Problem("$.training.global_batch_size",
                            f"global_batch_size ({batch}) must be a multiple of "
                            f"micro_batch_size ({training.micro_batch_size}) x data degree "
                            f"({degree}) = {per_pass}")]
        return []

    def transform(self, config: DataConfig, ctx: StrategyContext) -> Transform:
        dense, expert = shard_degrees(ctx)
        return Transform(
            strategy=self.name,
            micro_batches_per_step=micro_batches_per_step(ctx.spec, ctx.layout),
            shards=_shards(config.stage, dense, expert),
            collectives=_collectives(config, ctx, dense, expert),
            buffer_bytes=_fsdp_buffer_bytes(config, ctx),
            notes=(f"{ctx.layout.degree(self.name)} replicas, ZeRO stage {config.stage}",),
        )


def _shards(stage: int, dense: int, expert: int) -> tuple[Shard, ...]:
    components = ("optimizer", "gradients", "weights")[:stage]
    shards = []
    for component in components:
        reason = f"ZeRO-{stage} shards {component} across data ranks"
        shards.append(Shard(component=component, divisor=dense, reason=reason,
                            excluded=EXPERT_GROUPS))
        shards.append(Shard(component=component, divisor=expert, reason=reason,
                            groups=EXPERT_GROUPS))
    return tuple(shards)


def _collectives(config: DataConfig, ctx: StrategyContext, dense: int,
                 expert: int) -> tuple[Collective, ...]:
    spec, layout = ctx.spec, ctx.layout
    grad_size = bytes_per_element(spec.gradients_dtype)
    weight_size = bytes_per_element(spec.precision.weights)
    m = micro_batches_per_step(spec, layout)
    # The data x context ranks are one block (llmpar.placement); the expert-data group
    # steps over the expert ranks (folded into the tensor ranks when experts split over
    # fewer of them).
    dense_stride = data_context_stride(layout.order, layout.degrees)
    expert_stride = layout.stride("expert") * layout.degree("expert")
    found = []
    for label, experts, size, stride in (("dense", False, dense, dense_stride),
                                         ("expert", True, expert, expert_stride)):
        params = parameters_per_gpu(ctx, experts)
        if size <= 1 or params <= 0:
            continue
        found += _group_collectives(config, label, params * grad_size, params * weight_size,
                                    size, stride, m)
    return tuple(found)


def _group_collectives(config: DataConfig, label: str, grad_bytes: float, weight_bytes: float,
                       size: int, stride: int, m: int) -> list[Collective]:
    stage = config.stage
    grad_overlap = 1.0 if config.overlap_grad_reduce else 0.0
    gather_overlap = 1.0 if config.overlap_param_gather else 0.0
    common = dict(strategy="data", group_size=size, group_stride=stride)
    if stage == 0:
        found = [Collective(name=f"data.{label}-grad-all-reduce", operation="all-reduce",
                            buffer_bytes=grad_bytes, overlap=grad_overlap,
                            reason="sum gradients across replicas", **common)]
    else:
        calls = m if stage == 3 else 1
        found = [Collective(name=f"data.{label}-grad-reduce-scatter", operation="reduce-scatter",
                            buffer_bytes=grad_bytes, calls_per_step=calls, overlap=grad_overlap,
                            reason="sum gradient shards across replicas", **common)]
    gathers = 2 * m if stage == 3 else (1 if stage >= 1 else 0)
    if gathers:
        found.append(Collective(name=f"data.{label}-param-all-gather", operation="all-gather",
                                buffer_bytes=weight_bytes, calls_per_step=gathers,
                                overlap=gather_overlap,
                                reason=("gather weights for forward and backward" if stage == 3
                                        else "gather updated weight shards"), **common))
    return found


def _fsdp_buffer_bytes(config: DataConfig, ctx: StrategyContext) -> float:
    layers = ctx.spec.model.num_layers
    if config.stage != 3 or not layers:
        return 0.0  # a model given only by its size has no layers to prefetch
    held = parameters_per_gpu(ctx, False) + parameters_per_gpu(ctx, True)
    per_layer = held * ctx.layout.degree("pipeline") / layers
    return FSDP_PREFETCH_LAYERS * per_layer * bytes_per_element(ctx.spec.precision.weights)


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy], None]) -> None:
    register(DataParallel())


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    # The data degree is not a dimension: it takes the GPUs the others leave.
    register(SearchDimension(strategy="data", field="zero", values=(0, 1, 2, 3),
                             description="ZeRO stage (3 is FSDP's sharding)"))
