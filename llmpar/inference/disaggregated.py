"""Disaggregated prefill and decode (`[inference.disaggregated]`, xPyD): a prefill pool
and a decode pool, each with its own layout, and the key/value cache of every prompt sent
from one to the other (Zhong et al. 2024, DistServe, arXiv:2401.09670, Sec. 3; Patel et al.
2024, Splitwise, arXiv:2311.18284, Sec. 4).

- Prefill pool: each replica prefills one batch of prompts (the spec's batch_size under
  static batching; one prompt at a time under a request rate, each as it arrives, in chunks
  of prefill_chunk_tokens only where the spec gives them). It holds the weights, the
  workspace and the cache of the prompts being prefilled, no cache beyond them: the cache
  leaves with the request.
- KV transfer: every GPU of the prefill replica sends its share of the prompt's cache and
  every GPU of the decode replica receives its own, in parallel (one RDMA link per GPU, as
  NIXL and Mooncake's transfer engine run it); the time is the larger share over the
  per-GPU bandwidth, plus the link's latency, after the prefill (layer-wise overlap with
  the prefill not counted: an upper bound). The link: `kv_transfer_bandwidth_bytes_per_s`,
  else the inter-node bandwidth when the pools span nodes, else the intra-node one.
- Decode pool: the continuous batch decodes one token per sequence each step with no
  prefill mixed in (what disaggregation buys: TPOT without prefill interference); the
  batch under a request rate is the fixed point of Little's law, B = lambda x (out - 1)
  x step(B), capped by the cache and the engine's max_num_seqs.
- TTFT: the wait for the prefill server (M/D/1, as `llmpar.inference.continuous`), the
  prefill and the transfer. Each pool's utilisation is the rate over the most it
  sustains; the smaller of the two maxima limits the rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem
from llmpar.inference.capacity import max_batch_size
from llmpar.inference.continuous import MixedStep, _running_batch, _tail_seconds, mixed_step
from llmpar.inference.kv_cache import kv_cache_bytes
from llmpar.inference.serving import Serving
from llmpar.plan import Derivation, Plan, ServingPool
from llmpar.plan_records import ContinuousBatching, Disaggregation
from llmpar.roofline import rates_of
from llmpar.spec import Spec
from llmpar.strategy import Layout

if TYPE_CHECKING:
    from llmpar.strategy import Strategy

ROLES = ("prefill", "decode")
TRANSFER_SOURCE = ("per-GPU shares of the prompt's cache sent in parallel, one link per GPU "
                   "(DistServe, arXiv:2401.09670, Sec. 3; NIXL / Mooncake transfer engine); "
                   "not overlapped with the prefill")


def pool_spec(spec: Spec, role: str, strategies: Mapping[str, Strategy[Any]]) -> Spec:
    """The spec of one pool: its GPUs, the `[parallel.*]` tables with its degrees (data
    filling the rest), and the workload that pool runs."""
    inference = spec.inference
    assert inference is not None and inference.disaggregated is not None
    plan = inference.disaggregated
    gpus = plan.prefill_gpus if role == "prefill" else plan.decode_gpus
    degrees = dict(plan.prefill_layout if role == "prefill" else plan.decode_layout)
    degrees.setdefault("data", -1)
    parallel = dict(spec.parallel)
    for name, degree in degrees.items():
        config = parallel.get(name)
        if config is None and name in strategies:
            config = strategies[name].config_type()
        if config is not None and hasattr(config, "degree"):
            parallel[name] = attrs.evolve(config, degree=degree)
    if role == "prefill":
        served = attrs.evolve(inference, disaggregated=None, concurrency=None,
                              request_rate_per_s=None, speculative=None, generated_tokens=1,
                              batch_size=1 if inference.continuous else inference.batch_size)
    else:  # no prefill runs here: its largest step is a decode step of the batch
        served = attrs.evolve(inference, disaggregated=None,
                              prefill_chunk_tokens=inference.batch_size)
    return attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, num_gpus=gpus),
                        parallel=parallel, inference=served)


def disaggregated_problems(spec: Spec, strategies: Mapping[str, Strategy[Any]]) -> list[Problem]:
    """The pools' GPUs add up, the workload is one the pools model, and each pool's layout
    resolves and passes its strategies' checks."""
    from llmpar.loading.checks import checked_layout

    inference = spec.inference
    if inference is None or inference.disaggregated is None:
        return []
    plan, path = inference.disaggregated, "$.inference.disaggregated"
    problems = []
    total = plan.prefill_gpus + plan.decode_gpus
    if total != spec.hardware.num_gpus:
        problems.append(Problem(path, f"prefill_gpus + decode_gpus = {plan.prefill_gpus} + "
                                f"{plan.decode_gpus} = {total}, but hardware.num_gpus is "
                                f"{spec.hardware.num_gpus}"))
    if inference.concurrency is not None:
        problems.append(Problem("$.inference.concurrency", "disaggregated pools are modelled "
                                "at a request rate or a static batch: give "
                                "request_rate_per_s or batch_size"))
    if inference.speculative is not None:
        problems.append(Problem("$.inference.speculative", "speculative decoding is not "
                                "modelled on disaggregated pools"))
    for role in ROLES:
        layout = dict(plan.prefill_layout if role == "prefill" else plan.decode_layout)
        unknown = [name for name in layout if name not in strategies]
        problems += [Problem(f"{path}.{role}_layout.{name}",
                             "no loaded plugin provides this strategy") for name in unknown]
        if unknown:
            continue
        _layout, found = checked_layout(pool_spec(spec, role, strategies), strategies)
        problems += [Problem(f"{path}.{role}_layout", f"{role} pool of {_gpus(plan, role)} "
                             f"GPUs: {p.path}: {p.message}") for p in found]
    return problems


