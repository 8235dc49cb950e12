"""Continuous batching in steady state (`[inference] concurrency` or `request_rate_per_s`):
each replica keeps a running batch of B sequences; every forward step decodes one token for
each of them and carries, mixed in, the prefill chunks of the requests arriving (chunked
prefill: Agrawal et al. 2024, Sarathi-Serve, arXiv:2403.02310, Sec. 4; vLLM's
max_num_batched_tokens budget per step, decode tokens first).

Per replica, with prompts of `in` computed tokens (less the prefix a prefix cache holds,
`[inference] prefix_cache_hit_rate`) and outputs of `out` tokens:

- batch: the concurrency (a closed loop) or the fixed point of Little's law (Little 1961,
  Operations Research 9(3), L = lambda W) for a request rate lambda: B = lambda x
  (prefill steps + out - 1) x step(B), capped by the KV cache (max_batch_size at the
  spec's context), the engine's max_num_seqs and the token budget
  B (1 + in / out) <= max_num_batched_tokens;
- step: one forward step of B decode tokens (attending in + out / 2 on average) and
  P = B x in / out prefill tokens (in steady state a step carries the prefill of the
  requests that arrive during it: lambda x step x in, with lambda = B / (out x step)),
  each operation by its roofline, plus communication and the engine's host time; TPOT is
  this step (prefill interference included);
- TTFT: the prompt's prefill in ceil(in / (budget - B)) steps of B decode tokens and a
  chunk, plus the wait to start it. Concurrency beyond the batch limit waits in the queue:
  W = (C - B) / lambda by Little's law on the waiting room (closed loop: no spread).
  Under a request rate the prefill budget is a single server fed by Poisson arrivals with a
  deterministic service S (M/D/1): utilisation rho = lambda S, mean wait by
  Pollaczek-Khinchine W = rho S / (2 (1 - rho)) (Kleinrock 1975, Queueing Systems I, Eq.
  5.73 with E[S^2] = S^2), and its percentiles from the exponential approximation of the
  wait's tail, P(W > t) = rho exp(-rho t / W) (P(W > 0) = rho exact for M/G/1, the tail
  exponential with the mean matched; validation/queueing_md1.py checks it by simulation);
- throughput: B / step output tokens per second per replica; per user 1 / TPOT.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from llmpar.inference.capacity import Limit
from llmpar.inference.communication import cost, step_collectives
from llmpar.inference.engine import step_overhead_seconds
from llmpar.inference.operations import (
    Step,
    attention,
    dense_mlp,
    indexer,
    layer_kinds,
    layer_modules,
    moe_ops,
    norms,
    outer_ops,
    projections,
    recurrent_projections,
    recurrent_scan,
    scaled,
)
from llmpar.inference.phases import exposed_seconds
from llmpar.inference.serving import Serving
from llmpar.plan_records import ContinuousBatching
from llmpar.roofline import Operation, Rates, floor_seconds, seconds
from llmpar.spec.model import mixer_parts

BISECTION_STEPS = 40
"""Halvings of the batch interval in the request-rate fixed point (2^-40 of the limit)."""
QUEUEING_SOURCE = ("M/D/1 prefill server: Pollaczek-Khinchine mean wait rho S / (2 (1 - rho)) "
                   "(Kleinrock 1975, Queueing Systems I, Eq. 5.73); percentiles by the "
                   "exponential tail P(W > t) = rho exp(-rho t / W); Little's law (Little 1961) "
                   "for the batch")


@attrs.frozen(kw_only=True)
class MixedStep:
    """One steady-state forward step on one GPU: its time and its floor."""

    seconds: float
    floor_seconds: float
    flops: float
    bytes: float


def mixed_ops(serving: Serving, batch: float, prefill_tokens: float) -> list[Operation]:
    """The operations of a step of `batch` decode tokens and `prefill_tokens` prefill tokens
    (of whole prompts' attention, amortised: prefill_tokens / in prompts' pairs)."""
    inference = serving.inference
    prompt, context = inference.computed_prompt_tokens, serving.degree("context")
    prior = inference.prompt_tokens + inference.generated_tokens / 2 - 1
    new = batch + prefill_tokens / context
    together = Step(tokens=new, rows=batch, sequences=batch, queries=1.0, prior=prior,
                    phase="decode")
    decoding = attrs.evolve(together, tokens=batch)
    prefilling = Step(tokens=prefill_tokens / context, rows=0.0,
                      sequences=prefill_tokens / prompt, queries=float(prompt),
                      prior=float(inference.cached_prompt_tokens), phase="prefill")
    ops = outer_ops(serving, together)
    for kind, count in layer_kinds(serving):
        block = (moe_ops(serving, together) if kind.moe else [dense_mlp(serving, together)]
                 ) if kind.mlp else []
        layer = []
        for mixer in mixer_parts(kind.mixer):  # both of a parallel hybrid layer
            if mixer != "attention":
                layer += [recurrent_projections(serving, together, mixer),
                          recurrent_scan(serving, decoding, mixer)]
                if prefill_tokens > 0:
                    layer.append(recurrent_scan(serving, prefilling, mixer))
                continue
            layer += [projections(serving, together),
                      attention(serving, decoding, kind.window)]
            if prefill_tokens > 0:
                layer.append(attention(serving, prefilling, kind.window))
            if serving.spec.model.sparse_attention is not None:
                layer.append(indexer(serving, decoding))
                if prefill_tokens > 0:
                    layer.append(indexer(serving, prefilling))
        ops += [scaled(op, count) for op in [*layer, *block,
                                             norms(serving, together, layer_modules(kind))]]
    return ops


def mixed_step(serving: Serving, rates: Rates, batch: float,
               prefill_tokens: float) -> MixedStep:
    """Time of one steady-state step: its operations' rooflines, the exposed
    communication of its tokens and the engine's host time."""
    ops = mixed_ops(serving, batch, prefill_tokens)
    forward = Step(tokens=batch + prefill_tokens / serving.degree("context"), rows=batch,
                   sequences=batch, queries=1.0, prior=0.0, phase="decode")
    costs = [cost(serving, c) for c in step_collectives(serving, forward)]
    gpu = sum(seconds(op, rates) for op in ops) + exposed_seconds(costs, ops, rates)
    total = gpu + step_overhead_seconds(serving, batch, gpu)
    return MixedStep(seconds=total, floor_seconds=floor_seconds(ops, rates),
                     flops=sum(op.flops for op in ops), bytes=sum(op.bytes for op in ops))


