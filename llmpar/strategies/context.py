"""Context parallelism: the sequence split over ranks for the whole network.

Every activation with a sequence dimension splits by the degree c. Attention
needs all keys and values:
- "ring" (ring attention, Liu et al. 2023, arXiv:2310.01889; Megatron-Core CP):
  K and V chunks travel around the ring in c-1 steps, overlapped with the
  attention of the chunk at hand; the backward pass sends K, V and their
  gradients. Causal load balancing needs the sequence in 2c chunks.
- "all-to-all" (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509):
  all-to-alls swap the sequence split for a head split around attention: Q, K,
  V in and the output back, in each direction of the pass.
- "hybrid" (USP, Fang and Zhao 2024, arXiv:2405.07719; Megatron-Core's
  `cp_comm_type = "a2a+p2p"` with `hierarchical_context_parallel_sizes`): an
  all-to-all over the inner `all_to_all_degree` = a ranks, then a ring over the
  c / a groups, each step over s / (c / a) tokens of 1/a of the heads.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

import attrs

from llmpar.arrays import logical_and, where
from llmpar.dtypes import bytes_per_element
from llmpar.footprint.inventory import SPLIT_CONTEXT
from llmpar.hookspecs import hookimpl
from llmpar.inference.kv_cache import kv_bytes_per_token
from llmpar.placement import Axis
from llmpar.search.dimension import Point, SearchDimension
from llmpar.spec import Spec
from llmpar.spec.validators import one_of, positive
from llmpar.strategies.common import layers_per_stage, micro_batches_per_step
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
)

Kind = Literal["ring", "all-to-all", "hybrid"]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)
KV_RING = "context.kv-ring"
"""Ring attention's K/V chunks (and their gradients) passed around the ring."""
ALL_TO_ALL = "context.all-to-all"
"""Ulysses' all-to-alls of Q, K, V and the attention output."""
SERVING_RING = "context.serving-kv-ring"
"""Serving, prefill: K/V chunks around the ring, behind attention."""
SERVING_COMBINE = "context.serving-combine"
"""Serving, decode: the partial attention outputs of the split cache, gathered."""


@attrs.frozen(kw_only=True)
class ContextConfig:
    """`[parallel.context]`."""

    degree: int = attrs.field(default=1, validator=positive)
    """GPUs the sequence is split over."""
    kind: Kind = attrs.field(default="ring", validator=one_of(*KINDS))
    """"ring" (K/V passed around, behind attention), "all-to-all" (Ulysses) or "hybrid"
    (an all-to-all inside groups of `all_to_all_degree` ranks, a ring across them)."""
    all_to_all_degree: int | None = attrs.field(default=None, validator=positive)
    """With kind = "hybrid": the context ranks of each all-to-all group (consecutive
    ranks, Megatron-Core's first hierarchical size); it must divide the degree, and the
    ring runs over degree / all_to_all_degree groups."""


def _recurrent_rules(c: Any, spec: Spec) -> list[Rule]:
    """A recurrent token mixer's scan runs through the tokens in order: the chunk of a
    context rank needs the state the ranks before it leave, which neither a ring of K/V
    chunks nor an all-to-all of heads passes (a sequential state hand-off would idle c - 1
    of c ranks in each layer), so context parallelism refuses such models."""
    kind = spec.model.recurrent_mixer
    if kind is None:
        return []
    return [Rule("$.parallel.context.degree", c > 1,
                 lambda: f"context parallelism cannot split the sequence of the model's "
                         f"{kind} layers: each chunk's scan needs the recurrent state the "
                         "previous rank's tokens leave, which neither the K/V ring nor the "
                         "all-to-all passes; use degree 1")]