def _gpus(plan: Any, role: str) -> int:
    return int(plan.prefill_gpus if role == "prefill" else plan.decode_gpus)


def _request_cache_bytes(serving: Serving) -> int:
    """One GPU's share of one prompt's cache, on the stage that holds the most."""
    inference = serving.inference
    return max(kv_cache_bytes(serving.spec.model, inference, serving.layout, range(0), 1,
                              inference.prompt_tokens, part.windows)
               for part in serving.fixed)


def _link(spec: Spec) -> tuple[float | None, float, str]:
    """(bytes per second per GPU, latency seconds, which link) between the pools."""
    inference, hardware = spec.inference, spec.hardware
    assert inference is not None and inference.disaggregated is not None
    plan = inference.disaggregated
    if plan.kv_transfer_bandwidth_bytes_per_s is not None:
        return (float(plan.kv_transfer_bandwidth_bytes_per_s),
                float(hardware.inter_node_latency_seconds),
                "[inference.disaggregated] kv_transfer_bandwidth_bytes_per_s")
    if plan.prefill_gpus + plan.decode_gpus <= hardware.gpus_per_node:
        return (hardware.intra_node_bandwidth, float(hardware.intra_node_latency_seconds),
                "intra-node (both pools in one node)")
    bandwidth = hardware.inter_node_bandwidth_bytes_per_s
    return (None if bandwidth is None else float(bandwidth),
            float(hardware.inter_node_latency_seconds), "inter-node (the pools span nodes)")


@attrs.frozen(kw_only=True)
class _Decode:
    record: ContinuousBatching | None
    batch: int
    rate_max: float | None
    utilization: float | None


