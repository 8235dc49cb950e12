"""Expert parallelism for mixture-of-experts models.

The routed experts of each MoE layer are split over the expert ranks, which are
carved out of the data x context ranks (Megatron-Core: EP x expert-DP = DP x CP,
with the expert tensor degree equal to the tensor degree), or, with a smaller
expert tensor degree, out of the tensor x data x context ranks (MoE parallel
folding, Liu et al. 2025, arXiv:2504.14960), so the degree does not multiply the
GPU count. Each MoE layer sends every token's hidden state to
its k experts and back (dispatch and combine all-to-alls) in the forward pass,
and the gradients the same way in the backward pass (Lepikhin et al. 2020,
GShard, arXiv:2006.16668; Fedus et al. 2021, Switch Transformer, arXiv:2101.03961).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Any, Literal

import attrs

from llmpar.arrays import anywhere, logical_not, where
from llmpar.communication.collectives import members_per_node
from llmpar.communication.deepep import (
    DISPATCH_BYTES_PER_ELEMENT,
    MEAN_BYTES_PER_ELEMENT,
    NORMAL_KERNEL_SMS,
)
from llmpar.dtypes import bytes_per_element
from llmpar.footprint.flops import ForwardFlops, mlp_matmul_weights
from llmpar.hookspecs import hookimpl
from llmpar.placement import Axis
from llmpar.search.dimension import Point, SearchDimension, divisors
from llmpar.spec import Spec
from llmpar.spec.validators import FieldError, one_of, positive
from llmpar.strategies.common import (
    EXPERT_GROUPS,
    EXPERT_TENSOR,
    data_context_stride,
    expert_group_stride,
    expert_tensor_degree,
    forward_passes_per_micro_batch,
    hidden_state_bytes,
    micro_batches_per_step,
    recomputed_block_forwards,
    sequence_parallel,
)
from llmpar.strategies.pipeline import PIPELINE_SCHEDULE, paired_chunk_share
from llmpar.strategy import (
    Collective,
    ForwardStep,
    Layout,
    ProductSplit,
    Rule,
    Shard,
    Strategy,
    StrategyContext,
    Transform,
)

Dispatcher = Literal["all-to-all", "deepep"]
DISPATCHERS: tuple[Dispatcher, ...] = typing.get_args(Dispatcher)
ALL_TO_ALL = "expert.all-to-all"
"""Token dispatch to the experts and combine back, forward and backward."""
SERVING_ALL_TO_ALL = "expert.serving-all-to-all"
"""Serving: token dispatch and combine of every MoE layer."""
SERVING_LOW_LATENCY = "expert.serving-low-latency-all-to-all"
"""Serving, a decode step under DeepEP across nodes: its low-latency kernels' dispatch and
combine (`llmpar.communication.deepep`)."""


def network_copies(dispatcher: str, k: int, e: int, members: int) -> float:
    """Copies of a token's hidden state, per token, in the buffer of the expert
    all-to-all. NCCL's all-to-all sends each of its k routed copies to its expert. DeepEP
    (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 3.2.2; github.com/deepseek-ai/DeepEP) sends
    a token over the network once per remote node that hosts one of its experts, on
    average (N - 1)(1 - (1 - 1/N)^k) of the N nodes the e expert ranks span under uniform
    routing, and forwards it over NVLink there; the returned count makes the all-to-all's
    network share, (e - members) / e of the buffer, equal to that."""
    nodes = e / members
    if dispatcher != "deepep" or nodes <= 1:
        return float(k)
    remote_nodes = (nodes - 1) * (1 - (1 - 1 / nodes) ** k)
    return remote_nodes * e / (e - members)


def serving_element_bytes(dispatcher: str, spec: Spec) -> float:
    """Bytes per hidden element of a serving step's dispatch and combine, on average over
    the two (the collective's buffer counts both at this size). DeepEP's normal kernels
    dispatch FP8 with one fp32 scale per 128 channels and combine in bf16 where the
    experts' products run in fp8 (DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.3: the
    activations are quantized to FP8 before the MoE up-projections, then dispatched; SGLang
    0.4.6.post3 on, python/sglang/srt/layers/moe/ep_moe/token_dispatcher.py,
    _DeepEPDispatcherImplNormal.dispatch_a: per_token_group_quant_fp8(hidden_states, 128)
    before the dispatch under DeepGEMM, its fp8 block-quantized path): the mean of
    1 + 4/128 and the activations' bytes. Otherwise both at the activations' bytes."""
    act = bytes_per_element(spec.precision.activations)
    inference = spec.inference
    experts = None if inference is None else inference.expert_weights or inference.weights
    if dispatcher == "deepep" and experts == "fp8":
        return (DISPATCH_BYTES_PER_ELEMENT + act) / 2
    return act


def dispatch_share(dispatcher: str, spec: Spec) -> float:
    """The dispatch's share of a layer's dispatch and combine bytes (the serving
    collective states their mean, `serving_element_bytes`): FP8 with its scales against
    the combine's activations under DeepEP with fp8 experts, else one half."""
    act = bytes_per_element(spec.precision.activations)
    dispatched = 2 * serving_element_bytes(dispatcher, spec) - act
    return dispatched / (dispatched + act)


