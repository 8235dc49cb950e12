"""Prefill and decode as forward steps: the sum of their operations' rooflines plus the
communication on the critical path.

- Prefill: the batch's prompts, in one step or in chunks of prefill_chunk_tokens (the
  attention work spread evenly over the chunks); it ends with the first token, so its time
  is the time to first token.
- Decode: one token per sequence, attending the average context of the decode steps,
  prompt + generated / 2 (step j attends prompt + j tokens, j = 1 .. generated - 1; attention
  is linear in the context, so the average step is the step at the average context).
A phase is compute-, memory- or communication-bound by the largest of its three parts, or
overhead-bound when a serving engine's host time per step is larger still
(`llmpar.inference.engine`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from llmpar.inference.capacity import largest_fitting, largest_within
from llmpar.inference.communication import cost, step_collectives
from llmpar.inference.engine import step_overhead_seconds
from llmpar.inference.memory import decode_shape, prefill_shape, prefill_steps
from llmpar.inference.operations import (
    OperationPiece,
    Step,
    counted_pieces,
    scaled,
    step_ops,
)
from llmpar.inference.overlap import (
    behind_other_micro_batch,
    contention_seconds,
    exposed_as,
    lockstep_prefill,
    micro_batch_step,
    micro_batches,
    staged_decode,
)
from llmpar.inference.serving import Serving
from llmpar.inference.speculative import expected_tokens
from llmpar.plan import CollectiveCost, InferencePhase
from llmpar.roofline import (
    Operation,
    Rates,
    compute_seconds,
    floor_seconds,
    memory_seconds,
    seconds,
)
from llmpar.strategy import Collective

COMPUTE_BOUND_SEARCH_LIMIT = 2**24
"""Largest batch the compute-bound search tries."""


@attrs.frozen(kw_only=True)
class PhaseResult:
    phase: InferencePhase
    operations: tuple[Operation, ...]
    collectives: tuple[CollectiveCost, ...]
    step: Step | None = None
    """The step whose collectives `sent` holds (None: not kept)."""
    sent: tuple[Collective, ...] = ()
    """What the strategies send in `step`, as `step_collectives` states it."""


def prefill_step(serving: Serving) -> Step:
    inference = serving.inference
    shape = prefill_shape(serving)
    return Step(tokens=shape.tokens, rows=shape.rows,
                sequences=inference.batch_size / prefill_steps(serving),
                queries=inference.computed_prompt_tokens,
                prior=float(inference.cached_prompt_tokens), phase="prefill")


def average_decode_context(serving: Serving) -> float:
    """Tokens a decode step attends on average: prompt + generated / 2."""
    inference = serving.inference
    return inference.prompt_tokens + inference.generated_tokens / 2


def decode_step(serving: Serving, batch: int | None = None) -> Step:
    """One decode step of `batch` sequences (default the spec's)."""
    batch = serving.inference.batch_size if batch is None else batch
    shape = decode_shape(serving, batch)
    return Step(tokens=shape.tokens, rows=shape.rows, sequences=batch,
                queries=1.0, prior=average_decode_context(serving) - 1, phase="decode")


def exposed_seconds(costs: list[CollectiveCost], operations: list[Operation],
                    rates: Rates) -> float:
    """Communication on the critical path: what cannot overlap, plus the context ring's time
    beyond the attention it runs behind."""
    behind = sum(seconds(op, rates) for op in operations if op.name.startswith("attention")
                 and op.name != "attention projections")
    hidden = sum(c.seconds - c.exposed_seconds for c in costs)
    return sum(c.exposed_seconds for c in costs) + max(0.0, hidden - behind)


def run_phase(serving: Serving, step: Step, steps: int, rates: Rates) -> PhaseResult:
    """`steps` identical forward steps of `step`."""
    count = micro_batches(serving, step)
    unit = micro_batch_step(step, count)
    operations = [op if count == 1 else scaled(op, count) for op in step_ops(serving, unit)]
    collectives = step_collectives(serving, unit)
    costs = [cost(serving, c if count == 1 else attrs.evolve(
        c, calls_per_step=c.calls_per_step * count)) for c in collectives]
    # Each operation's two rooflines once (`seconds` is their larger, `is_compute_bound`
    # whether it is the first), summed in the operations' order.
    times = [(compute_seconds(op, rates), memory_seconds(op, rates)) for op in operations]
    compute = sum((c for c, m in times if c > m), 0.0)
    memory = sum((m for c, m in times if not c > m), 0.0)
    if count == 1:
        exposed = exposed_seconds(costs, operations, rates)
    else:  # two-batch overlap (llmpar.inference.overlap)
        overlapped = [c.overlaps_micro_batch for c in collectives]
        shares = [float(c.compute_share) for c in collectives]
        # the SMs the hiding kernels take lengthen the compute they run beside
        work = compute + memory
        schedule = lockstep_prefill if step.phase == "prefill" else staged_decode
        lockstep = schedule(serving, unit, rates, costs, overlapped, shares)
        if lockstep is None:
            compute += contention_seconds(costs, overlapped, shares, work)
            costs = behind_other_micro_batch(costs, overlapped, work, shares)
        else:  # SGLang's prefill and decode schedules (llmpar.inference.overlap)
            compute += lockstep.slowdown_seconds
            costs = exposed_as(costs, overlapped, lockstep.exposed_seconds)
        pairs = list(zip(costs, overlapped, strict=True))
        exposed = exposed_seconds([c for c, hides in pairs if not hides], operations,
                                  rates) + sum(c.exposed_seconds for c, hides in pairs if hides)
    parts = {"compute": compute * steps, "memory": memory * steps,
             "communication": exposed * steps}
    overhead = step_overhead_seconds(serving, step.sequences, compute + memory + exposed)
    if overhead:  # the engine's host time (llmpar.inference.engine)
        parts["overhead"] = overhead * steps
    phase = InferencePhase(
        name=step.phase, seconds=sum(parts.values()),
        floor_seconds=floor_seconds(operations, rates) * steps,
        compute_seconds=parts["compute"], memory_seconds=parts["memory"],
        communication_seconds=parts["communication"], bound=max(parts, key=parts.__getitem__),
        flops=sum(op.flops for op in operations) * steps,
        bytes=sum(op.bytes for op in operations) * steps,
        tokens=int(step.queries), context_tokens=step.prior + step.queries, steps=steps,
        overhead_seconds=parts.get("overhead", 0.0))
    return PhaseResult(phase=phase, operations=tuple(operations), collectives=tuple(costs),
                       step=unit, sent=tuple(collectives))


def prefill(serving: Serving, rates: Rates) -> PhaseResult:
    return run_phase(serving, prefill_step(serving), prefill_steps(serving), rates)


def decode(serving: Serving, rates: Rates) -> PhaseResult:
    if serving.draft is not None:
        return speculative_decode(serving, rates)
    return run_phase(serving, decode_step(serving), 1, rates)


def speculative_decode(serving: Serving, rates: Rates) -> PhaseResult:
    """One output token under speculative decoding: a verify step of k + 1 tokens per
    sequence and k steps of the draft head, over the tokens a step yields on average
    (`llmpar.inference.speculative`)."""
    inference, draft = serving.inference, serving.draft
    assert inference.speculative is not None and draft is not None
    k = inference.speculative.draft_tokens
    plain = decode_step(serving)
    verify = attrs.evolve(plain, tokens=plain.tokens * (k + 1), rows=plain.rows * (k + 1),
                          queries=float(k + 1))
    checked = run_phase(serving, verify, 1, rates)
    head = attrs.evolve(draft, spec=attrs.evolve(draft.spec, inference=attrs.evolve(
        draft.inference, batch_size=inference.batch_size,
        prompt_tokens=inference.prompt_tokens, generated_tokens=inference.generated_tokens)))
    drafted = run_phase(head, decode_step(head), k, rates)
    share = 1 / expected_tokens(inference.speculative)
    a, b = checked.phase, drafted.phase
    parts = {name: (getattr(a, f"{name}_seconds") + getattr(b, f"{name}_seconds")) * share
             for name in ("compute", "memory", "communication", "overhead")}
    phase = attrs.evolve(
        a, seconds=sum(parts.values()), floor_seconds=(a.floor_seconds + b.floor_seconds) * share,
        compute_seconds=parts["compute"], memory_seconds=parts["memory"],
        communication_seconds=parts["communication"], overhead_seconds=parts["overhead"],
        bound=max(parts, key=parts.__getitem__), flops=(a.flops + b.flops) * share,
        bytes=(a.bytes + b.bytes) * share, tokens=1, context_tokens=plain.prior + 1)
    return PhaseResult(phase=phase, operations=checked.operations + drafted.operations,
                       collectives=checked.collectives + drafted.collectives)


def _piece_parts(serving: Serving, rates: Rates, batch: int,
                 pieces: list[tuple[OperationPiece, int]]) -> list[list[tuple[float, float]]]:
    """(compute seconds, memory seconds) of each operation of a decode step at `batch`, by
    piece (`counted_pieces`, or some of them)."""
    # The operations read the batch from the step alone: no spec of that batch is built.
    step = decode_step(serving, batch)
    split = micro_batches(serving, step)
    unit = micro_batch_step(step, split)
    return [[(split * count * compute_seconds(op, rates),
              split * count * memory_seconds(op, rates)) for op in piece(unit)]
            for piece, count in pieces]


PieceParts = Callable[[int], list[list[tuple[float, float]]]]
"""A decode step's (compute seconds, memory seconds) per operation at a batch, by piece."""


def _curved_guess(serving: Serving, rates: Rates, pieces: list[tuple[OperationPiece, int]],
                  by_piece: PieceParts) -> int | None:
    """Where the compute-bound search on the operations looks first: the search on the
    operations as straight lines through batches 1 and 2, but for the pieces of a step
    (`counted_pieces`) that leave their line by batch 7 (MoE experts touched: a curve),
    computed at each batch tried. A guess, confirmed on every operation
    (`largest_within`); None where no batch up to COMPUTE_BOUND_SEARCH_LIMIT is compute
    bound."""
    one, two, seven = by_piece(1), by_piece(2), by_piece(7)
    curved, lines = [], []
    for index, (first, second, third) in enumerate(zip(one, two, seven)):
        line = [(c1, c2 - c1, m1, m2 - m1) for (c1, m1), (c2, m2) in zip(first, second)]
        if not all(math.isclose(c0 + dc * 6, c, rel_tol=1e-9, abs_tol=1e-300)
                   and math.isclose(m0 + dm * 6, m, rel_tol=1e-9, abs_tol=1e-300)
                   for (c0, dc, m0, dm), (c, m) in zip(line, third)):
            curved.append(index)
        lines.append(line)
    bent = [pieces[i] for i in curved]
    known = {1: one, 2: two, 7: seven}  # every piece exact at the batches measured already

    def lead(batch: int) -> float:
        if batch in known:
            return _compute_lead([part for piece in known[batch] for part in piece])
        exact = dict(zip(curved, _piece_parts(serving, rates, batch, bent)))
        found = [part for index, line in enumerate(lines) for part in (
            exact[index] if index in exact
            else [(c0 + dc * (batch - 1), m0 + dm * (batch - 1)) for c0, dc, m0, dm in line])]
        return _compute_lead(found)

    return largest_within(lead, 0.0, COMPUTE_BOUND_SEARCH_LIMIT, strict=True)


def _memory_bound(parts: list[tuple[float, float]]) -> bool:
    """Whether the operations' memory-bound time exceeds their compute-bound time."""
    return _compute_lead(parts) < 0


def _compute_lead(parts: list[tuple[float, float]]) -> float:
    """Seconds by which the compute-bound operations outlast the memory-bound ones."""
    compute = sum([c for c, m in parts if c > m])
    memory = sum([m for c, m in parts if not c > m])
    return compute - memory


Parts = Callable[[int], list[tuple[float, float]]]
"""A decode step's (compute seconds, memory seconds) per operation at a batch."""


def _affine(parts: Parts) -> Callable[[int], bool] | None:
    """The decode predicate from each operation's times as straight lines in the batch
    (two evaluations), when they are (checked at two more batches); None when some
    operation is not (MoE experts touched: a curve)."""
    one, two = parts(1), parts(2)
    lines = [(c1, c2 - c1, m1, m2 - m1) for (c1, m1), (c2, m2) in zip(one, two)]
    for batch in (7, 1000):
        for (c0, dc, m0, dm), (c, m) in zip(lines, parts(batch)):
            if not (math.isclose(c0 + dc * (batch - 1), c, rel_tol=1e-9, abs_tol=1e-300)
                    and math.isclose(m0 + dm * (batch - 1), m, rel_tol=1e-9, abs_tol=1e-300)):
                return None

    def predicate(batch: int) -> bool:
        return _memory_bound([(c0 + dc * (batch - 1), m0 + dm * (batch - 1))
                              for c0, dc, m0, dm in lines])

    return predicate


def compute_bound_batch(serving: Serving, rates: Rates) -> int | None:
    """The smallest batch at which a decode step's compute part reaches its memory part;
    None when none up to COMPUTE_BOUND_SEARCH_LIMIT does (the cache reads grow with the batch
    as fast as the FLOPs). Searched on straight lines fitted to the operations when they
    are straight (then confirmed on the operations themselves at the answer), else on the
    operations at each batch tried, from the guess of `_curved_guess` (the straight pieces'
    lines, the curved pieces' operations), which two of those tries confirm."""

    pieces = counted_pieces(serving)
    measured: dict[int, list[list[tuple[float, float]]]] = {}

    def by_piece(batch: int) -> list[list[tuple[float, float]]]:
        if batch not in measured:  # the line fit and the searches share batches 1, 2, 7
            measured[batch] = _piece_parts(serving, rates, batch, pieces)
        return measured[batch]

    def parts(batch: int) -> list[tuple[float, float]]:
        return [part for piece in by_piece(batch) for part in piece]

    def exact(batch: int) -> bool:
        return _memory_bound(parts(batch))

    lines = _affine(parts)
    if lines is not None:
        below = largest_fitting(lines, COMPUTE_BOUND_SEARCH_LIMIT)
        confirmed = (below is None and exact(COMPUTE_BOUND_SEARCH_LIMIT)) or (
            below is not None and (below == 0 or exact(below))
            and not exact(below + 1))
        if confirmed:
            return None if below is None else below + 1
    guess = _curved_guess(serving, rates, pieces, by_piece)
    below = largest_within(lambda batch: _compute_lead(parts(batch)), 0.0,
                           COMPUTE_BOUND_SEARCH_LIMIT, strict=True,
                           guess=COMPUTE_BOUND_SEARCH_LIMIT if guess is None else guess or None)
    return None if below is None else below + 1