def _decode_steady(serving: Serving, prefill_seconds: float, transfer_seconds: float,
                   prefill_rate_max: float) -> _Decode:
    """The decode pool's steady state at the spec's request rate: decode-only steps."""
    inference = serving.inference
    assert inference.request_rate_per_s is not None
    rates = rates_of(serving.spec.hardware.gpu)
    replicas, gpus = serving.degree("data"), serving.spec.hardware.num_gpus
    out = inference.generated_tokens
    kv = max_batch_size(serving)
    limits = [(float(kv.value), f"KV cache: max_batch_size {kv.value:,} at "
                                f"{inference.context_tokens:,} tokens a sequence")] \
        if kv.value is not None else []
    engine = inference.engine
    if engine is not None and engine.max_num_seqs is not None:
        limits.append((float(engine.max_num_seqs),
                       f"engine max_num_seqs ({engine.max_num_seqs:,})"))
    top, limited_by = min(limits, key=lambda item: item[0]) if limits else (2.0**20, "nothing")
    top = max(top, 1e-9)

    stepped: dict[float, MixedStep] = {}  # the limit's step and the steady state's, once

    def step(batch: float) -> MixedStep:
        if batch not in stepped:
            stepped[batch] = mixed_step(serving, rates, batch, 0.0)
        return stepped[batch]

    decode_steps = max(out - 1, 1)
    rate_max = top / (decode_steps * step(top).seconds) * replicas
    batch, limited, stable = _running_batch(serving, lambda b: step(b).seconds,
                                            lambda _b: decode_steps, top, limited_by)
    batch = max(batch, 1e-9)
    steady = step(batch)
    tpot = steady.seconds
    rate = inference.request_rate_per_s
    rho = min(1.0, rate / prefill_rate_max)
    stable = stable and rho < 1
    wait = rho * prefill_seconds / (2 * (1 - rho)) if rho < 1 else math.inf
    p90 = _tail_seconds(wait, rho, 0.90) if stable else math.inf
    p99 = _tail_seconds(wait, rho, 0.99) if stable else math.inf
    ttft = wait + prefill_seconds + transfer_seconds
    latency = ttft + (out - 1) * tpot

    def finite(value: float) -> float | None:
        return value if stable else None

    record = ContinuousBatching(
        mode="request rate", concurrency=finite(rate * latency), request_rate_per_s=rate,
        batch_size=batch, batch_limit=top if limits else None, batch_limited_by=limited,
        token_budget=None, prefill_tokens_per_step=0.0, prefill_steps_per_request=0,
        prefill_chunk_tokens=0.0, tpot_seconds=tpot, tpot_floor_seconds=steady.floor_seconds,
        queue_seconds=finite(wait), ttft_seconds=finite(ttft),
        ttft_p90_seconds=finite(p90 + prefill_seconds + transfer_seconds),
        ttft_p99_seconds=finite(p99 + prefill_seconds + transfer_seconds),
        prefill_utilization=rho, latency_seconds=finite(latency),
        tokens_per_second=batch / tpot * replicas,
        tokens_per_second_per_gpu=batch / tpot * replicas / gpus,
        tokens_per_second_per_user=1 / tpot, max_request_rate_per_s=min(rate_max,
                                                                        prefill_rate_max),
        flops_per_step=steady.flops, stable=stable,
        queueing_model="prefill pool: M/D/1 (Pollaczek-Khinchine, Kleinrock 1975, Eq. 5.73) "
                       "per prefill replica, then the KV transfer; decode pool: Little's law "
                       "on decode-only steps")
    return _Decode(record=record, batch=max(1, math.ceil(batch - 1e-9)), rate_max=rate_max,
                   utilization=rate / rate_max)


def _prefixed(derivations: tuple[Derivation, ...], prefix: str) -> list[Derivation]:
    return [attrs.evolve(item, quantity=f"{prefix}{item.quantity}") for item in derivations]