def normal_kernel_compute_share(dispatcher: str, spec: Spec) -> float:
    """Share of the GPU's compute DeepEP's normal kernels take from the products they run
    beside: their NORMAL_KERNEL_SMS of the GPU's streaming multiprocessors (a GPU preset
    that states none: 0). NCCL's all-to-all: 0 (its channels are not modelled)."""
    sms = spec.hardware.gpu.streaming_multiprocessors
    if dispatcher != "deepep" or sms is None:
        return 0.0
    return min(NORMAL_KERNEL_SMS, sms - 1) / sms


def at_least_one(_instance: Any, attribute: Any, value: float) -> None:
    """A finite ratio >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 1):
        raise FieldError(attribute.name, f"must be a finite number >= 1, got {value!r}")


def routed_share(spec: Spec, forward: ForwardFlops | None) -> float:
    """The routed experts' products' share of the FLOPs a forward pass executes (the
    backward repeats the same shares): k experts per token in each MoE layer."""
    model = spec.model
    moe = model.moe
    if forward is None or moe is None or forward.executed_total <= 0:
        return 0.0
    routed = (2 * spec.training.sequence_length * model.num_moe_layers * moe.experts_per_token
              * mlp_matmul_weights(model, moe.expert_ffn_hidden_size))
    return min(1.0, routed / forward.executed_total)


@attrs.frozen(kw_only=True)
class ExpertConfig:
    """`[parallel.expert]`."""

    degree: int = attrs.field(default=1, validator=positive)
    """Ranks the routed experts are split over."""
    dispatcher: Dispatcher = attrs.field(default="all-to-all", validator=one_of(*DISPATCHERS))
    """"all-to-all" (NCCL: each routed copy of a token travels to its expert's GPU) or
    "deepep" (DeepEP: a token crosses the network once per node that hosts one of its
    experts, then NVLink forwards it)."""
    tensor_degree: int | None = attrs.field(default=None, validator=positive)
    """Ranks each routed expert's matrices are split over (Megatron-Core's
    --expert-tensor-parallel-size); unset: the tensor degree. Below it, the expert
    ranks fold into the tensor ranks (MoE parallel folding: expert x expert tensor x
    expert data = tensor x context x data), which needs sequence parallelism."""
    imbalance: float = attrs.field(default=1.0, validator=at_least_one)
    """Tokens the busiest expert rank receives over the average (1: even routing, as
    llmpar assumed so far). Dropless routing needs the ratio stated (from the router's
    load statistics); with token dropping the capacity factor bounds it (GShard, Lepikhin
    et al. 2020, arXiv:2006.16668, Sec. 2.2; Switch Transformer, Fedus et al. 2021,
    arXiv:2101.03961, Sec. 2.2). Every rank waits for the busiest: its routed experts'
    products and its share of each all-to-all grow by this factor."""
    overlap_a2a: bool = False
    """Run one micro-batch's dispatch and combine all-to-alls behind another micro-batch's
    compute (Megatron-Core's `--overlap-moe-expert-parallel-comm`, which merges the
    forward of one micro-batch with the backward of another; DeepSeek-V3's overlap of
    computation and communication, Sec. 3.2.1): one micro-batch's all-to-alls of the step
    stay exposed, so a step of one micro-batch hides nothing. Under `[parallel.pipeline]
    schedule = "dualpipe"` or "dualpipev" the schedule's own pairs of chunks hide them
    instead (`llmpar.strategies.pipeline.paired_chunk_share`), with or without this."""


class ExpertParallel(Strategy[ExpertConfig]):
    name = "expert"
    config_type = ExpertConfig
    phase = 35
    multiplies_gpus = False
    axis = Axis(token="ep", rank=30, optional=True, right_before="data", nested=True)
    vectorised = True

    def side_degrees(self, config: ExpertConfig) -> dict[str, int]:
        return {} if config.tensor_degree is None else {EXPERT_TENSOR: config.tensor_degree}

    def rules(self, config: ExpertConfig, spec: Spec, layout: Layout) -> list[Rule]:
        e, moe = config.degree, spec.model.moe
        path = "$.parallel.expert.degree"
        if moe is None:
            return [Rule(path, e != 1, lambda: "expert parallelism needs [model.moe]")]
        found = [Rule(path, moe.num_experts % e != 0,
                      lambda: f"expert degree ({e}) must divide model.moe.num_experts "
                              f"({moe.num_experts})")]
        t, x = layout.degree("tensor"), expert_tensor_degree(layout)
        if x == t:
            d, c = layout.degree("data"), layout.degree("context")
            return found + [Rule(path, (d * c) % e != 0,
                                 lambda: f"expert degree ({e}) must divide data x context "
                                         f"degree ({d} x {c} = {d * c})")]
        return found + self._folding_rules(layout, e, t, x)

    def _folding_rules(self, layout: Layout, e: int, t: int, x: int) -> list[Rule]:
        path = "$.parallel.expert.tensor_degree"
        if x > t or t % x:
            return [Rule(path, True, lambda: f"expert tensor degree ({x}) must divide the "
                                             f"tensor degree ({t})")]
        ranks = t * layout.degree("context") * layout.degree("data")
        inside = data_context_stride(layout) == layout.stride("tensor") * t
        return [
            Rule(path, ranks % (e * x) != 0,
                 lambda: f"expert degree x expert tensor degree ({e} x {x} = {e * x}) must "
                         f"divide tensor x context x data degree ({ranks})"),
            Rule(path, logical_not(sequence_parallel(layout)),
                 lambda: f"an expert tensor degree ({x}) below the tensor degree ({t}) needs "
                         "[parallel.sequence]: each tensor rank routes its own slice of the "
                         "tokens"),
            Rule(path, not inside,
                 lambda: "folding expert ranks into the tensor ranks needs the tensor ranks "
                         "right inside the data x context ranks in [parallel] order"),
        ]

    def transform(self, config: ExpertConfig, ctx: StrategyContext) -> Transform:
        e = config.degree
        if ctx.spec.model.moe is None or e == 1:
            return Transform(strategy=self.name)
        shards = tuple(Shard(component=component, divisor=e, groups=EXPERT_GROUPS,
                             reason="experts split over expert ranks")
                       for component in ("weights", "gradients", "optimizer"))
        layout = ctx.layout
        x = expert_tensor_degree(layout)
        split = ProductSplit(experts=e,
                             expert_width=None if x == layout.degree("tensor") else x)
        extra = (config.imbalance - 1) * routed_share(
            ctx.spec, ctx.footprint.forward_flops_per_sequence)
        notes = () if config.imbalance == 1 else (
            f"busiest expert rank gets {config.imbalance:g}x the average tokens",)
        return Transform(strategy=self.name, shards=shards,
                         collectives=(self._a2a(config, ctx, e),), product_split=split,
                         busiest_rank_extra_work=extra, notes=notes,
                         added_activation_bytes=saved_exchange_bytes(config, ctx, e))

    def serving_collectives(self, config: ExpertConfig, ctx: StrategyContext,
                            step: ForwardStep) -> tuple[Collective, ...]:
        """Dispatch and combine all-to-alls of every MoE layer, k copies of each token
        (GShard), or DeepEP's one copy per remote node."""
        e, model = config.degree, ctx.spec.model
        if model.moe is None or e == 1:
            return ()
        assert model.hidden_size is not None
        stride = expert_group_stride(ctx.layout)
        members = members_per_node(e, stride, ctx.spec.hardware.gpus_per_node)
        if config.dispatcher == "deepep" and step.phase == "decode" and members < e:
            # DeepEP's low-latency kernels: every routed copy straight to its expert's GPU
            return (Collective(
                strategy=self.name, name=SERVING_LOW_LATENCY, operation="all-to-all",
                buffer_bytes=(step.tokens * model.moe.experts_per_token * model.hidden_size
                              * MEAN_BYTES_PER_ELEMENT),
                group_size=e, group_stride=stride, calls_per_step=2 * model.num_moe_layers,
                kernel="deepep-low-latency", overlaps_micro_batch=True,
                reason="decode: token dispatch (FP8) and combine (bf16) of every MoE layer, "
                       "DeepEP's low-latency kernels"),)
        copies = network_copies(config.dispatcher, model.moe.experts_per_token, e, members)
        act = serving_element_bytes(config.dispatcher, ctx.spec)
        return (Collective(
            strategy=self.name, name=SERVING_ALL_TO_ALL, operation="all-to-all",
            buffer_bytes=step.tokens * copies * model.hidden_size * act, group_size=e,
            group_stride=stride, calls_per_step=2 * model.num_moe_layers,
            overlaps_micro_batch=True,
            compute_share=normal_kernel_compute_share(config.dispatcher, ctx.spec),
            reason=f"{step.phase}: token dispatch and combine of every MoE layer"
                   + (" (DeepEP)" if config.dispatcher == "deepep" else "")),)

    def _a2a(self, config: ExpertConfig, ctx: StrategyContext, e: int) -> Collective:
        spec, layout = ctx.spec, ctx.layout
        moe = spec.model.moe
        assert moe is not None
        stride = expert_group_stride(layout)
        members = members_per_node(e, stride, spec.hardware.gpus_per_node)
        copies = network_copies(config.dispatcher, moe.experts_per_token, e, members)
        # each tensor rank routes its own slice of the tokens under sequence parallelism
        tokens_bytes = (hidden_state_bytes(spec, layout) * copies
                        / where(sequence_parallel(layout), layout.degree("tensor"), 1))
        moe_layers = spec.model.num_moe_layers / layout.degree("pipeline")
        # dispatch + combine, forward and backward, and again in a recomputed forward
        # (full recomputation; recompute_modules' moe reruns the dispatch in its checkpoint)
        per_micro_batch = 2 * (forward_passes_per_micro_batch(spec) + 1
                               + recomputed_block_forwards(spec, True))
        calls = per_micro_batch * moe_layers * micro_batches_per_step(spec, layout)
        m = micro_batches_per_step(spec, layout)
        # DualPipe's forward-backward pairs hide each chunk's all-to-alls behind the other
        # chunk's compute (DeepSeek-V3 report, Sec. 3.2.1); its unpaired chunks do not.
        paired = paired_chunk_share(layout.setting(PIPELINE_SCHEDULE, "1f1b"),
                                    layout.degree("pipeline"), m)
        overlapped: dict[str, Any] = {}
        if anywhere(paired):
            overlapped = dict(overlap=paired, hides_behind="compute")
        elif config.overlap_a2a:
            overlapped = dict(overlap=1.0, hides_behind="compute", pieces=m)
        return Collective(strategy=self.name, name=ALL_TO_ALL, operation="all-to-all",
                          buffer_bytes=tokens_bytes * config.imbalance, group_size=e,
                          group_stride=stride, calls_per_step=calls,
                          reason="token dispatch and combine, forward and backward"
                                 + (" (DeepEP: once per remote node, then NVLink)"
                                    if config.dispatcher == "deepep" else "")
                                 + (", behind another micro-batch's compute"
                                    if config.overlap_a2a or anywhere(paired) else ""),
                          **overlapped)