def token_budget(serving: Serving) -> int | None:
    """Tokens one step holds: prefill_chunk_tokens, else the engine's
    max_num_batched_tokens, else none."""
    inference = serving.inference
    engine = inference.engine
    return inference.prefill_chunk_tokens or (
        engine.max_num_batched_tokens if engine is not None else None)


def batch_limit(serving: Serving, kv: Limit) -> tuple[float, str]:
    """The largest running batch per replica, and what sets it."""
    inference = serving.inference
    ratio = inference.computed_prompt_tokens / inference.generated_tokens
    limits: list[tuple[float, str]] = []
    if kv.value is not None:
        limits.append((float(kv.value), f"KV cache: max_batch_size {kv.value:,} at "
                                        f"{inference.context_tokens:,} tokens a sequence"))
    engine = inference.engine
    if engine is not None and engine.max_num_seqs is not None:
        limits.append((float(engine.max_num_seqs),
                       f"engine max_num_seqs ({engine.max_num_seqs:,})"))
    budget = token_budget(serving)
    if budget is not None:
        limits.append((budget / (1 + ratio),
                       f"token budget: batch x (1 + in / out) <= {budget:,} tokens a step"))
    if not limits:
        return math.inf, "nothing"
    return min(limits, key=lambda item: item[0])


def prefill_steps_per_request(serving: Serving, batch: float) -> tuple[int, float]:
    """Steps a prompt's prefill spreads over, and its tokens in each: the budget left by
    the decode tokens (at least one), or the whole prompt."""
    prompt = serving.inference.computed_prompt_tokens
    budget = token_budget(serving)
    if budget is None:
        return 1, float(prompt)
    room = max(1.0, budget - batch)
    steps = math.ceil(prompt / room)
    return steps, prompt / steps