def build_disaggregated_plan(spec: Spec, strategies: Mapping[str, Strategy[Any]]) -> Plan:
    """The plan of a spec with `[inference.disaggregated]`: its decode pool first (the flat
    schema-1 fields read it: TTFT as a request sees it, TPOT, throughput over all GPUs),
    then its prefill pool."""
    from llmpar.inference.evaluate import build_inference_plan, serving_of
    from llmpar.loading.checks import resolve_layout

    inference = spec.inference
    assert inference is not None and inference.disaggregated is not None
    specs = {role: pool_spec(spec, role, strategies) for role in ROLES}
    layouts: dict[str, Layout] = {role: resolve_layout(specs[role], strategies)[0]
                                  for role in ROLES}
    servings = {role: serving_of(specs[role], layouts[role], strategies) for role in ROLES}
    prefill_plan = build_inference_plan(specs["prefill"], layouts["prefill"], strategies,
                                        serving=servings["prefill"])
    prefill_pool = prefill_plan.serving[0]
    prefill_seconds = prefill_pool.prefill_seconds
    bandwidth, latency, link = _link(spec)
    shares = {role: _request_cache_bytes(servings[role]) for role in ROLES}
    per_request = max(shares.values())
    batch_prompts = prefill_pool.batch_size
    transfer = (None if bandwidth is None
                else latency + batch_prompts * per_request / bandwidth)
    prefill_replicas = layouts["prefill"].degree("data")
    decode_replicas = layouts["decode"].degree("data")
    warnings: list[str] = []
    if transfer is None:
        warnings.append("no bandwidth between the pools ([hardware] "
                        "inter_node_bandwidth_bytes_per_s, or [inference.disaggregated] "
                        "kv_transfer_bandwidth_bytes_per_s): the KV transfer is not timed "
                        "(TTFT leaves it out)")
    decode_spec = specs["decode"]
    steady: _Decode | None = None
    prefill_rate_max = (prefill_replicas * batch_prompts / prefill_seconds
                        if prefill_seconds else None)
    if inference.request_rate_per_s is not None and prefill_rate_max:
        steady = _decode_steady(servings["decode"], prefill_seconds or 0.0, transfer or 0.0,
                                prefill_rate_max)
        assert decode_spec.inference is not None
        static = attrs.evolve(decode_spec.inference, request_rate_per_s=None,
                              batch_size=steady.batch, prefill_chunk_tokens=steady.batch)
        decode_spec = attrs.evolve(decode_spec, inference=static)
    decode_plan = build_inference_plan(decode_spec, layouts["decode"], strategies)
    decode_pool = decode_plan.serving[0]
    gpus = spec.hardware.num_gpus
    out = inference.generated_tokens
    ttft: float | None = None
    changes: dict[str, Any] = {}
    if steady is not None and steady.record is not None:
        record = attrs.evolve(steady.record,
                              tokens_per_second_per_gpu=steady.record.tokens_per_second / gpus)
        ttft = record.ttft_seconds
        changes = dict(continuous=record, tpot_seconds=record.tpot_seconds,
                       tokens_per_second=record.tokens_per_second,
                       tokens_per_second_per_gpu=record.tokens_per_second / gpus,
                       tokens_per_second_per_user=record.tokens_per_second_per_user,
                       latency_seconds=record.latency_seconds)
    elif prefill_seconds is not None and decode_pool.tpot_seconds:
        ttft = prefill_seconds + (transfer or 0.0)
        latency = ttft + (out - 1) * decode_pool.tpot_seconds
        # The pools work as a pipeline: a batch's output leaves the decode pool while the
        # next batch prefills, so the slower pool sets the rate.
        period = max((out - 1) * decode_pool.tpot_seconds, ttft)
        tokens = decode_pool.global_batch_size * out / period
        changes = dict(latency_seconds=latency, tokens_per_second=tokens,
                       tokens_per_second_per_gpu=tokens / gpus)
    limits = [rate for rate in (prefill_rate_max,
                                steady.rate_max if steady is not None else None)
              if rate is not None]
    rate = inference.request_rate_per_s
    record_d = Disaggregation(
        prefill_gpus=inference.disaggregated.prefill_gpus,
        decode_gpus=inference.disaggregated.decode_gpus,
        prefill_replicas=prefill_replicas, decode_replicas=decode_replicas,
        prefill_seconds=prefill_seconds, prompts_per_prefill=batch_prompts,
        kv_transfer_bytes_per_gpu=batch_prompts * per_request,
        kv_transfer_seconds=transfer, kv_transfer_bandwidth_bytes_per_s=bandwidth,
        kv_transfer_link=link, ttft_seconds=ttft,
        prefill_max_request_rate_per_s=prefill_rate_max,
        decode_max_request_rate_per_s=steady.rate_max if steady is not None else None,
        prefill_utilization=(rate / prefill_rate_max if rate is not None and prefill_rate_max
                             else None),
        decode_utilization=steady.utilization if steady is not None else None,
        rate_limited_by=(None if steady is None or not limits else
                         "prefill" if prefill_rate_max == min(limits) else "decode"))
    # The request's prefill is the prefill pool's; the decode pool's own is never run.
    decode_phase = decode_pool.phases[-1:] if decode_pool.phases else ()
    # Its utilisation would count a prefill it never runs: none is stated.
    decode_pool = attrs.evolve(decode_pool, name="decode", role="decode", mfu=None, hfu=None,
                               prefill_seconds=ttft, disaggregation=record_d,
                               phases=prefill_pool.phases[:1] + decode_phase, **changes)
    prefill_pool = attrs.evolve(prefill_pool, name="prefill", role="prefill", tpot_seconds=None,
                                latency_seconds=prefill_seconds, tokens_per_second=None,
                                tokens_per_second_per_gpu=None,
                                tokens_per_second_per_user=None, disaggregation=record_d)
    busiest = max((decode_plan, prefill_plan), key=lambda p: p.total_bytes)
    memory = {name: getattr(busiest, name) for name in (
        "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
        "buffers_bytes", "total_bytes", "capacity_bytes", "peak_stage", "stages")}
    memory["fits"] = decode_plan.fits and prefill_plan.fits
    warnings += list(decode_plan.warnings)
    warnings += [f"prefill pool: {text}" for text in prefill_plan.warnings]
    requested = spec.inference.request_rate_per_s if spec.inference is not None else None
    for role, rate in (("prefill", prefill_rate_max),
                       ("decode", record_d.decode_max_request_rate_per_s)):
        if requested is not None and rate is not None and requested >= rate:
            warnings.append(f"{role} pool overloaded: {requested:g} requests/s against the "
                            f"{rate:.3g} it sustains; requests queue without bound")
    # The decode pool's own prefill is never run: its TTFT and latency are the request's.
    replaced = ("prefill_seconds", "latency_seconds")
    derivations = [item for item in decode_plan.derivations if item.quantity not in replaced]
    derivations += _prefixed(prefill_plan.derivations, "prefill.")
    derivations += [_transfer_derivation(record_d, shares, link),
                    _ttft_derivation(record_d, decode_pool)]
    return attrs.evolve(decode_plan, num_gpus=gpus, layout=dict(decode_pool.layout),
                        serving=(decode_pool, prefill_pool), warnings=tuple(
                            dict.fromkeys(warnings)),
                        derivations=tuple(derivations), **memory)


