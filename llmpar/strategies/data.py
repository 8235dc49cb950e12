"""Data parallelism with ZeRO / FSDP sharding.

Replicas of the model each run their share of the batch. ZeRO (Rajbhandari et
al. 2020, arXiv:1910.02054, Sec. 5) shards the optimizer states (stage 1), the
gradients too (stage 2) and the weights too (stage 3, FSDP) across the data
ranks. The gradient all-reduce becomes a reduce-scatter from stage 2 on, and
updated weights are all-gathered; stage 3 gathers the weights in every forward
and backward pass, 1.5x the traffic of an all-reduce (ZeRO paper, Sec. 7.2.2).
Megatron-Core shards across data x context ranks; expert weights across the
expert-data ranks (data x context / expert).

What each collective hides behind (`Collective.hides_behind`): the gradient all-reduce
or reduce-scatter of stages 0 to 2 runs once per step, in buckets, while the last
micro-batch's backward pass produces the gradients (Megatron-Core's
`overlap_grad_reduce`; earlier micro-batches accumulate gradients without reducing
them, PyTorch DDP's `no_sync`); the last bucket is reduced after that pass ends. The
gather of the updated weight shards (stages 1 and 2) runs in the same buckets before
the next step's first forward pass needs them (`overlap_param_gather`). Under stage 3
each layer's weights are gathered for its forward and backward passes and its
gradients reduce-scattered, every micro-batch, one layer ahead of (or behind) the
layer that computes, so each layer's communication hides behind its neighbour's pass.

Hybrid sharding (`shard_degree`; PyTorch HSDP: FSDP2's `fully_shard` over a 2-D
DeviceMesh (replicate, shard); Zhao et al. 2023, arXiv:2304.11277, Sec. 3.2.2) shards
every state inside groups of `shard_degree` data ranks (times the context ranks) and
replicates it across the data / shard_degree groups. The gathers and reduce-scatters stay
in the shard group; each replica's gradient shard is then all-reduced across the
replicas once per step, unit by unit during the last micro-batch's backward pass (FSDP2's
`set_requires_all_reduce(False)` on the micro-batches before it). The mesh is built
row-major over the data ranks (torchtitan's `dp_replicate` outside `dp_shard`): a shard
group is the innermost `shard_degree` x context ranks of the data x context block, so
where `[parallel] order` puts the data axis places both. DeepSpeed's ZeRO++ hierarchical
partitioning (hpZ), which keeps a second weight partition per node, is another mechanism
(below).

ZeRO++ (Wang et al. 2023, arXiv:2306.10209; DeepSpeed's `zero_quantized_weights`,
`zero_hpz_partition_size`, `zero_quantized_gradients`) changes ZeRO-3's per-layer
collectives: int8 weight gathers (qwZ), the backward pass's gather from a secondary
weight partition inside a node (hpZ, at its memory), and the gradient reduce-scatter as a
hierarchical all-to-all of int4 gradients (qgZ).

Two FSDP settings change what stage 3 does per micro-batch. `reshard_after_forward = false`
(PyTorch FSDP2's `fully_shard(reshard_after_forward=False)`; DeepSpeed ZeRO-3 always
reshards) keeps the weights gathered for a micro-batch's forward pass until its backward
pass: one all-gather per micro-batch instead of two, and the stage's unsharded weights held
from the forward to the backward. `gradient_sync = "last-micro-batch"` (FSDP2's
`set_requires_gradient_sync(False)` on every micro-batch but the last, FSDP1's `no_sync()`)
accumulates unsharded gradients across the micro-batches and reduce-scatters them once per
step, layer by layer during the last micro-batch's backward pass; the stage's unsharded
gradients are held across the micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import numpy as np

from llmpar.arrays import (
    any_of,
    anywhere,
    filled,
    is_array,
    is_unset,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    where,
)
from llmpar.communication.collectives import members_per_node
from llmpar.dtypes import bytes_per_element
from llmpar.hookspecs import hookimpl
from llmpar.placement import Axis
from llmpar.search.dimension import Point, SearchDimension
from llmpar.spec import Model, Spec
from llmpar.spec.validators import FieldError, one_of, positive
from llmpar.strategies.common import (
    EXPERT_GROUPS,
    TENSOR_SPLIT_GROUPS,
    data_context_stride,
    expert_group_stride,
    expert_tensor_degree,
    has_expert_groups,
    layers_per_stage,
    micro_batches_per_step,
)
from llmpar.strategy import (
    Collective,
    GroupSelection,
    Layout,
    Rule,
    Shard,
    Strategy,
    StrategyContext,
    Transform,
    checked_collective,
    checked_shard,
)

ZERO_STAGE = "data.zero_stage"
"""The shared setting (`Layout.setting`) of the ZeRO stage: 0 to 3, 3 under FSDP."""
FSDP_PREFETCH_LAYERS = 2
"""FSDP keeps the gathered weights of the running layer and the prefetched next one
(PyTorch FSDP `forward_prefetch` / `backward_prefetch`; Zhao et al. 2023, arXiv:2304.11277)."""
BUCKET_PARAMETERS_PER_RANK = 1_000_000
BUCKET_PARAMETERS = 40_000_000
"""Gradients reduce (and updated weights gather) in buckets of max(40M, 1M x data x
context ranks) parameters: Megatron-Core's default `DistributedDataParallelConfig.
bucket_size` (megatron/core/distributed/distributed_data_parallel.py: larger groups get
larger buckets so that each collective stays bandwidth-bound). PyTorch DDP buckets the
same way, 25 MiB by default (`bucket_cap_mb`; Li et al. 2020, arXiv:2006.15704, describe
the buckets and their overlap with the backward pass)."""


GradientSync = Literal["every-micro-batch", "last-micro-batch"]
GRADIENT_SYNCS = ("every-micro-batch", "last-micro-batch")
ReduceFormat = Literal["gradients", "fp32", "bf16", "fp16"]
REDUCE_FORMATS = ("gradients", "fp32", "bf16", "fp16")


def bucket_parameters(ranks: int) -> int:
    """Parameters per gradient bucket over a data x context group of `ranks`."""
    return max(BUCKET_PARAMETERS, BUCKET_PARAMETERS_PER_RANK * ranks)


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
    """Reduce gradients while the last micro-batch's backward pass runs, bucket by bucket
    (the last bucket after it); under ZeRO-3 each layer's reduce-scatter behind the next
    layer's backward pass."""
    overlap_param_gather: bool = True
    """Gather the updated weights, bucket by bucket, while the next step's first
    micro-batch runs its forward pass (the first bucket before it); under ZeRO-3 prefetch
    each layer's weights behind the neighbouring layer's pass."""
    shard_degree: int | None = attrs.field(default=None, validator=positive)
    """Hybrid sharding (PyTorch HSDP): data ranks each shard group holds (times the
    context ranks); the states are replicated across the data degree / shard_degree
    groups, whose gradient shards are all-reduced once per step. Needs ZeRO-3 (`zero =
    3` or `fsdp = true`) and must divide the data degree; unset: the whole data group."""

    reshard_after_forward: bool = True
    """ZeRO-3: free each layer's gathered weights after its forward pass and gather them
    again for its backward pass (PyTorch FSDP2's `fully_shard(reshard_after_forward=True)`,
    its default; DeepSpeed ZeRO-3 always does). False keeps them gathered from the forward
    to the backward: one all-gather per micro-batch instead of two, and each GPU holds the
    stage's whole unsharded weights (in the gathers' format, in FSDP2's gather buffers
    beside the shard it keeps) on top of its states."""
    edge_reshard_after_forward: bool | None = None
    """ZeRO-3 / FSDP2: `reshard_after_forward` of the units outside the transformer blocks
    (the embeddings and the output layer, `EDGE_GROUPS`), where the stack wraps them apart
    from the blocks with a setting of their own. True: gathered again for every micro-
    batch's forward and its backward, two all-gathers per micro-batch; false: one per
    micro-batch. PithTrain's `apply_fsdp` (pithtrain/modules/training.py at commit
    889a4088) shards every non-"layers" child of a stage (embed_tokens, norm, lm_head)
    with `reshard_after_forward=True` and the blocks with False. Unset (the default): as
    `reshard_after_forward`. Read by the weight gathers' count only (the memory peak
    keeps `Framework.fsdp_edge_units`)."""
    gradient_sync: GradientSync = attrs.field(default="every-micro-batch",
                                              validator=one_of(*GRADIENT_SYNCS))
    """ZeRO-3: when the gradients are reduce-scattered. "every-micro-batch" (FSDP2's and
    DeepSpeed ZeRO-3's default): each layer's after its backward pass in every micro-batch.
    "last-micro-batch" (FSDP2's `set_requires_gradient_sync(False)` on all but the last
    micro-batch, FSDP1's `no_sync()`): once per step, behind the last micro-batch's
    backward pass; each GPU accumulates the stage's unsharded gradients, less the shard it
    keeps, across the micro-batches."""

    reduce_dtype: ReduceFormat = attrs.field(default="gradients",
                                             validator=one_of(*REDUCE_FORMATS))
    """The format gradients travel in when they are reduced: "gradients" (the default)
    sends them in their own format (`[precision] gradients`, or the optimizer's fp32 main
    gradients). "fp32" is PyTorch FSDP2's `MixedPrecisionPolicy(reduce_dtype=
    torch.float32)` over bf16 gradients (each reduction upcasts, then sums in fp32);
    "bf16" is Megatron-LM's `--grad-reduce-in-bf16` over fp32 main gradients. Only the
    bytes on the wire change: the gradients are kept in their own format."""

    quantized_weights: bool = False
    """ZeRO++ qwZ (Wang et al. 2023, arXiv:2306.10209, Sec. 3.2; DeepSpeed's
    `zero_quantized_weights`): ZeRO-3 gathers each layer's weights from their shards as
    blockwise int8, one byte per parameter instead of the weights' format (the blocks'
    scales and the (de)quantization kernels' time are not counted). With
    `hpz_partition_size` above 1 only the forward gathers are quantized: the backward pass
    gathers from the secondary partition, in the weights' format."""
    hpz_partition_size: int = attrs.field(default=1, validator=positive)
    """ZeRO++ hpZ (Sec. 3.3; DeepSpeed's `zero_hpz_partition_size`): after a layer's
    forward all-gather each GPU keeps a 1/h slice of the gathered weights, a secondary
    partition over the innermost h data ranks (a node's), and the layer's backward
    all-gather runs from it among those h ranks instead of over every data rank. Each GPU
    holds the stage's weights / h more, in the weights' format. 1 (the default): off.
    Needs ZeRO-3 with reshard_after_forward, and must divide the data x context ranks."""
    quantized_gradients: bool = False
    """ZeRO++ qgZ (Sec. 3.4; DeepSpeed's `zero_quantized_gradients`): each layer's
    gradient reduce-scatter under ZeRO-3 runs as two all-to-alls of blockwise int4
    gradients (half a byte per parameter), each GPU dequantizing and summing what it
    receives: first among the k data ranks of a node (the whole buffer), then among the
    ranks of the same local index on the other nodes (the 1/k of it each GPU summed)."""

    prefetch_bucket_parameters: int | None = attrs.field(default=None, validator=positive)
    """DeepSpeed ZeRO-3's `stage3_prefetch_bucket_size` (deepspeed/runtime/zero/config.py,
    its default 5e7): parameters gathered ahead of the layer that needs them. The buffer
    of gathered weights holds the running layer and up to this many parameters more; below
    one layer's parameters, only that share of the next layer's gather runs ahead, behind
    the running layer, and the rest waits until the layer starts. Unset: one layer ahead,
    as FSDP prefetches."""
    persistence_threshold_parameters: int | None = attrs.field(default=None,
                                                               validator=positive)
    """DeepSpeed ZeRO-3's `stage3_param_persistence_threshold` (the same file, its default
    1e5): weight tensors of fewer elements stay whole on every GPU, neither sharded nor
    gathered; their gradients and optimizer states shard as before. Applied by parameter
    group: a group stays whole when its largest tensor is below the threshold
    (`largest_tensor_elements`: the norms' weight vectors, a small router), so small
    tensors inside a large group (biases) still count as sharded. Unset: every weight
    shards."""

    @property
    def stage(self) -> int:
        return 3 if self.fsdp else self.zero


def shard_degrees(ctx: StrategyContext) -> tuple[int, int]:
    """(ranks sharding dense weights, ranks sharding expert weights): data x context,
    and the expert-data ranks, tensor x data x context / (expert x expert tensor)."""
    layout = ctx.layout
    dense = layout.degree("data") * layout.degree("context")
    folded = dense * layout.degree("tensor") // expert_tensor_degree(layout)
    return dense, max(1, folded // layout.degree("expert"))


def replicas(config: DataConfig, layout: Layout) -> Any:
    """Groups the states are replicated across under hybrid sharding: data degree /
    shard_degree (1 without it; at least 1 where the rules reject the shard degree).
    An integer array where a search node's `shard_degree` is one."""
    shard = config.shard_degree
    if shard is None:
        return 1
    data = layout.degree("data")
    if not is_array(shard):
        return max(1, data // shard)
    # Unset reads as the whole data group: one replica, as above.
    return np.maximum(1, data // filled(shard, data))


def hybrid_degrees(ctx: StrategyContext, copies: Any) -> tuple[Any, Any]:
    """(ranks sharding dense weights, ranks sharding expert weights) over `copies`
    replicas (`replicas`): `shard_degrees` divided by them (the same for one); integer
    arrays where `copies` is one."""
    dense, expert = shard_degrees(ctx)
    return maximum(1, dense // copies), maximum(1, expert // copies)


def parameters_per_gpu(ctx: StrategyContext, experts: bool,
                       counts: Mapping[str, float] | None = None) -> float:
    """Expert (or all other) parameters one GPU holds before ZeRO: split by tensor
    (in the groups it splits), expert (experts) and pipeline ranks, on average; of
    `counts` by group when given (the trainable ones, the stored weights)."""
    layout = ctx.layout
    total = 0.0
    given = ctx.footprint.parameters_by_group if counts is None else counts
    if experts and EXPERT_GROUPS.isdisjoint(given):
        return total  # no expert group: nothing to add
    pipeline = layout.degree("pipeline")
    if experts:
        expert = pipeline * (layout.degree("expert") * expert_tensor_degree(layout))
    else:
        tensor = pipeline * layout.degree("tensor")
    for group, count in given.items():
        if (group in EXPERT_GROUPS) != experts:
            continue
        if experts:
            divisor = expert
        elif group in TENSOR_SPLIT_GROUPS or group == "all":
            divisor = tensor
        else:
            divisor = pipeline
        total += count / divisor
    return total


def zero_stage(config: DataConfig) -> Any:
    """The ZeRO stage: `zero`, or 3 under FSDP (an array where `zero` is one)."""
    return where(config.fsdp, 3, config.zero)


SHARD_PATH = "$.parallel.data.shard_degree"


def _shard_rules(config: DataConfig, layout: Layout) -> list[Rule]:
    """Hybrid sharding needs ZeRO-3, a shard degree that divides the data degree and,
    with experts sharded over fewer ranks, replicas that divide those ranks too. On a
    search node's array of shard degrees each rule holds only where one is set."""
    s = config.shard_degree
    if s is None:
        return []
    d = layout.degree("data")
    stage = zero_stage(config)
    given = logical_not(is_unset(s))
    shard = filled(s, d)  # unset: the whole data group, which every rule accepts
    divides = d % shard == 0
    found = [
        Rule(SHARD_PATH, logical_and(given, stage != 3),
             lambda: f"shard_degree ({s}) needs parallel.data.zero = 3 or parallel.data.fsdp "
                     "= true: hybrid sharding (PyTorch HSDP) shards every state inside the "
                     "group (ZeRO++'s hpZ for ZeRO-1 and -2 is not modelled)"),
        Rule(SHARD_PATH, logical_and(given, logical_not(divides)),
             lambda: f"shard_degree ({s}) must divide the data degree ({d})"),
    ]
    if layout.degree("expert") > 1 and anywhere(divides):
        copies = where(divides, d // shard, 1)
        folded = (d * layout.degree("context") * layout.degree("tensor")
                  // expert_tensor_degree(layout))
        expert_data = max(1, folded // layout.degree("expert"))
        found.append(Rule(
            SHARD_PATH, logical_and(given, logical_and(divides, expert_data % copies != 0)),
            lambda: f"the replicas of shard_degree ({s}), data degree / shard_degree = "
                    f"{copies}, must divide the expert-data ranks ({expert_data}) that "
                    "shard the expert weights"))
    return found


HPZ_PATH = "$.parallel.data.hpz_partition_size"
QUANTIZED_WEIGHT_BYTES = 1.0
"""qwZ: int8 weights, one byte per parameter (Wang et al. 2023, Sec. 3.2)."""
QUANTIZED_GRADIENT_BYTES = 0.5
"""qgZ: int4 gradients, half a byte per parameter (Wang et al. 2023, Sec. 3.4)."""


def uses_zeropp(config: DataConfig) -> bool:
    """Whether any of ZeRO++'s three settings is on."""
    return bool(config.quantized_weights or config.quantized_gradients
                or config.hpz_partition_size != 1)


def _zeropp_rules(config: DataConfig, layout: Layout) -> list[Rule]:
    """ZeRO++ changes ZeRO-3's collectives (DeepSpeed accepts its settings under stage 3
    only); hpZ's secondary partition tiles the shard group and needs the backward gather
    that `reshard_after_forward = false` removes."""
    if not uses_zeropp(config):
        return []
    stage = zero_stage(config)
    h = config.hpz_partition_size
    ranks = layout.degree("data") * layout.degree("context")
    needs = "needs parallel.data.zero = 3 or parallel.data.fsdp = true"
    def stage_rule(key: str, on: bool) -> Rule:
        return Rule(f"$.parallel.data.{key}", logical_and(on, stage != 3),
                    lambda: f"{key} (ZeRO++) {needs}: it changes ZeRO-3's per-layer "
                            f"collectives, which ZeRO stage {stage} does not run")

    found = [stage_rule(key, on) for key, on in (
        ("quantized_weights", config.quantized_weights),
        ("quantized_gradients", config.quantized_gradients),
        ("hpz_partition_size", h != 1))]
    if h != 1:
        found += [
            Rule(HPZ_PATH, ranks % h != 0,
                 lambda: f"hpz_partition_size ({h}) must divide the data x context ranks "
                         f"({ranks}) that shard the weights"),
            Rule(HPZ_PATH, keeps_weights_gathered(config),
                 lambda: f"hpz_partition_size ({h}) needs reshard_after_forward = true: hpZ "
                         "serves the backward pass's gather, which keeping the weights "
                         "gathered removes"),
            # (a search node's shard degrees: where one is set)
            Rule(HPZ_PATH, logical_not(is_unset(config.shard_degree)),
                 lambda: f"hpz_partition_size ({h}) with shard_degree "
                         f"({config.shard_degree}): hybrid sharding and ZeRO++'s secondary "
                         "partition are two mechanisms; choose one"),
        ]
    return found


def largest_tensor_elements(model: Model, group: str) -> int | None:
    """Elements of the largest weight tensor of a parameter group (for DeepSpeed's
    persistence threshold); None where the model does not say (a model given by size)."""
    h = model.hidden_size
    if h is None or model.ffn_hidden_size is None:
        return None
    moe = model.moe
    vectors = [h, model.query_width if model.qk_norm else 0]
    if model.mla is not None:
        vectors += [model.mla.kv_lora_rank, model.mla.q_lora_rank or 0]
    sizes = {
        "norms": max(vectors),
        "router": h * moe.num_experts if moe is not None else None,
        "attention": h * max(model.query_width, model.attention_output_width),
        "mlp": h * model.ffn_hidden_size,
        "experts": h * moe.expert_ffn_hidden_size if moe is not None else None,
        "shared_experts": (h * (moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size)
                           if moe is not None else None),
        "embedding": h * (model.vocab_size or 0),
        "head": h * (model.vocab_size or 0),
        "pooler": h * h,
    }
    return sizes.get(group)


def persistent_groups(config: DataConfig, ctx: StrategyContext) -> frozenset[str]:
    """The groups whose weights stay whole under `persistence_threshold_parameters`."""
    threshold = config.persistence_threshold_parameters
    if threshold is None:
        return frozenset()
    model = ctx.spec.model
    found = set()
    for group in ctx.footprint.parameters_by_group:
        largest = largest_tensor_elements(model, group)
        if largest is not None and largest < threshold and group not in EXPERT_GROUPS:
            found.add(group)
    return frozenset(found)


def _deepspeed_rules(config: DataConfig) -> list[Rule]:
    """Both settings are ZeRO-3's (DeepSpeed reads them under stage 3 only)."""
    stage = zero_stage(config)

    def rule(key: str, value: int | None) -> Rule:
        return Rule(f"$.parallel.data.{key}", logical_and(value is not None, stage != 3),
                    lambda: f"{key} (DeepSpeed ZeRO-3's) needs parallel.data.zero = 3 or "
                            f"parallel.data.fsdp = true, got ZeRO stage {stage}")

    return [rule("prefetch_bucket_parameters", config.prefetch_bucket_parameters),
            rule("persistence_threshold_parameters", config.persistence_threshold_parameters)]


RESHARD_PATH = "$.parallel.data.reshard_after_forward"
SYNC_PATH = "$.parallel.data.gradient_sync"


def keeps_weights_gathered(config: DataConfig) -> Any:
    """`reshard_after_forward = false` (a boolean array where the field is one)."""
    return logical_not(config.reshard_after_forward)


def syncs_last_micro_batch(config: DataConfig) -> Any:
    """`gradient_sync = "last-micro-batch"` (a boolean array where the field is one)."""
    return np.asarray(config.gradient_sync) == "last-micro-batch" if is_array(
        config.gradient_sync) else config.gradient_sync == "last-micro-batch"


def _fsdp_setting_rules(config: DataConfig) -> list[Rule]:
    """The FSDP settings change what ZeRO-3 does per micro-batch; under stages 0 to 2
    there is no per-micro-batch gather or reduce-scatter for them to change."""
    stage = zero_stage(config)
    needs = "needs parallel.data.zero = 3 or parallel.data.fsdp = true"
    return [
        Rule(RESHARD_PATH, logical_and(keeps_weights_gathered(config), stage != 3),
             lambda: f"reshard_after_forward = false {needs} (ZeRO-3 / FSDP gathers the "
                     f"weights per micro-batch; ZeRO stage {stage} does not)"),
        Rule(SYNC_PATH, logical_and(syncs_last_micro_batch(config), stage != 3),
             lambda: f'gradient_sync = "last-micro-batch" {needs} (ZeRO-3 / FSDP '
                     f"reduce-scatters the gradients per micro-batch; ZeRO stage {stage} "
                     "already reduces them once per step)"),
    ] + _edge_rules(config, stage, needs)


EDGE_RESHARD_PATH = "$.parallel.data.edge_reshard_after_forward"


def _edge_rules(config: DataConfig, stage: Any, needs: str) -> list[Rule]:
    """`edge_reshard_after_forward` is FSDP2's setting of the edge units: it needs ZeRO-3,
    and neither DeepSpeed's gathers (which fetch every submodule alike) nor ZeRO++'s."""
    edge = config.edge_reshard_after_forward
    if edge is None:
        return []
    deepspeed = uses_deepspeed_settings(config) or uses_zeropp(config)
    return [
        Rule(EDGE_RESHARD_PATH, stage != 3,
             lambda: f"edge_reshard_after_forward = {str(edge).lower()} {needs} (ZeRO-3 / "
                     f"FSDP gathers the weights per micro-batch; ZeRO stage {stage} does "
                     "not)"),
        Rule(EDGE_RESHARD_PATH, deepspeed,
             lambda: f"edge_reshard_after_forward = {str(edge).lower()} is FSDP2's "
                     "per-unit setting; DeepSpeed ZeRO-3 and ZeRO++ (prefetch_bucket_"
                     "parameters, persistence_threshold_parameters, quantized_weights, "
                     "quantized_gradients, hpz_partition_size) gather every module alike"),
    ]


class DataParallel(Strategy[DataConfig]):
    name = "data"
    config_type = DataConfig
    phase = 10
    always_active = True
    axis = Axis(token="dp", rank=40)
    vectorised = True

    def shared_settings(self, config: DataConfig) -> dict[str, Any]:
        return {ZERO_STAGE: zero_stage(config)}

    def neutral_config(self, layout: Layout) -> DataConfig | None:
        # Context ranks share the data group: one replica still shards over them and
        # reduces its gradients across them (Megatron-Core's DP x CP group).
        return DataConfig(degree=1) if layout.degree("context") == 1 else None

    def rules(self, config: DataConfig, spec: Spec, layout: Layout) -> list[Rule]:
        training = spec.training
        degree = layout.degree(self.name)
        per_pass = training.micro_batch_size * degree
        batch = training.global_batch_size
        found = (_shard_rules(config, layout) + _fsdp_setting_rules(config)
                 + _zeropp_rules(config, layout) + _deepspeed_rules(config))
        if batch is None:
            return found
        return [Rule("$.training.global_batch_size", batch % per_pass != 0,
                     lambda: f"global_batch_size ({batch}) must be a multiple of "
                             f"micro_batch_size ({training.micro_batch_size}) x data degree "
                             f"({degree}) = {per_pass}")] + found

    def transform(self, config: DataConfig, ctx: StrategyContext) -> Transform:
        copies = replicas(config, ctx.layout)
        if is_array(copies):
            # A search node's layouts whose shard degree the rules reject take one
            # replica: nothing reads their numbers, and the replica group of a shard
            # degree that does not divide the expert-data ranks would not fit the cluster.
            rejected = [rule.fails for rule in _shard_rules(config, ctx.layout)]
            copies = where(any_of(rejected), 1, copies)
        dense, expert = hybrid_degrees(ctx, copies)
        stage = zero_stage(config)
        notes: tuple[str, ...] = () if is_array(stage) else (
            f"{ctx.layout.degree(self.name)} replicas, ZeRO stage {stage}",)
        if not is_array(stage) and not is_array(copies) and copies > 1:
            notes += (f"hybrid sharding: states sharded over {dense} ranks, replicated "
                      f"{copies} times",)
        if reduce_format(config, ctx.spec) != ctx.spec.gradients_dtype:
            notes += (f"gradients reduced in {config.reduce_dtype} (kept in "
                      f"{ctx.spec.gradients_dtype})",)
        return Transform(
            strategy=self.name,
            micro_batches_per_step=micro_batches_per_step(ctx.spec, ctx.layout),
            shards=_shards(stage, dense, expert, persistent_groups(config, ctx),
                           has_expert_groups(ctx)),
            collectives=_collectives(config, ctx, stage, copies, (dense, expert)),
            buffer_bytes=_buffer_bytes(config, ctx, stage, dense, expert),
            notes=notes, mechanisms=_mechanisms(config, stage, copies, dense),
        )


def _buffer_bytes(config: DataConfig, ctx: StrategyContext, stage: Any, dense: Any,
                  expert: Any) -> Any:
    """ZeRO-3's buffers: the gathered weights in flight, what the FSDP settings hold and
    hpZ's secondary partition; none below stage 3 (one layout's stage below 3 takes 0
    at once, without the formulas whose values it would drop)."""
    if not is_array(stage) and stage != 3:
        return 0.0
    return where(stage == 3, where(
        stack_keeps_stage_unsharded(ctx), 0.0,
        where(keeps_weights_gathered(config), 0.0, _fsdp_buffer_bytes(ctx, config))
        + _held_unsharded_bytes(config, ctx, dense, expert))
        + _secondary_partition_bytes(config, ctx),
        0.0)


def _mechanisms(config: DataConfig, stage: Any, copies: Any,
                dense: Any) -> tuple[str, ...]:
    """The mechanisms validation rows check on their own that this layout runs (none
    stated for a search node's arrays: only a plan quotes them)."""
    if is_array(stage) or is_array(copies) or is_array(dense) or stage != 3 or dense == 1:
        return ()
    return (("zero-3",) + (("hybrid-sharding",) if copies > 1 else ())
            + (("zero++",) if uses_zeropp(config) else ()))


def _shards(stage: Any, dense: Any, expert: Any,
            persistent: frozenset[str] = frozenset(), experts: bool = True
            ) -> tuple[Shard, ...]:
    """ZeRO's shards; the weights of `persistent` groups stay whole (DeepSpeed's
    persistence threshold); the expert groups' only where the model has them
    (`experts`)."""
    if not anywhere(logical_or(dense != 1, logical_and(experts, expert != 1))):
        return ()
    shards = []
    for component, level in (("optimizer", 1), ("gradients", 2), ("weights", 3)):
        if not is_array(stage) and stage < level:  # one layout: no shard below its stage
            continue
        reason = f"ZeRO-{level} and above shard {component} across data ranks"
        whole = persistent if component == "weights" else frozenset()
        shards.append(checked_shard(component=component, divisor=where(stage >= level, dense, 1),
                                    reason=reason, excluded=EXPERT_GROUPS | whole))
        if experts:
            shards.append(checked_shard(component=component,
                                        divisor=where(stage >= level, expert, 1),
                                        reason=reason, groups=EXPERT_GROUPS))
    return tuple(shards)


def _collectives(config: DataConfig, ctx: StrategyContext, stage: Any, copies: Any,
                 degrees: tuple[Any, Any] | None = None) -> tuple[Collective, ...]:
    """The data-parallel collectives. Group sizes are plain integers, so where a search
    node's replica counts vary (its shard degrees), each count states its own set, with
    stage -1 (no stage's collectives run) where another count applies."""
    if not is_array(copies):
        return _collectives_of(config, ctx, stage, copies, degrees)
    found: tuple[Collective, ...] = ()
    for count in np.unique(copies).tolist():
        found += _collectives_of(config, ctx, where(copies == count, stage, -1), int(count))
    return found


def reduce_format(config: DataConfig, spec: Spec) -> str:
    """The format gradients are reduced in: `reduce_dtype`, or the gradients' own."""
    return spec.gradients_dtype if config.reduce_dtype == "gradients" else config.reduce_dtype


def _collectives_of(config: DataConfig, ctx: StrategyContext, stage: Any, copies: int,
                    degrees: tuple[Any, Any] | None = None) -> tuple[Collective, ...]:
    """The collectives over `copies` replicas of the states (`degrees`: their
    `hybrid_degrees`, where the caller has them)."""
    spec, layout = ctx.spec, ctx.layout
    dense, expert = hybrid_degrees(ctx, copies) if degrees is None else degrees
    grad_size = bytes_per_element(reduce_format(config, spec))
    weight_size = bytes_per_element(spec.precision.weight_gather_under(spec.training.profile))
    m = micro_batches_per_step(spec, layout)
    # The data x context ranks are one block (llmpar.placement); the expert-data group
    # steps over the expert ranks (folded into the tensor ranks when experts split over
    # fewer of them).
    dense_stride = data_context_stride(layout)
    has_experts = has_expert_groups(ctx)  # only a model with experts has their collectives
    expert_stride = expert_group_stride(layout) * layout.degree("expert") if has_experts else 1
    layers = layers_per_stage(spec, layout)
    windows = _Windows(bucket_parameters=bucket_parameters(dense),
                       layers=layers if layers >= 1 else None)
    found: list[dict[str, Any]] = []
    for label, selection, size, stride in (
            ("dense", DENSE_GROUPS, dense, dense_stride),
            ("expert", EXPERT_SELECTION, expert, expert_stride)):
        if label == "expert" and not has_experts:
            continue
        common: dict[str, Any] = dict(strategy="data", group_size=size, group_stride=stride,
                                      parameter_groups=selection)
        if size > 1:
            group = _group_collectives(config, label, stage, grad_size, weight_size,
                                       windows, common, m)
            group = _zeropp(config, group, spec, m) if uses_zeropp(config) else group
            if uses_deepspeed_settings(config):
                group = _deepspeed_gathers(config, ctx, group, label)
            found += group
        if copies > 1:
            found.append(_replica_all_reduce(config, label, stage, grad_size, windows,
                                             common, copies))
    # One layout states only the collectives its stage runs; a search node states each
    # wherever it may run (calls 0 elsewhere), and none that runs nowhere in it.
    return tuple([checked_collective(**fields) for fields in found
                  if anywhere(fields["calls_per_step"] != 0)])


DENSE_GROUPS = GroupSelection(excluded=EXPERT_GROUPS)
"""The dense data-parallel group's parameters: all but those on expert-parallel ranks."""
EXPERT_SELECTION = GroupSelection(groups=EXPERT_GROUPS)
"""The expert-data group's parameters."""


@attrs.frozen
class _Windows:
    """How the data-parallel collectives run in pieces: buckets of this many parameters
    (stages 0 to 2), or one piece per layer of the stage (stage 3; None without layers)."""

    bucket_parameters: int
    layers: float | None


def _replica_all_reduce(config: DataConfig, label: str, stage: Any, grad_size: float,
                        windows: _Windows, common: dict[str, Any],
                        copies: int) -> dict[str, Any]:
    """Hybrid sharding: each rank's gradient shard (1/shard-group of the gradients)
    all-reduced across the `copies` replicas, once per step: FSDP2 reduces each unit's
    shard right after its reduce-scatter in the last micro-batch's backward pass (the
    first layer's last); the replicas of one shard sit a whole shard group apart."""
    size, stride = common["group_size"], common["group_stride"]
    replica = dict(common, group_size=copies, group_stride=stride * size)
    return dict(name=f"data.{label}-grad-replica-all-reduce", operation="all-reduce",
                calls_per_step=where(stage == 3, 1.0, 0.0),
                overlap=1.0 if config.overlap_grad_reduce else 0.0,
                hides_behind="last-backward", pieces=windows.layers,
                bytes_per_parameter=grad_size / size, component="gradients",
                reason="sum the gradient shards across the replicas of hybrid "
                       "sharding (HSDP), once per step", **replica)


def _group_collectives(config: DataConfig, label: str, stage: Any, grad_size: float,
                       weight_size: float, windows: _Windows, common: dict[str, Any],
                       m: Any) -> list[dict[str, Any]]:
    """The fields of the gradient and weight collectives in the shard group (calls 0
    where the stage does not run them)."""
    grad_overlap = 1.0 if config.overlap_grad_reduce else 0.0
    gather_overlap = 1.0 if config.overlap_param_gather else 0.0
    gradients: dict[str, Any] = dict(bytes_per_parameter=grad_size, component="gradients",
                                     **common)
    weights: dict[str, Any] = dict(bytes_per_parameter=weight_size, component="weights",
                                   **common)
    sharded = logical_and(stage >= 1, stage <= 2)
    fsdp = stage == 3
    # Weights kept gathered from the forward to the backward need no second gather.
    gathers = where(keeps_weights_gathered(config), m, 2 * m)
    edge_gathers = edge_gathers_per_step(config, m) if label == "dense" else None
    last = syncs_last_micro_batch(config)
    once: dict[str, Any] = dict(hides_behind="last-backward",
                                bucket_bytes=windows.bucket_parameters * grad_size)
    per_layer: dict[str, Any] = dict(hides_behind="layers", pieces=windows.layers)
    gather = "gather the updated weight shards (ZeRO-1 and -2)"
    layer_gathers: list[dict[str, Any]] = [dict(
        name=f"data.{label}-param-all-gather", operation="all-gather",
        calls_per_step=where(fsdp, gathers, 0.0), overlap=gather_overlap,
        reason="gather each layer's weights for its forward and backward passes "
               "(ZeRO-3; once per micro-batch where reshard_after_forward = false)",
        **per_layer, **weights)]
    if edge_gathers is not None:
        # The blocks' gathers, and the edge units' at their own count.
        selection = common["parameter_groups"]
        layer_gathers[0]["parameter_groups"] = GroupSelection(
            groups=selection.groups, excluded=selection.excluded | EDGE_GROUPS)
        layer_gathers.append(dict(
            layer_gathers[0], name=f"data.{label}-edge-param-all-gather",
            calls_per_step=where(fsdp, edge_gathers, 0.0),
            parameter_groups=GroupSelection(groups=EDGE_GROUPS), busiest_stage=True,
            reason="gather the embeddings' and the output layer's weights for each "
                   "micro-batch's forward and backward passes, on the stage that holds "
                   "them (ZeRO-3; once per micro-batch where edge_reshard_after_forward "
                   "= false)"))
    return [
        dict(name=f"data.{label}-grad-all-reduce", operation="all-reduce",
             calls_per_step=where(stage == 0, 1.0, 0.0), overlap=grad_overlap,
             reason="sum gradients across replicas", **once, **gradients),
        dict(name=f"data.{label}-grad-reduce-scatter", operation="reduce-scatter",
             calls_per_step=where(sharded, 1.0, 0.0), overlap=grad_overlap,
             reason="sum gradient shards across replicas", **once, **gradients),
        dict(name=f"data.{label}-grad-reduce-scatter", operation="reduce-scatter",
             calls_per_step=where(logical_and(fsdp, logical_not(last)), m, 0.0),
             overlap=grad_overlap,
             reason="sum each layer's gradient shards across replicas, every "
                    "micro-batch (ZeRO-3)", **per_layer, **gradients),
        dict(name=f"data.{label}-grad-reduce-scatter", operation="reduce-scatter",
             calls_per_step=where(logical_and(fsdp, last), 1.0, 0.0), overlap=grad_overlap,
             hides_behind="last-backward", pieces=windows.layers,
             reason="sum each layer's accumulated gradients into shards across replicas, "
                    'once per step (ZeRO-3, gradient_sync = "last-micro-batch")',
             **gradients),
        dict(name=f"data.{label}-param-all-gather", operation="all-gather",
             calls_per_step=where(sharded, 1.0, 0.0), overlap=gather_overlap,
             hides_behind="first-forward",
             bucket_bytes=windows.bucket_parameters * weight_size,
             reason=f"{gather}, before the next forward pass", **weights),
    ] + layer_gathers


def edge_gathers_per_step(config: DataConfig, m: Any) -> Any:
    """The edge units' all-gathers per step under `edge_reshard_after_forward` (FSDP2's
    `FSDPParamGroup.post_forward` reshards a unit whose reshard_after_forward is True and
    its pre-backward hook gathers it again: torch/distributed/fsdp/_fully_shard/
    _fsdp_param_group.py, PyTorch 2.10): 2 per micro-batch when resharded after forward,
    1 when kept; None where the key is unset (the edges gather with the blocks)."""
    edge = config.edge_reshard_after_forward
    if edge is None:
        return None
    return where(logical_not(edge), m, 2 * m)


def _zeropp(config: DataConfig, group: list[dict[str, Any]], spec: Spec,
            m: Any) -> list[dict[str, Any]]:
    """ZeRO-3's per-layer collectives of one shard group as ZeRO++ runs them (Wang et al.
    2023, arXiv:2306.10209): the weight all-gathers split into the forward's, from the
    primary shards (int8 under qwZ), and the backward's, from hpZ's secondary partition
    among h ranks; the gradient reduce-scatters as qgZ's two int4 all-to-alls. Across the
    nodes, ZeRO-3's 3M per step (M the weights in 16 bits: two gathers and a
    reduce-scatter) becomes 0.5M + 0 + M/4 = 0.75M with all three (Sec. 3)."""
    h = config.hpz_partition_size
    found = []
    for fields in group:
        # ZeRO-3's own: per layer (ZeRO-1 and -2 reduce and gather in buckets once a step)
        zero_3 = "bucket_bytes" not in fields
        if fields["operation"] == "all-gather" and zero_3:
            found += _zeropp_gathers(config, fields, m, h)
        elif fields["operation"] == "reduce-scatter" and zero_3 and config.quantized_gradients:
            found += _qgz_all_to_alls(fields, spec)
        else:
            found.append(fields)
    return found


def _zeropp_gathers(config: DataConfig, fields: dict[str, Any], m: Any,
                    h: int) -> list[dict[str, Any]]:
    """The forward gathers (m per step) from the primary shards, int8 under qwZ; the
    backward's (m more, under reshard_after_forward) from the secondary partition in the
    weights' format among the innermost h ranks, or like the forward's without hpZ."""
    weight = fields["bytes_per_parameter"]
    primary = QUANTIZED_WEIGHT_BYTES if config.quantized_weights else weight
    calls = fields["calls_per_step"]
    if h == 1:
        return [dict(fields, bytes_per_parameter=primary,
                     reason=fields["reason"] + ", int8 (ZeRO++ qwZ)")]
    fsdp = calls != 0
    # an expert shard group smaller than h keeps its secondary partition over what it shares
    h = math.gcd(h, fields["group_size"])
    forward = dict(fields, calls_per_step=where(fsdp, m, 0.0), bytes_per_parameter=primary,
                   reason="gather each layer's weights for its forward pass from the primary "
                          "shards (ZeRO-3" + (", int8: ZeRO++ qwZ" if config.quantized_weights
                                              else "") + ")")
    secondary = dict(fields, name=fields["name"].replace("param-all-gather",
                                                         "param-secondary-all-gather"),
                     calls_per_step=where(fsdp, m, 0.0), group_size=h,
                     reason="gather each layer's weights for its backward pass from the "
                            "secondary partition among h ranks (ZeRO++ hpZ)")
    return [forward, secondary]


def _qgz_all_to_alls(fields: dict[str, Any], spec: Spec) -> list[dict[str, Any]]:
    """qgZ's hierarchical all-to-all in place of a reduce-scatter over n ranks with k in
    each node: int4 gradients among the k (the whole buffer), then among the n / k ranks of
    one local index across the nodes, k apart (1/k of the buffer: what each GPU summed)."""
    n, stride = fields["group_size"], fields["group_stride"]
    k = members_per_node(n, stride, spec.hardware.gpus_per_node)
    base = dict(fields, operation="all-to-all",
                bytes_per_parameter=QUANTIZED_GRADIENT_BYTES)
    found = []
    if k > 1:
        found.append(dict(base, name=fields["name"].replace("reduce-scatter",
                                                            "quantized-all-to-all"),
                          group_size=k,
                          reason=fields["reason"] + f"; int4 all-to-all among the {k} ranks "
                                                    "of a node (ZeRO++ qgZ)"))
    if n // k > 1:
        found.append(dict(base, name=fields["name"].replace("reduce-scatter",
                                                            "quantized-all-to-all-nodes"),
                          group_size=n // k, group_stride=stride * k,
                          bytes_per_parameter=QUANTIZED_GRADIENT_BYTES / k,
                          reason=fields["reason"] + f"; int4 all-to-all of the 1/{k} each "
                                                    "GPU summed, across the nodes (ZeRO++ qgZ)"))
    return found


def uses_deepspeed_settings(config: DataConfig) -> bool:
    return (config.prefetch_bucket_parameters is not None
            or config.persistence_threshold_parameters is not None)


def _deepspeed_gathers(config: DataConfig, ctx: StrategyContext, group: list[dict[str, Any]],
                       label: str) -> list[dict[str, Any]]:
    """ZeRO-3's per-layer weight gathers under DeepSpeed's two settings: the persistent
    groups' weights are not gathered; with a prefetch bucket below a layer's parameters
    only bucket / layer of each gather runs ahead, behind the running layer."""
    persistent = persistent_groups(config, ctx)
    share = _prefetched_share(config, ctx)
    found = []
    for fields in group:
        if fields["operation"] == "all-gather" and "bucket_bytes" not in fields:
            fields = dict(fields, overlap=fields["overlap"] * share)
            if persistent and label == "dense":
                fields["parameter_groups"] = GroupSelection(excluded=EXPERT_GROUPS | persistent)
        found.append(fields)
    return found


EDGE_GROUPS = frozenset({"embedding", "head"})
"""The groups outside the transformer blocks that FSDP wraps as units of their own (or
leaves to the root unit): the memory peak counts their gathered weights at the moments
they are alive (`Framework.fsdp_edge_units`)."""


def _layer_parameters(ctx: StrategyContext) -> tuple[float, float] | None:
    """(one transformer block's weights on a GPU before ZeRO, the stage's), as stored;
    None for a model given by its size (no layers). A block holds neither the embeddings
    nor the output layer (each FSDP unit gathers one module: torchtitan's apply_fsdp and
    Megatron-Core's torch FSDP2 wrap them apart from the blocks), so they are not spread
    over the layers."""
    layers = ctx.spec.model.num_layers
    if not layers:
        return None
    stored = ctx.footprint.stored_weights_by_group
    held = parameters_per_gpu(ctx, False, stored) + parameters_per_gpu(ctx, True, stored)
    blocks = {group: count for group, count in stored.items() if group not in EDGE_GROUPS}
    block = parameters_per_gpu(ctx, False, blocks) + parameters_per_gpu(ctx, True, blocks)
    return block * ctx.layout.degree("pipeline") / layers, held


def _prefetched_share(config: DataConfig, ctx: StrategyContext) -> float:
    """The share of a layer's gather DeepSpeed issues ahead of it: bucket / the layer's
    parameters, at most 1 (1 without a bucket)."""
    bucket, sizes = config.prefetch_bucket_parameters, _layer_parameters(ctx)
    if bucket is None or sizes is None or sizes[0] <= 0:
        return 1.0
    return min(1.0, bucket / sizes[0])


def _secondary_partition_bytes(config: DataConfig, ctx: StrategyContext) -> float:
    """hpZ: each GPU's 1/h of the stage's weights in their own format, beside its primary
    shard (Wang et al. 2023, Sec. 3.3: the memory hpZ trades for communication)."""
    h = config.hpz_partition_size
    if h == 1:
        return 0.0
    stored = ctx.footprint.stored_weights_by_group
    dense, expert = shard_degrees(ctx)
    held = (parameters_per_gpu(ctx, False, stored) / math.gcd(h, dense)
            + parameters_per_gpu(ctx, True, stored) / math.gcd(h, expert))
    return held * bytes_per_element(ctx.spec.precision.weights)


def stack_keeps_stage_unsharded(ctx: StrategyContext) -> Any:
    """Whether the framework keeps each pipeline stage's weights gathered for the whole
    step and its gradients unsharded until the last micro-batch
    (`Framework.pipeline_keeps_unsharded`, torchtitan, under pipeline parallelism). Then
    FSDP's per-layer gathers fill those held weights, so neither the gathered layers in
    flight (`_fsdp_buffer_bytes`) nor the FSDP settings' held weights and gradients
    (`_held_unsharded_bytes`) are buffers of their own: the memory peak counts the
    stage's unsharded weights and gradients at the moments they are alive
    (llmpar.evaluation.peak.unsharded_blocks)."""
    return logical_and(ctx.spec.training.profile.pipeline_keeps_unsharded,
                       ctx.layout.degree("pipeline") > 1)


def _fsdp_buffer_bytes(ctx: StrategyContext, config: DataConfig) -> float:
    """The gathered weights held at once: the running block and the prefetched one
    (FSDP), or DeepSpeed's prefetch bucket beside the running block, at most the rest of
    the stage (the embeddings' and the output layer's units: the memory peak's
    `fsdp_edge_units`)."""
    sizes = _layer_parameters(ctx)
    if sizes is None:
        return 0.0  # a model given only by its size has no layers to prefetch
    per_layer, held = sizes
    bucket = config.prefetch_bucket_parameters
    gathered = (FSDP_PREFETCH_LAYERS * per_layer if bucket is None
                else per_layer + min(bucket, max(0.0, held - per_layer)))
    return gathered * bytes_per_element(ctx.spec.precision.weight_gather_under(
        ctx.spec.training.profile))


def _held_unsharded_bytes(config: DataConfig, ctx: StrategyContext, dense: Any,
                          expert: Any) -> Any:
    """What the FSDP settings hold beyond the states, over `dense` and `expert` shard
    ranks: under reshard_after_forward = false the stage's whole gathered weights, in the
    format the gathers carry (FSDP2 gathers into buffers of its own beside the sharded
    parameter, whatever the formats: FSDPParam.all_gather_outputs and
    _sharded_param_data, torch/distributed/fsdp/_fully_shard/_fsdp_param.py, PyTorch
    2.13; measured with validation/measure_peak_fsdp.py), which hold the running and the
    prefetched layer too (no `_fsdp_buffer_bytes` beside them); under gradient_sync =
    "last-micro-batch" the accumulated unsharded gradients less the shard the states
    count (the sharded gradients are made from them at the last micro-batch). It joins
    the transform's buffers, so the peak stays states + activations + buffers
    (llmpar.evaluation.memory.memory_core)."""
    def unsharded(counts: Mapping[str, float], less_shard: bool) -> Any:
        dense_share, expert_share = (1 - 1 / dense, 1 - 1 / expert) if less_shard else (1, 1)
        return (parameters_per_gpu(ctx, False, counts) * dense_share
                + parameters_per_gpu(ctx, True, counts) * expert_share)

    spec = ctx.spec
    gather_format = spec.precision.weight_gather_under(spec.training.profile)
    weights = where(keeps_weights_gathered(config), bytes_per_element(gather_format), 0.0)
    gradients = where(syncs_last_micro_batch(config), bytes_per_element(spec.gradients_dtype), 0.0)
    plain = not any(map(is_array, (weights, gradients, dense, expert)))
    if plain and weights == 0 and gradients == 0:
        return 0.0  # one layout that holds neither: the products by 0 below, at once
    if ctx.footprint.finetune is None:
        counts = ctx.footprint.parameters_by_group
        return unsharded(counts, False) * weights + unsharded(counts, True) * gradients
    # Weights as stored (a quantized fine-tuning base), gradients of trainable parameters.
    return (unsharded(ctx.footprint.stored_weights_by_group, False) * weights
            + unsharded(ctx.trainable_by_group, True) * gradients)


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(DataParallel())


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    # The data degree is not a dimension: it takes the GPUs the others leave.
    register(SearchDimension(strategy="data", field="zero", values=_zero_stages,
                             description="ZeRO stage (3 is FSDP's sharding), when states "
                                         "shard over more than one rank; 3 alone under "
                                         "fsdp"))
    register(SearchDimension(strategy="data", field="shard_degree", values=_hybrid_degrees,
                             description="hybrid sharding under ZeRO-3: unset (the whole "
                                         "data group), or each power of two between 1 and "
                                         "the data degree that divides it"))


def _zero_stages(point: Point) -> tuple[int, ...]:
    """Every stage where model states shard over more than one rank; else stage 0 alone
    (the others are the same layout). Under `fsdp` in the searched spec, stage 3 alone:
    FSDP's sharding is stage 3 whatever `zero` says (`zero_stage`), so the other stages
    would be the same layout again."""
    ranks = point.degree("data") * point.degree("context")
    experts = point.spec.model.moe is not None and point.degree("tensor") > 1
    if not (ranks > 1 or experts):
        return (0,)
    return (3,) if bool(getattr(point.spec.parallel.get("data"), "fsdp", False)) else (
        0, 1, 2, 3)


def _hybrid_degrees(point: Point) -> tuple[int | None, ...]:
    """Under ZeRO-3 (the stage chosen, or `fsdp` in the searched spec): the whole data
    group (None) and every shard group of a power of two ranks, 1 < s < data degree,
    that divides it; else None alone."""
    data = point.degree("data")
    config = point.spec.parallel.get("data")
    fsdp = bool(getattr(config, "fsdp", False))
    if not (fsdp or point.fields.get("zero") == 3):
        return (None,)
    powers = (2 ** k for k in range(1, data.bit_length()))
    return (None,) + tuple(s for s in powers if s < data and data % s == 0)
