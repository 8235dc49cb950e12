"""The largest batch and the longest context that fit, and the term that limits each.

Memory grows monotonically with the batch (KV cache and workspace per sequence) and
with the context (KV cache per token, up to a layer's window), so the largest value
that fits is found by doubling and bisection over `peak_memory`. The context search
keeps the spec's prefill step (a longer prompt prefilled in chunks of the same size needs
no more workspace) and stops at the model's max_position_embeddings.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llmpar.inference.memory import ServingMemory, peak_memory
from llmpar.inference.serving import Serving
from llmpar.units import GB, format_bytes

SEARCH_LIMIT = 2**40
"""No batch or context beyond this is searched (a bound, not a claim)."""


@attrs.frozen(kw_only=True)
class Limit:
    value: int | None
    """The largest value that fits; 0 when even 1 does not; None when nothing binds."""
    limited_by: str
    """The term that stops it, in words with its numbers."""


def largest_fitting(fits: Callable[[int], bool], limit: int = SEARCH_LIMIT) -> int | None:
    """The largest n in [1, limit] with fits(n), fits monotone; 0 if none; None if all."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    if high > limit:
        if fits(limit):
            return None
        high = limit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _size(num_bytes: float) -> str:
    """GB (10^9) and GiB labelled; MB (10^6) and MiB under a GB."""
    if abs(num_bytes) >= GB:
        return format_bytes(num_bytes)
    return f"{num_bytes / 1e6:,.2f} MB ({num_bytes / 2**20:,.2f} MiB)"


def _capacity(serving: Serving) -> int:
    return serving.spec.hardware.gpu.memory_bytes


def _fixed_bytes(memory: ServingMemory) -> int:
    return memory.weights_bytes + memory.overhead_bytes


def max_batch_size(serving: Serving) -> Limit:
    """Sequences per replica that fit at the spec's context, and what limits them."""
    capacity = _capacity(serving)

    def memory(batch: int) -> ServingMemory:
        return peak_memory(serving, batch=batch)

    best = largest_fitting(lambda batch: memory(batch).total_bytes <= capacity)
    base = memory(max(best or 1, 1))
    if best == 0:
        return Limit(value=0, limited_by=(
            f"weights ({_size(base.weights_bytes)}) and runtime allowance "
            f"({_size(base.overhead_bytes)}) leave no room for one sequence in "
            f"{_size(capacity)}"))
    grown = memory((best or 1) + 1)
    kv = grown.kv_cache_bytes - base.kv_cache_bytes
    workspace = grown.workspace_bytes - base.workspace_bytes
    term = "kv_cache" if kv >= workspace else "workspace"
    return Limit(value=best, limited_by=(
        f"{term}: each sequence adds {_size(kv)} of KV cache and "
        f"{_size(workspace)} of workspace to {_size(_fixed_bytes(base))} of "
        f"weights and runtime allowance, in {_size(capacity)}"))


def max_context_tokens(serving: Serving) -> Limit:
    """Prompt + generated tokens per sequence that fit at the spec's batch."""
    capacity = _capacity(serving)
    positions = serving.spec.model.max_position_embeddings
    limit = positions if positions is not None else SEARCH_LIMIT
    best = largest_fitting(lambda tokens: peak_memory(serving, tokens).total_bytes <= capacity,
                           limit)
    if best is None:
        if positions is None:
            return Limit(value=None, limited_by="nothing: every layer's cache is capped by "
                                                "the sliding window")
        return Limit(value=positions,
                     limited_by=f"model.max_position_embeddings ({positions:,})")
    memory = peak_memory(serving, max(best, 1))
    return Limit(value=best, limited_by=(
        f"kv_cache: {_size(memory.kv_cache_bytes)} at {best:,} tokens beside "
        f"{_size(memory.total_bytes - memory.kv_cache_bytes)} of weights, workspace "
        f"and runtime allowance, in {_size(capacity)}"))