def saved_exchange_bytes(config: ExpertConfig, ctx: StrategyContext, e: int) -> Any:
    """Under an op-level `[training] recompute_policy`, what one micro-batch's MoE layers
    of a stage keep of the token exchange: the outputs of each layer's dispatch and
    combine, which torchtitan's save list holds (b5bcd76c, torchtitan/distributed/
    activation_checkpoint.py `_get_default_save_ops`: _c10d_functional.all_to_all_single,
    deepep.dispatch, deepep.combine), so its recomputation sends nothing again. The
    all-to-all (torchtitan/models/common/token_dispatcher.py AllToAllTokenDispatcher)
    receives the k routed copies of b x s/cp tokens (per tensor rank under sequence
    parallelism), the busiest rank `imbalance` times that, and returns the same k copies;
    DeepEP receives a token once per expert rank hosting one of its experts, e (1 - (1 -
    1/e)^k) ranks on average under uniform routing, and its combine returns the weighted
    sum, one copy. 0 without the policy: nothing is saved beyond the activation model's
    inventory."""
    spec, layout = ctx.spec, ctx.layout
    moe = spec.model.moe
    if spec.training.recompute_policy is None or moe is None:
        return 0.0
    k = moe.experts_per_token
    tokens_bytes = (hidden_state_bytes(spec, layout)
                    / where(sequence_parallel(layout), layout.degree("tensor"), 1))
    if config.dispatcher == "deepep":
        copies = e * (1 - (1 - 1 / e) ** k) * config.imbalance + 1
    else:
        copies = k * config.imbalance + k
    moe_layers = spec.model.num_moe_layers / layout.degree("pipeline")
    return where(spec.training.recompute == "selective",
                 copies * tokens_bytes * moe_layers, 0.0)


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(ExpertParallel())


def _expert_degrees(point: Point) -> tuple[int, ...]:
    moe = point.spec.model.moe
    return (1,) if moe is None else divisors(moe.num_experts)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="expert", field="degree", values=_expert_degrees,
                             description="every divisor of the routed experts (MoE only)"))
