"""The largest batch, the longest context and the longest prompt that fit, and the term
that limits each.

Each is the largest value whose peak memory (`peak_memory`: weights, the KV cache at the
end of generation, the larger of a prefill and a decode step's workspace, the runtime
allowance) fits, found by `largest_within`. Each first tries the closed form of its memory
(the batch: the straight line memory follows past a whole prefill chunk; the context, and
the prompt past a whole chunk: the cache's blocks, `held_tokens_within`), confirmed on
`peak_memory` at the answer and one past it, and searches only where that fails. They
differ in what they hold fixed:
- max_batch_size: sequences per replica, at the spec's prompt and generated tokens;
- max_context_tokens: tokens held in each sequence's cache at the end of generation
  (prompt + generated), at the spec's batch, with the workspace of the spec's own prefill
  (as when the extra tokens are generated: a decode step's workspace does not grow with
  the context); at most the model's max_position_embeddings;
- max_prompt_tokens: tokens of each prompt, at the spec's batch, with the spec's
  generated_tokens still to come after it: the cache of prompt + generated and the
  prefill workspace of that prompt grow with it; prompt + generated at most
  max_position_embeddings.
Memory never shrinks as any of them grows (the workspace is the largest prefill step's, a
whole chunk under chunked prefill: `memory.prefill_peak_shape`), so the bisection finds the
largest value that fits, and one more does not. Hence a spec within the positions fits
exactly when its prompt is at most max_prompt_tokens, and max_prompt_tokens + generated
lies between the spec's context and max_context_tokens: at most max_context_tokens when the
spec fits (a longer prompt's prefill needs more than the spec's), at least it when the spec
does not (its own prefill leaves the cache less room).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llmpar.inference.kv_cache import RECURRENT, windowed_cache_bytes
from llmpar.inference.memory import (
    ServingMemory,
    StageFixed,
    fixed_parts,
    peak_memory,
    stage_workspace,
)
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


def largest_within(measure: Callable[[int], float], target: float,
                   limit: int = SEARCH_LIMIT, *, strict: bool = False,
                   guess: int | None = None) -> int | None:
    """The largest n in [1, limit] with measure(n) <= target (< with `strict`), for a
    non-decreasing measure; 0 if none; None if all.

    The answer is `largest_fitting`'s; it is found in fewer measurements because peak
    memory is nearly a straight line in a batch or a context (straight pieces between
    the KV cache's blocks and the prefill's chunks): each step goes where the line
    through the last two measurements crosses the target, and falls back to doubling or
    halving whenever that does not shrink the interval fast enough. A `guess` (a closed
    form's answer) is tried first: when it fits and one more does not (or it is `limit`
    and fits), it is the answer, in two measurements; else the search starts from the
    guess's two values: from the larger that fits, or between 1 and the guess when it
    does not."""
    seen: dict[int, float] = {}

    def measured(n: int) -> float:
        if n not in seen:
            seen[n] = measure(n)
        return seen[n]

    def fits(value: float) -> bool:
        return value < target if strict else value <= target

    if not fits(measured(1)):
        return 0
    if guess is not None and 1 <= guess <= limit and fits(measured(guess)):
        if guess == limit:
            return None
        if not fits(measured(guess + 1)):
            return guess
    failing_known = [n for n, value in seen.items() if not fits(value)]
    fitting_known = sorted(n for n, value in seen.items() if fits(value)
                           and n < min(failing_known, default=limit + 1))
    if failing_known:
        top = min(failing_known)
        fitting, failing = (fitting_known[-1], seen[fitting_known[-1]]), (top, seen[top])
    else:
        start = [(n, seen[n]) for n in fitting_known[-2:]]
        found, failing = _bracket(measured, fits, target, limit, start[-1],
                                  start[0] if len(start) == 2 else None)
        if found is None:
            return None
        fitting = found
    (low, at_low), (top, at_top) = fitting, failing
    # Interpolation on a curve keeps moving the same end (regula falsi); halving the
    # other end's distance to the target each time it is kept twice (the Illinois rule)
    # brings the interval down on both sides, and a halving every fourth slow step bounds
    # the measurements at about twice the bisection's.
    weight_low, weight_top, kept, slow = at_low, at_top, "", 0
    while top - low > 1:
        width = top - low
        middle = (low + top) // 2
        if slow < 3 and weight_top > weight_low:
            guess = low + int((target - weight_low) * width / (weight_top - weight_low))
            middle = min(max(guess, low + 1), top - 1)
        value = measured(middle)
        if fits(value):
            low, at_low, weight_low = middle, value, value
            if kept == "top":
                weight_top = target + (weight_top - target) / 2
            kept = "top"
        else:
            top, at_top, weight_top = middle, value, value
            if kept == "low":
                weight_low = target - (target - weight_low) / 2
            kept = "low"
        slow = slow + 1 if top - low > width // 2 else 0
    return low


def _bracket(measure: Callable[[int], float], fits: Callable[[float], bool], target: float,
             limit: int, start: tuple[int, float], previous: tuple[int, float] | None
             ) -> tuple[tuple[int, float] | None, tuple[int, float]]:
    """(n, measure) that fits and a larger one that does not, from `start` (which fits,
    after `previous`), extrapolating along the last two measurements (doubling the
    stride each time that falls short); None in place of the first when even `limit`
    fits."""
    low, at_low = start
    boost = 1
    while True:
        if low >= limit:
            return None, (low, at_low)
        step = low  # doubling, until two measurements give a slope
        if previous is not None and at_low > previous[1]:
            slope = (at_low - previous[1]) / (low - previous[0])
            step = max(1, int(min((target - at_low) / slope, float(limit)))) + 1
        step = min(step * boost, limit - low)
        candidate = low + step
        value = measure(candidate)
        if not fits(value):
            return (low, at_low), (candidate, value)
        previous, low, at_low, boost = (low, at_low), candidate, value, boost * 2


def _size(num_bytes: float) -> str:
    """GB (10^9) and GiB labelled; MB (10^6) and MiB under a GB."""
    if abs(num_bytes) >= GB:
        return format_bytes(num_bytes)
    return f"{num_bytes / 1e6:,.2f} MB ({num_bytes / 2**20:,.2f} MiB)"


def _capacity(serving: Serving) -> int:
    return serving.spec.hardware.gpu.usable_bytes


def _fixed_bytes(memory: ServingMemory) -> int:
    return memory.weights_bytes + memory.overhead_bytes


def remembered(measure: Callable[[int], ServingMemory]) -> Callable[[int], ServingMemory]:
    """`measure`, computing each value once: the search and the words of its limit ask
    for the same points."""
    found: dict[int, ServingMemory] = {}

    def measured(value: int) -> ServingMemory:
        if value not in found:
            found[value] = measure(value)
        return found[value]

    return measured


def held_tokens_within(serving: Serving, fixed: StageFixed, room: int,
                       batch: int) -> int | None:
    """The most tokens per sequence whose KV cache on this stage's GPU stays within
    `room` bytes (closed form of `windowed_cache_bytes`), or None where it has no closed
    form (no layer keeps every token, or the answer falls below a window).

    A context rank keeps whole blocks of its share: ceil(ceil(n / c) / B) x B =
    ceil(n / (c B)) x B tokens for n held (c context ranks, B tokens a block, 1 without
    blocks). With every window filled, the cache is
    round(p x b x (N x B x k + C) + b x recurrent) for n in ((k - 1) c B, k c B] (N layers
    keeping every token, C the windowed layers' blocks, p bytes a token, b sequences), so
    the most tokens are k c B for the largest k it allows."""
    inference = serving.inference
    context, block = serving.degree("context"), inference.kv_block_tokens or 1
    full = sum(count for window, count in fixed.windows if window is None)
    windows = [window for window, _ in fixed.windows if window not in (None, RECURRENT)]
    if full == 0 or fixed.kv_bytes_per_token <= 0:
        return None
    step = context * block

    def cache(k: int) -> int:
        return windowed_cache_bytes(fixed.kv_bytes_per_token, fixed.state_bytes, inference,
                                    context, fixed.windows, batch, k * step)

    top = max(windows, default=0)
    base = cache(-(-top // step)) - fixed.kv_bytes_per_token * batch * full * block * (
        -(-top // step))  # the windowed layers' blocks and the recurrent states
    k = max(0, int((room - base) / (fixed.kv_bytes_per_token * batch * full * block)))
    for _ in range(4):  # the rounding of the bytes moves k by one at most
        if k > 0 and cache(k) > room:
            k -= 1
        elif cache(k + 1) <= room:
            k += 1
        else:
            break
    tokens = k * step
    return tokens if tokens >= top and tokens > 0 else None


def _context_guess(serving: Serving, capacity: int, batch: int,
                   prompt: int | None = None) -> int | None:
    """The closed form of the most tokens held per sequence (`held_tokens_within`) beside
    each stage's workspace at `prompt` (default the spec's), over the stages; None where a
    stage has none."""
    guesses = []
    for part in serving.fixed or fixed_parts(serving):
        workspace = round(stage_workspace(serving, part, batch, prompt))
        room = capacity - part.weights_bytes - part.overhead_bytes - workspace
        found = held_tokens_within(serving, part, room, batch)
        if found is None:
            return None
        guesses.append(found)
    return min(guesses, default=None)


def max_batch_size(serving: Serving) -> Limit:
    """Sequences per replica that fit at the spec's context, and what limits them."""
    capacity = _capacity(serving)
    memory = remembered(lambda batch: peak_memory(serving, batch=batch))
    # Memory is straight in the batch on pieces: the line through two batches past the
    # one whose prompts fill a prefill chunk (the workspace stops growing with the
    # prompts there) gives the closed form's guess.
    inference = serving.inference
    chunk = inference.prefill_chunk_tokens
    start = 1 if chunk is None else max(1, -(-chunk // max(1, inference.computed_prompt_tokens)))
    first, second = memory(start).total_bytes, memory(start + 1).total_bytes
    guess = (start + int((capacity - first) / (second - first))
             if second > first and first <= capacity else None)
    best = largest_within(lambda batch: memory(batch).total_bytes, capacity, guess=guess)
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
    """Prompt + generated tokens per sequence that fit at the spec's batch: the cache at
    the end of generation, beside the workspace of the spec's own prefill."""
    capacity = _capacity(serving)
    positions = serving.spec.model.max_position_embeddings
    limit = positions if positions is not None else SEARCH_LIMIT
    memory = remembered(lambda tokens: peak_memory(serving, tokens))
    guess = _context_guess(serving, capacity, serving.inference.batch_size)
    best = largest_within(lambda tokens: memory(tokens).total_bytes, capacity, limit,
                          guess=None if guess is None else min(guess, limit))
    if best is None:
        if positions is None:
            return Limit(value=None, limited_by="nothing: every layer's cache is capped by "
                                                "the sliding window")
        return Limit(value=positions,
                     limited_by=f"model.max_position_embeddings ({positions:,})")
    at = memory(max(best, 1))
    return Limit(value=best, limited_by=(
        f"kv_cache: {_size(at.kv_cache_bytes)} at {best:,} tokens (prompt + generated) "
        f"x {serving.inference.batch_size:,} sequences beside "
        f"{_size(at.total_bytes - at.kv_cache_bytes)} of weights, workspace "
        f"of the spec's {serving.inference.prompt_tokens:,}-token prompts and runtime "
        f"allowance, in {_size(capacity)}"))


def max_prompt_tokens(serving: Serving) -> Limit:
    """Prompt tokens per sequence that fit at the spec's batch with the spec's
    generated_tokens still to come: the cache of prompt + generated and the workspace of
    that prompt's prefill."""
    capacity = _capacity(serving)
    inference = serving.inference
    generated, batch = inference.generated_tokens, inference.batch_size
    positions = serving.spec.model.max_position_embeddings
    if positions is not None and positions <= generated:
        return Limit(value=0, limited_by=(
            f"model.max_position_embeddings ({positions:,}) leaves no position for a "
            f"prompt before generated_tokens ({generated:,})"))
    limit = positions - generated if positions is not None else SEARCH_LIMIT

    memory = remembered(lambda prompt: peak_memory(serving, prompt=prompt))
    guess = None
    if inference.prefill_chunk_tokens is not None:
        # Past a whole chunk the prefill's workspace stops growing: the cache of prompt +
        # generated tokens is all that grows, beside the chunk's workspace.
        held = _context_guess(serving, capacity, batch, limit)
        guess = None if held is None or held <= generated else min(held - generated, limit)
    best = largest_within(lambda prompt: memory(prompt).total_bytes, capacity, limit,
                          guess=guess)
    if best is None:
        if positions is None:
            return Limit(value=None, limited_by=(
                "nothing: every layer's cache is capped by the sliding window and the "
                "prefill runs in chunks"))
        return Limit(value=limit, limited_by=(
            f"model.max_position_embeddings ({positions:,}) less generated_tokens "
            f"({generated:,})"))
    at = memory(max(best, 1))
    parts = (f"{_size(at.kv_cache_bytes)} of KV cache ({max(best, 1) + generated:,} tokens "
             f"x {batch:,} sequences) and {_size(at.workspace_bytes)} of workspace beside "
             f"{_size(_fixed_bytes(at))} of weights and runtime allowance")
    if best == 0:
        return Limit(value=0, limited_by=(
            f"a 1-token prompt needs {_size(at.total_bytes)}: {parts}, over "
            f"{_size(capacity)}"))
    term = "kv_cache" if at.kv_cache_bytes >= at.workspace_bytes else "workspace"
    return Limit(value=best, limited_by=(
        f"{term}: at {best:,}-token prompts, {parts}, in {_size(capacity)}"))