class ContextParallel(Strategy[ContextConfig]):
    name = "context"
    config_type = ContextConfig
    phase = 30
    axis = Axis(token="cp", rank=20, beside="data")
    vectorised = True

    def rules(self, config: ContextConfig, spec: Spec, layout: Layout) -> list[Rule]:
        c, s = config.degree, spec.training.sequence_length
        model = spec.model
        path = "$.parallel.context"
        if c > 1 and not model.has_architecture:
            return [Rule(f"{path}.degree", True,
                         lambda: "context parallelism needs the model's architecture "
                                 "(hidden_size, heads, head_dim), not just its parameter count")]
        heads, t = spec.model.num_attention_heads, layout.degree("tensor")
        recurrent = _recurrent_rules(c, spec)
        if _hybrid(config):
            return recurrent + self._hybrid_rules(config, heads, t, s)
        return recurrent + [
            Rule(f"{path}.all_to_all_degree", config.all_to_all_degree is not None,
                 lambda: 'all_to_all_degree needs kind = "hybrid"'),
            Rule(f"{path}.degree", c > 1 and s % (2 * c) != 0,
                 lambda: f"training.sequence_length ({s}) must be divisible by 2 x context "
                         f"degree ({2 * c}) for load-balanced causal attention"),
            Rule(f"{path}.kind", logical_and(config.kind == "all-to-all",
                                             heads is not None and heads % (c * t) != 0),
                 lambda: f"all-to-all needs num_attention_heads ({heads}) divisible by "
                         f"context x tensor degree ({c} x {t} = {c * t})"),
        ]

    def _hybrid_rules(self, config: ContextConfig, heads: int | None, t: int,
                      s: int) -> list[Rule]:
        c, a, path = config.degree, config.all_to_all_degree, "$.parallel.context"
        if a is None or a <= 1 or a >= c or c % a:
            return [Rule(f"{path}.all_to_all_degree", True,
                         lambda: f"kind = 'hybrid' needs all_to_all_degree above 1 and below "
                                 f"the degree ({c}), dividing it; got {a}")]
        return [
            Rule(f"{path}.degree", s % (2 * c) != 0,
                 lambda: f"training.sequence_length ({s}) must be divisible by 2 x context "
                         f"degree ({2 * c}) for load-balanced causal attention"),
            Rule(f"{path}.all_to_all_degree", heads is not None and heads % (a * t) != 0,
                 lambda: f"the all-to-all needs num_attention_heads ({heads}) divisible by "
                         f"all_to_all_degree x tensor degree ({a} x {t} = {a * t})")]

    def transform(self, config: ContextConfig, ctx: StrategyContext) -> Transform:
        c = config.degree
        if c == 1:
            return Transform(strategy=self.name)
        if _hybrid(config):
            return self._hybrid(config, ctx, c)
        ring = config.kind == "ring"
        return Transform(strategy=self.name,
                         activation_splits=(ActivationSplit(tag=SPLIT_CONTEXT, divisor=c,
                                                            reason="sequence split"),),
                         collectives=(self._ring(ctx, c, ring), self._all_to_all(ctx, c, ring)),
                         product_split=ProductSplit(tokens=c, attention_steps=where(ring, c, 1)))

    def _hybrid(self, config: ContextConfig, ctx: StrategyContext, c: int) -> Transform:
        """The all-to-all over the inner a ranks and the ring over the c / a groups: the
        ring's K/V chunk is the same s/c tokens' worth (s/r tokens of 1/a of the K/V
        heads) in r - 1 steps; the all-to-all's share of Q, K, V, out as Ulysses'."""
        a = config.all_to_all_degree
        assert a is not None
        r, stride = c // a, ctx.layout.stride(self.name)
        ring = attrs.evolve(self._ring(ctx, c, True, steps=r), group_size=r,
                            group_stride=stride * a,
                            reason="K/V chunks around the ring of all-to-all groups, behind "
                                   "attention")
        swap = attrs.evolve(self._all_to_all(ctx, c, False), group_size=a,
                            reason="Q, K, V in and the output back inside each all-to-all "
                                   "group, forward and backward")
        return Transform(strategy=self.name,
                         activation_splits=(ActivationSplit(tag=SPLIT_CONTEXT, divisor=c,
                                                            reason="sequence split"),),
                         collectives=(ring, swap),
                         product_split=ProductSplit(tokens=c, attention_steps=r),
                         notes=(f"hybrid: all-to-all over {a} ranks, ring over {r} groups",))

    def serving_collectives(self, config: ContextConfig, ctx: StrategyContext,
                            step: ForwardStep) -> tuple[Collective, ...]:
        """In prefill, ring attention passes each rank's K/V chunk around the ring in
        c - 1 sends per layer, behind that layer's attention (Liu et al. 2023,
        arXiv:2310.01889); in decode each rank attends its share of the cache and the
        partial outputs are gathered (flash-decoding's split-KV combine, one all-gather
        per layer)."""
        c, spec = config.degree, ctx.spec
        if c == 1:
            return ()
        model, t = spec.model, ctx.layout.degree("tensor")
        assert spec.inference is not None
        layers = model.num_layers or 0
        common: dict[str, Any] = dict(strategy=self.name, group_size=c,
                                      group_stride=ctx.layout.stride(self.name))
        if step.phase == "prefill":
            chunk = step.tokens * kv_bytes_per_token(model, spec.inference.kv_cache, t)
            return (Collective(name=SERVING_RING, operation="send-recv", buffer_bytes=chunk,
                               calls_per_step=(c - 1) * layers, overlap=1.0,
                               hides_behind="attention",
                               reason="prefill: K/V chunks around the ring, behind attention",
                               **common),)
        act = bytes_per_element(spec.precision.activations)
        partial = step.tokens * model.attention_output_width / t * act
        return (Collective(name=SERVING_COMBINE, operation="all-gather", buffer_bytes=partial,
                           calls_per_step=layers,
                           reason="decode: partial attention outputs of the split cache",
                           **common),)

    def _chunk_elements(self, ctx: StrategyContext, c: int) -> Any:
        training = ctx.spec.training
        return training.micro_batch_size * training.sequence_length / c

    def _ring(self, ctx: StrategyContext, c: int, ring: Any, steps: int | None = None
              ) -> Collective:
        spec, layout = ctx.spec, ctx.layout
        model = spec.model
        steps = c if steps is None else steps
        kv_bytes = (self._chunk_elements(ctx, c) * 2 * model.kv_width / layout.degree("tensor")
                    * bytes_per_element(spec.precision.activations))
        # steps-1 sends of K,V forward; backward sends K,V and dK,dV: 3 x (steps-1) per layer.
        calls = (3 * (steps - 1) * layers_per_stage(spec, layout)
                 * micro_batches_per_step(spec, layout))
        return Collective(strategy=self.name, name=KV_RING, operation="send-recv",
                          buffer_bytes=kv_bytes, group_size=c,
                          group_stride=layout.stride(self.name),
                          calls_per_step=where(ring, calls, 0.0),
                          overlap=1.0, hides_behind="attention",
                          reason="K/V chunks around the ring, behind attention")

    def _all_to_all(self, ctx: StrategyContext, c: int, ring: Any) -> Collective:
        spec, layout = ctx.spec, ctx.layout
        model = spec.model
        width = (2 * model.query_width + 2 * model.kv_width) / layout.degree("tensor")
        exchanged = (self._chunk_elements(ctx, c) * width
                     * bytes_per_element(spec.precision.activations))
        calls = 2 * layers_per_stage(spec, layout) * micro_batches_per_step(spec, layout)
        return Collective(strategy=self.name, name=ALL_TO_ALL, operation="all-to-all",
                          buffer_bytes=exchanged, group_size=c,
                          group_stride=layout.stride(self.name),
                          calls_per_step=where(ring, 0.0, calls),
                          reason="Q, K, V in and the output back, forward and backward")


def _hybrid(config: ContextConfig) -> bool:
    """The hybrid kind, set for one layout (the search varies ring and all-to-all only,
    as arrays)."""
    return isinstance(config.kind, str) and config.kind == "hybrid"


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    register(ContextParallel())


SEARCHED_KINDS: tuple[Kind, ...] = ("ring", "all-to-all")
"""The kinds a search tries; the hybrid needs its all-to-all degree stated."""


def _kinds(point: Point) -> tuple[Kind, ...]:
    return SEARCHED_KINDS if point.degree("context") > 1 else (ContextConfig().kind,)


@hookimpl
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    register(SearchDimension(strategy="context", field="degree",
                             description="every divisor of the GPU count"))
    register(SearchDimension(strategy="context", field="kind", values=_kinds,
                             description="ring or all-to-all, when the degree is above 1"))