def _ttft_derivation(record: Disaggregation, pool: ServingPool) -> Derivation:
    state = pool.continuous
    queue = state.queue_seconds if state is not None else 0.0
    return Derivation(
        quantity="prefill_seconds", value=record.ttft_seconds, unit="s",
        rule="queue (M/D/1 on a prefill replica; none under static batching) + the prefill "
             "pool's prefill + kv_transfer_seconds",
        source="DistServe, arXiv:2401.09670, Sec. 3 (TTFT of disaggregated serving); "
               "Kleinrock 1975, Eq. 5.73 (the queue)",
        # An overloaded prefill pool's queue grows without bound: said in words, as JSON
        # has no infinity.
        inputs={"queue_seconds": queue if queue is not None else "unbounded (overloaded)",
                "prefill_seconds": record.prefill_seconds or 0.0,
                "kv_transfer_seconds": record.kv_transfer_seconds or 0.0})


def _transfer_derivation(record: Disaggregation, shares: Mapping[str, int],
                         link: str) -> Derivation:
    return Derivation(
        quantity="kv_transfer_seconds", value=record.kv_transfer_seconds, unit="s",
        rule="latency + prompts x max(prefill GPU's share, decode GPU's share of one prompt's "
             "cache) / bandwidth per GPU",
        source=TRANSFER_SOURCE,
        inputs={"prefill_share_bytes": shares["prefill"], "decode_share_bytes": shares["decode"],
                "prompts": record.prompts_per_prefill,
                "bandwidth_bytes_per_s": record.kv_transfer_bandwidth_bytes_per_s or 0.0,
                "link": link})