def _tail_seconds(wait: float, rho: float, percentile: float) -> float:
    """The waiting time exceeded with probability 1 - percentile under the exponential
    tail P(W > t) = rho exp(-rho t / wait)."""
    miss = 1 - percentile
    if wait <= 0 or rho <= miss:
        return 0.0
    return wait / rho * math.log(rho / miss)


def _running_batch(serving: Serving, step: Callable[[float], float],
                   residence: Callable[[float], float], top: float,
                   limited_by: str) -> tuple[float, str, bool]:
    """(batch per replica, what sets it, stable): the concurrency capped by the limit, or
    the least B with B = rate x residence(B) x step(B) (Little's law; both sides grow with
    B, so bisection finds it: BISECTION_STEPS halvings of [0, limit], most of them decided
    by a bracket of the crossing found first, `_crossing`), unstable when even the limit
    falls short."""
    inference = serving.inference
    replicas = serving.degree("data")
    if inference.concurrency is not None:
        offered = inference.concurrency / replicas
        return min(offered, top), limited_by if offered > top else "concurrency", True
    assert inference.request_rate_per_s is not None
    rate = inference.request_rate_per_s / replicas
    arriving: dict[float, float] = {}

    def short(batch: float) -> bool:
        """Whether more requests arrive while `batch` are served than `batch` holds."""
        if batch not in arriving:
            arriving[batch] = rate * residence(batch) * step(batch)
        return arriving[batch] > batch

    short(top)
    if arriving[top] >= top:
        return top, limited_by, False

    # The bisection's answer with few steps measured: a bracket of the crossing first
    # (regula falsi, `_crossing`), then the bisection's own halvings, each midpoint
    # outside the bracket decided by it (both sides grow with B: B falls short below
    # the crossing and suffices above it), the others measured.
    below, above = _crossing(short, arriving, top)
    low, high = 0.0, top
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if middle <= below or (middle < above and short(middle)):
            low = middle
            below = max(below, middle)
        else:
            high = middle
            above = min(above, middle)
    return high, "request rate (Little's law)", True


CROSSING_STEPS = 12
"""Interpolation steps that bracket the request-rate fixed point before the halvings."""


def _crossing(short: Callable[[float], bool], arriving: dict[float, float],
              top: float) -> tuple[float, float]:
    """(a batch that falls short, a larger one that suffices) around the least batch
    that holds the requests arriving while it is served (`short`, which records each
    value in `arriving`): regula falsi on arriving - batch with the Illinois rule, from
    the bisection's first midpoint, until the bracket is as narrow as the halvings'
    last step."""
    low: tuple[float, float] | None = None  # (batch, arriving - batch) > 0
    high = (top, arriving[top] - top)
    finest = top * 2.0**-BISECTION_STEPS
    point, kept = top / 2, ""
    for _ in range(CROSSING_STEPS):
        if short(point):
            low = (point, arriving[point] - point)
            if kept == "low":
                high = (high[0], high[1] / 2)
            kept = "low"
        else:
            high = (point, arriving[point] - point)
            if kept == "high" and low is not None:
                low = (low[0], low[1] / 2)
            kept = "high"
        if low is None:
            point = high[0] / 2
            continue
        if high[0] - low[0] <= 2 * finest:
            break
        (x0, g0), (x1, g1) = low, high
        point = x0 + g0 * (x1 - x0) / (g0 - g1) if g0 > g1 else (x0 + x1) / 2
        # at least the halvings' last width inside either end (Dekker's rule): a point
        # next to the crossing is followed by one just past it
        point = min(max(point, x0 + finest), x1 - finest)
    return (0.0 if low is None else low[0]), high[0]


