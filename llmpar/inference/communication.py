"""Communication of one forward step: what each strategy in the layout says it sends
(`Strategy.serving_collectives`), costed per call by
`llmpar.communication.collectives.call_seconds` (alpha-beta ring costs on the link the
group spans: latency-bound for the small buffers of decode), or by the serving engine's
custom all-reduce where it takes the call (`llmpar.inference.engine`)."""

from __future__ import annotations

from llmpar.communication.collectives import algorithm_of, call_seconds
from llmpar.communication.deepep import low_latency_call_seconds
from llmpar.inference.engine import custom_all_reduce_seconds
from llmpar.inference.operations import Step
from llmpar.inference.serving import Serving
from llmpar.plan import CollectiveCost
from llmpar.strategy import Collective, ForwardStep, StrategyContext


def step_collectives(serving: Serving, step: Step) -> list[Collective]:
    """Every collective of one forward step with a group of more than one GPU, by the
    strategies in phase order."""
    spec, strategies = serving.spec, serving.strategies
    ctx = StrategyContext(spec=spec, footprint=serving.footprint, layout=serving.layout)
    forward = ForwardStep(phase=step.phase, tokens=step.tokens, rows=step.rows)
    found = []
    for name in sorted(spec.parallel, key=lambda n: (strategies[n].phase, n)):
        found += strategies[name].serving_collectives(spec.parallel[name], ctx, forward)
    return [c for c in found if c.group_size > 1 and c.calls_per_step > 0]


def cost(serving: Serving, collective: Collective) -> CollectiveCost:
    """One collective's calls of a step, on its link; an unknown link costs nothing (the
    plan warns)."""
    per_call, tier = call_seconds(collective, serving.spec.hardware)
    custom = custom_all_reduce_seconds(serving, collective)
    if custom is not None:  # the engine's own kernel (llmpar.inference.engine)
        per_call = custom
    low_latency = collective.kernel == "deepep-low-latency" and per_call is not None
    if low_latency:  # DeepEP's decode kernels (llmpar.communication.deepep)
        hardware = serving.spec.hardware
        assert hardware.inter_node_bandwidth_bytes_per_s is not None
        per_call = low_latency_call_seconds(collective.buffer_bytes, collective.group_size,
                                            hardware.inter_node_bandwidth_bytes_per_s,
                                            hardware.inter_node_latency_seconds)
    seconds = (per_call or 0.0) * collective.calls_per_step
    return CollectiveCost(strategy=collective.strategy, operation=collective.operation,
                          name=collective.name, buffer_bytes=round(collective.buffer_bytes),
                          group_size=collective.group_size, tier=tier,
                          calls_per_step=collective.calls_per_step, seconds=seconds,
                          exposed_seconds=seconds * (1 - collective.overlap),
                          hides_behind=collective.hides_behind, reason=collective.reason,
                          algorithm=("engine" if custom is not None
                                     else "deepep-low-latency" if low_latency
                                     else "" if per_call is None
                                     else algorithm_of(collective, serving.spec.hardware)))


def unknown_links(serving: Serving, collectives: list[Collective]) -> list[str]:
    """Warnings for collectives whose link bandwidth the hardware does not state."""
    found = []
    for collective in collectives:
        per_call, tier = call_seconds(collective, serving.spec.hardware)
        if per_call is None:
            found.append(f"{collective.name}: no {tier} bandwidth in [hardware]; not costed")
    return found
