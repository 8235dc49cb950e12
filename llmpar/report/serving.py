"""Report sections of an inference plan: memory with the KV cache, the serving numbers,
and each phase against its roofline floor."""

from __future__ import annotations

from collections.abc import Callable

from llmpar.plan import Plan
from llmpar.report.tables import Table
from llmpar.units import GB, GiB, format_duration


def _row(label: str, num_bytes: float, capacity: float) -> tuple[str, ...]:
    return (label, f"{num_bytes / GB:,.2f}", f"{num_bytes / GiB:,.2f}",
            f"{num_bytes / capacity:.1%}")


def serving_memory(plan: Plan) -> Table:
    """Weights, KV cache, workspace and runtime allowance on one GPU."""
    overhead = plan.runtime_overhead_bytes or 0
    parts = [("weights", plan.weights_bytes), ("KV cache", plan.kv_cache_bytes or 0)]
    if plan.activations_bytes is not None:
        parts.append(("activation workspace", plan.activations_bytes))
    parts.append(("runtime allowance", overhead))
    other = plan.total_bytes - sum(value for _, value in parts)
    if other:
        parts.append(("other buffers", other))
    parts.append(("total", plan.total_bytes))
    capacity = plan.capacity_bytes
    rows = [_row(label, value, capacity) for label, value in parts]
    rows.append(_row("capacity", capacity, capacity))
    bars = [value / capacity for _, value in parts] + [None]
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    notes = [f"{verdict}: {plan.total_bytes / capacity:.1%} of capacity "
             "(GB = 10^9 bytes, GiB = 2^30 bytes)"]
    headroom = _headroom_bytes(plan)
    if headroom:
        notes.append(f"the runtime allowance holds back {headroom / GB:,.2f} GB "
                     f"({headroom / GiB:,.2f} GiB) the engine leaves unallocated "
                     "(1 - [inference] memory_utilization of the capacity)")
    return Table(title="Memory per GPU", columns=("", "GB", "GiB", "of capacity"),
                 rows=tuple(rows), bars=tuple(bars), marked=(len(parts) - 1,),
                 notes=tuple(notes))


def _headroom_bytes(plan: Plan) -> float:
    """The share of memory the engine leaves free, from the allowance's derivation."""
    for derivation in plan.derivations:
        if derivation.quantity == "runtime_overhead_bytes":
            return float(derivation.inputs.get("headroom_bytes", 0.0))
    return 0.0


def _optional(value: float | None, render: Callable[[float], str]) -> str:
    return "-" if value is None else render(value)


def serving(plan: Plan) -> Table:
    """Limits and speeds of the workload."""
    pool = plan.serving[0] if plan.serving else None
    rows = [
        ("max batch (sequences per replica)", _optional(plan.max_batch_size, lambda v: f"{v:,}"),
         plan.max_batch_size_limited_by or ""),
        ("max context (prompt + generated)",
         _optional(plan.max_context_tokens, lambda v: f"{v:,}"),
         plan.max_context_tokens_limited_by or ""),
        ("max prompt (tokens)", _optional(pool.max_prompt_tokens if pool else None,
                                          lambda v: f"{v:,}"),
         (pool.max_prompt_tokens_limited_by if pool else None) or ""),
        ("time to first token", _optional(plan.prefill_seconds, format_duration), "prefill"),
        ("time per output token", _optional(plan.tpot_seconds, format_duration),
         "decode step, first token excluded"),
        ("latency", _optional(plan.latency_seconds, format_duration),
         "TTFT + (generated - 1) x TPOT"),
        ("output tokens/s", _optional(plan.tokens_per_second, lambda v: f"{v:,.0f}"),
         "all GPUs"),
        ("output tokens/s per GPU", _optional(plan.tokens_per_second_per_gpu,
                                              lambda v: f"{v:,.1f}"), ""),
        ("output tokens/s per user", _optional(plan.tokens_per_second_per_user,
                                               lambda v: f"{v:,.1f}"), ""),
        ("decode compute-bound from batch",
         _optional(plan.decode_compute_bound_batch_size, lambda v: f"{v:,}"), ""),
    ]
    trust = pool.time_trust if pool else ""
    notes = [f"times: {trust}"] if trust else []
    if pool is not None and pool.continuous is not None:
        # Static times serve one batch start to end; the steady state is its own table.
        rows = [row for row in rows if row[0].startswith(("max ", "decode "))]
        notes.insert(0, "continuous batching: times in the steady-state table below")
    if pool is not None and pool.disaggregation is not None:
        rows += _disaggregation_rows(plan)
        notes.insert(0, "disaggregated: the limits are the decode pool's; TTFT is the "
                        "prefill pool's prefill + the KV transfer (+ queue)")
    if pool is not None and plan.prefill_seconds is not None:
        notes.append(f"engine profile: {pool.engine}" if pool.engine else
                     "engine profile: none ([inference] engine), the roofline alone")
    return Table(title="Serving", columns=("quantity", "value", "note"), rows=tuple(rows),
                 text_columns=(0, 2), notes=tuple(notes))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}/s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _disaggregation_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """The pools of a disaggregated plan, the KV transfer and what limits the rate."""
    record = plan.serving[0].disaggregation
    assert record is not None
    layouts = {pool.role: " x ".join(f"{k} {v}" for k, v in pool.layout.items() if v > 1)
               or "one GPU" for pool in plan.serving}
    prefill = plan.serving[1] if len(plan.serving) > 1 else None
    rows = [
        ("prefill pool", f"{record.prefill_gpus} GPUs",
         f"{record.prefill_replicas} replica(s) of {layouts.get('prefill', '')}"),
        ("decode pool", f"{record.decode_gpus} GPUs",
         f"{record.decode_replicas} replica(s) of {layouts.get('decode', '')}"),
        ("prefill on the prefill pool", _optional(record.prefill_seconds, format_duration),
         f"{record.prompts_per_prefill:,} prompt(s) at once"),
        ("prefill pool KV cache per GPU",
         "-" if prefill is None else f"{(prefill.kv_cache_bytes or 0) / GB:,.2f} GB",
         "the prompts being prefilled only; workspace " + (
             "-" if prefill is None else f"{(prefill.workspace_bytes or 0) / GB:,.2f} GB")),
        ("KV transfer", _optional(record.kv_transfer_seconds, format_duration),
         f"{record.kv_transfer_bytes_per_gpu / GB:,.3f} GB per GPU over "
         f"{record.kv_transfer_link}"),
        ("prefill pool utilisation", _share(record.prefill_utilization),
         f"max {_rate(record.prefill_max_request_rate_per_s)}"),
        ("decode pool utilisation", _share(record.decode_utilization),
         f"max {_rate(record.decode_max_request_rate_per_s)}"),
        ("rate limited by", record.rate_limited_by or "-", "the pool with the lower maximum"),
    ]
    return rows


