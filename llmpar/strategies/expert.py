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

from collections.abc import Callable

import attrs

from llmpar.communication.collectives import members_per_node
from llmpar.errors import Problem
from llmpar.hookspecs import hookimpl
from llmpar.placement import EXPERT_TENSOR, data_context_stride
from llmpar.search.dimension import Point, SearchDimension, divisors
from llmpar.spec import Spec
from llmpar.spec.validators import one_of, positive
from llmpar.strategies.common import (
    EXPERT_GROUPS,
    forward_passes_per_micro_batch,
    hidden_state_bytes,
    micro_batches_per_step,
    sequence_parallel,
)
from llmpar.strategy import Collective, Layout, Shard, Strategy, StrategyContext, Transform

DISPATCHERS = ("all-to-all", "deepep")


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


@attrs.frozen(kw_only=True)
class ExpertConfig:
    """`[parallel.expert]`."""

    degree: int = attrs.field(default=1, validator=positive)
    """Ranks the routed experts are split over."""
    dispatcher: str = attrs.field(default="all-to-all", validator=one_of(*DISPATCHERS))
    """"all-to-all" (NCCL: each routed copy of a token travels to its expert's GPU) or
    "deepep" (DeepEP: a token crosses the network once per node that hosts one of its
    experts, then NVLink forwards it)."""
    tensor_degree: int | None = attrs.field(default=None, validator=positive)
    """Ranks each routed expert's matrices are split over (Megatron-Core's
    --expert-tensor-parallel-size); unset: the tensor degree. Below it, the expert
    ranks fold into the tensor ranks (MoE parallel folding: expert x expert tensor x
    expert data = tensor x context x data), which needs sequence parallelism."""


class ExpertParallel(Strategy):
    name = "expert"
    config_type = ExpertConfig
    phase = 35
    multiplies_gpus = False

    def side_degrees(self, config: ExpertConfig) -> dict[str, int]:
        return {} if config.tensor_degree is None else {EXPERT_TENSOR: config.tensor_degree}

    def check(self, config: ExpertConfig, spec: Spec, layout: Layout) -> list[Problem]:
        e, moe = config.degree, spec.model.moe
        path = "$.parallel.expert.degree"
        if moe is None:
            return [] if e == 1 else [Problem(path, "expert parallelism needs [model.moe]")]
        problems = []
        if moe.num_experts % e:
            problems.append(Problem(path, f"expert degree ({e}) must divide "
                                          f"model.moe.num_experts ({moe.num_experts})"))
        t, x = layout.degree("tensor"), layout.expert_tensor
        if x == t:
            ranks = layout.degree("data") * layout.degree("context")
            if ranks % e:
                problems.append(Problem(path, f"expert degree ({e}) must divide data x context "
                                              f"degree ({layout.degree('data')} x "
                                              f"{layout.degree('context')} = {ranks})"))
            return problems
        return problems + self._folding_problems(spec, layout, e, t, x)

    def _folding_problems(self, spec: Spec, layout: Layout, e: int, t: int,
                          x: int) -> list[Problem]:
        path = "$.parallel.expert.tensor_degree"
        if x > t or t % x:
            return [Problem(path, f"expert tensor degree ({x}) must divide the tensor degree "
                                  f"({t})")]
        problems = []
        ranks = t * layout.degree("context") * layout.degree("data")
        if ranks % (e * x):
            problems.append(Problem(path, f"expert degree x expert tensor degree ({e} x {x} = "
                                          f"{e * x}) must divide tensor x context x data "
                                          f"degree ({ranks})"))
        if not sequence_parallel(spec):
            problems.append(Problem(path, f"an expert tensor degree ({x}) below the tensor "
                                          f"degree ({t}) needs [parallel.sequence]: each tensor "
                                          "rank routes its own slice of the tokens"))
        tensor = layout.stride("tensor")
        block = data_context_stride(layout.order, layout.degrees)
        if block != tensor * t:
            problems.append(Problem(path, "folding expert ranks into the tensor ranks needs "
                                          "the tensor ranks right inside the data x context "
                                          "ranks in [parallel] order"))
        return problems

    def transform(self, config: ExpertConfig, ctx: StrategyContext) -> Transform:
        e = config.degree
        if ctx.spec.model.moe is None or e == 1:
            return Transform(strategy=self.name)
        shards = tuple(Shard(component=component, divisor=e, groups=EXPERT_GROUPS,
                             reason="experts split over expert ranks")
                       for component in ("weights", "gradients", "optimizer"))
        return Transform(strategy=self.name, shards=shards,
                         collectives=(self._a2a(config, ctx, e),))

    def _a2a(self, config: ExpertConfig, ctx: StrategyContext, e: int) -> Collective:
        spec, layout = ctx.spec, ctx.layout
        moe = spec.model.moe
        assert moe is not None
        stride = layout.stride(self.name)
        members = members_per_node(e, stride, spec.hardware.gpus_per_node)
        copies = network_copies(config.dispatcher, moe.experts_per_token, e, members)
        tokens_bytes = hidden_state_bytes(spec, layout) * copies
        if sequence_parallel(spec):
            tokens_bytes /= layout.degree("tensor")  # each tensor rank routes its slice
        moe_layers = spec.model.num_moe_layers / layout.degree("pipeline")
        per_micro_batch = 2 * (forward_passes_per_micro_batch(spec) + 1)  # dispatch + combine
        calls = per_micro_batch * moe_layers * micro_batches_per_step(spec, layout)
        return Collective(strategy=self.name, name="expert.all-to-all", operation="all-to-all",
                          buffer_bytes=tokens_bytes, group_size=e, group_stride=stride,
                          calls_per_step=calls,
                          reason="token dispatch and combine, forward and backward"
                                 + (" (DeepEP: once per remote node, then NVLink)"
                                    if config.dispatcher == "deepep" else ""))


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy], None]) -> None:
    register(ExpertParallel())


def _expert_degrees(point: Point) -> tuple[int, ...]:
    moe = point.spec.model.moe
    return (1,) if moe is None else divisors(moe.num_experts)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="expert", field="degree", values=_expert_degrees,
                             description="every divisor of the routed experts (MoE only)"))