def _wait(serving: Serving, batch: float, completions: float,
          prefill: float) -> tuple[float, float, float, float | None, str]:
    """(mean, p90 and p99 wait before the prefill, rho or None, the model in words)."""
    inference = serving.inference
    replicas = serving.degree("data")
    if inference.concurrency is not None:
        wait = max(0.0, inference.concurrency / replicas - batch) / completions
        return wait, wait, wait, None, ("closed loop: the concurrency beyond the batch waits "
                                        "(C - B) / completion rate (Little's law); no spread")
    # The prefill budget serves one prompt in `prefill` seconds (deterministic): M/D/1.
    rho = min(1.0, (inference.request_rate_per_s or 0.0) / replicas * prefill)
    if rho >= 1:
        return math.inf, math.inf, math.inf, rho, QUEUEING_SOURCE
    wait = rho * prefill / (2 * (1 - rho))
    return (wait, _tail_seconds(wait, rho, 0.90), _tail_seconds(wait, rho, 0.99), rho,
            QUEUEING_SOURCE)


def continuous_batching(serving: Serving, rates: Rates, kv: Limit) -> ContinuousBatching:
    """The steady state of the spec's concurrency or request rate."""
    inference = serving.inference
    replicas, gpus = serving.degree("data"), serving.spec.hardware.num_gpus
    out = inference.generated_tokens
    ratio = inference.computed_prompt_tokens / out  # prefill tokens per decode token
    limit, limited_by = batch_limit(serving, kv)

    stepped: dict[float, MixedStep] = {}  # the limit's step and the steady state's, once

    def step(batch: float) -> MixedStep:
        if batch not in stepped:
            stepped[batch] = mixed_step(serving, rates, batch, batch * ratio)
        return stepped[batch]

    def residence(batch: float) -> float:
        """Steps a request holds a slot for: its prefill steps and out - 1 decode steps."""
        return prefill_steps_per_request(serving, batch)[0] + out - 1

    top = limit if math.isfinite(limit) else float(kv.value or 2**20)
    capacity = top / (residence(top) * step(top).seconds) * replicas  # requests/s
    batch, limited, stable = _running_batch(serving, lambda b: step(b).seconds, residence,
                                            top, limited_by)
    batch = max(batch, 1e-9)
    steady = step(batch)
    tpot = steady.seconds
    completions = batch / (residence(batch) * tpot)  # requests/s per replica
    steps, chunk = prefill_steps_per_request(serving, batch)
    # The steps carrying this prompt's chunks carry at least the chunk.
    prefill = steps * mixed_step(serving, rates, batch, max(chunk, batch * ratio)).seconds
    wait, p90, p99, rho, queueing = _wait(serving, batch, completions, prefill)
    known = stable and math.isfinite(wait)
    if inference.concurrency is not None:
        in_flight, arrivals = float(inference.concurrency), completions * replicas
    else:
        arrivals = inference.request_rate_per_s or 0.0
        in_flight = arrivals * (wait + prefill + (out - 1) * tpot)  # Little's law

    def finite(value: float) -> float | None:
        return value if known else None

    return ContinuousBatching(
        mode="concurrency" if inference.concurrency is not None else "request rate",
        concurrency=finite(in_flight), request_rate_per_s=arrivals,
        batch_size=batch, batch_limit=limit if math.isfinite(limit) else None,
        batch_limited_by=limited, token_budget=token_budget(serving),
        prefill_tokens_per_step=batch * ratio, prefill_steps_per_request=steps,
        prefill_chunk_tokens=chunk, tpot_seconds=tpot,
        tpot_floor_seconds=steady.floor_seconds, queue_seconds=finite(wait),
        ttft_seconds=finite(wait + prefill), ttft_p90_seconds=finite(p90 + prefill),
        ttft_p99_seconds=finite(p99 + prefill), prefill_utilization=rho,
        latency_seconds=finite(wait + prefill + (out - 1) * tpot),
        tokens_per_second=batch / tpot * replicas,
        tokens_per_second_per_gpu=batch / tpot * replicas / gpus,
        tokens_per_second_per_user=1 / tpot, max_request_rate_per_s=capacity,
        flops_per_step=steady.flops, stable=known, queueing_model=queueing)