def phases(plan: Plan) -> Table | None:
    """Each phase's time, its roofline floor and what bounds it."""
    if not plan.phases:
        return None
    host = any(p.overhead_seconds for p in plan.phases)  # an engine's host time
    rows = tuple((p.name, format_duration(p.seconds), format_duration(p.floor_seconds),
                  format_duration(p.compute_seconds), format_duration(p.memory_seconds),
                  format_duration(p.communication_seconds),
                  *((format_duration(p.overhead_seconds),) if host else ()), p.bound)
                 for p in plan.phases)
    columns = ("phase", "time", "floor", "compute", "memory", "communication",
               *(("engine host",) if host else ()), "bound")
    return Table(title="Phases, one step on one GPU", columns=columns,
                 rows=rows, text_columns=(0, len(columns) - 1),
                 notes=("floor: max(FLOPs / peak, bytes / HBM bandwidth) at full efficiency",))


def _seconds(value: float | None) -> str:
    return "overloaded" if value is None else format_duration(value)


def continuous(plan: Plan) -> Table | None:
    """The steady state under continuous batching: batch, TPOT, TTFT, throughput."""
    state = plan.serving[0].continuous if plan.serving else None
    if state is None:
        return None
    given = (f"{state.concurrency:,.0f} requests in flight" if state.mode == "concurrency"
             else f"{state.request_rate_per_s:,.2f} requests/s arriving")
    in_flight = "-" if state.concurrency is None else f"{state.concurrency:,.1f}"
    rows = [
        ("workload", given, state.mode),
        ("running batch per replica", f"{state.batch_size:,.1f}",
         f"limited by {state.batch_limited_by}"),
        ("requests in flight", in_flight, "all replicas (Little's law for a rate)"),
        ("prefill tokens per step", f"{state.prefill_tokens_per_step:,.0f}",
         "batch x prompt / generated, mixed into each decode step"),
        ("prefill steps per request", f"{state.prefill_steps_per_request:,}",
         "token budget " + ("none" if state.token_budget is None
                            else f"{state.token_budget:,} a step")),
        ("time per output token", format_duration(state.tpot_seconds),
         f"one mixed step; floor {format_duration(state.tpot_floor_seconds)}"),
        ("time to first token (mean)", _seconds(state.ttft_seconds),
         f"queue {_seconds(state.queue_seconds)} + prefill steps"),
        ("time to first token (p90 / p99)",
         f"{_seconds(state.ttft_p90_seconds)} / {_seconds(state.ttft_p99_seconds)}",
         "exponential tail of the wait" if state.mode != "concurrency" else "no spread"),
        ("latency", _seconds(state.latency_seconds), "TTFT + (generated - 1) x TPOT"),
        ("output tokens/s", f"{state.tokens_per_second:,.0f}", "all GPUs"),
        ("output tokens/s per GPU", f"{state.tokens_per_second_per_gpu:,.1f}", ""),
        ("output tokens/s per user", f"{state.tokens_per_second_per_user:,.1f}", "1 / TPOT"),
        ("max request rate", f"{state.max_request_rate_per_s:,.2f}/s", "at the batch limit"),
    ]
    notes = [f"queueing: {state.queueing_model}"]
    if not state.stable:
        notes.insert(0, "OVERLOADED: the request rate exceeds what the batch limit sustains; "
                        "the queue grows without bound")
    return Table(title="Continuous batching (steady state)",
                 columns=("quantity", "value", "note"), rows=tuple(rows),
                 text_columns=(0, 2), notes=tuple(notes))
