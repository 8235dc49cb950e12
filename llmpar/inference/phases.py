"""Prefill and decode as forward steps: the sum of their operations' rooflines plus the
communication on the critical path.

- Prefill: the batch's prompts, in one step or in chunks of prefill_chunk_tokens (the
  attention work spread evenly over the chunks); it ends with the first token, so its time
  is the time to first token.
- Decode: one token per sequence, attending the average context of the decode steps,
  prompt + generated / 2 (step j attends prompt + j tokens, j = 1 .. generated - 1; attention
  is linear in the context, so the average step is the step at the average context).
A phase is compute-, memory- or communication-bound by the largest of its three parts.
"""

from __future__ import annotations

import attrs

from llmpar.inference.capacity import largest_fitting
from llmpar.inference.communication import cost, step_collectives
from llmpar.inference.memory import decode_shape, prefill_shape, prefill_steps
from llmpar.inference.operations import Operation, Step, step_ops
from llmpar.inference.serving import Serving
from llmpar.plan import CollectiveCost, InferencePhase
from llmpar.roofline import Rates, floor_seconds, is_compute_bound, seconds

COMPUTE_BOUND_SEARCH_LIMIT = 2**24
"""Largest batch the compute-bound search tries."""


@attrs.frozen(kw_only=True)
class PhaseResult:
    phase: InferencePhase
    operations: tuple[Operation, ...]
    collectives: tuple[CollectiveCost, ...]


def prefill_step(serving: Serving) -> Step:
    inference = serving.inference
    shape = prefill_shape(serving)
    return Step(tokens=shape.tokens, rows=shape.rows,
                sequences=inference.batch_size / prefill_steps(serving),
                queries=inference.prompt_tokens, prior=0.0, phase="prefill")


def average_decode_context(serving: Serving) -> float:
    """Tokens a decode step attends on average: prompt + generated / 2."""
    inference = serving.inference
    return inference.prompt_tokens + inference.generated_tokens / 2


def decode_step(serving: Serving) -> Step:
    shape = decode_shape(serving)
    return Step(tokens=shape.tokens, rows=shape.rows, sequences=serving.inference.batch_size,
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
    operations = step_ops(serving, step)
    costs = [cost(serving, c) for c in step_collectives(serving, step)]
    compute = sum((seconds(op, rates) for op in operations if is_compute_bound(op, rates)), 0.0)
    memory = sum((seconds(op, rates) for op in operations if not is_compute_bound(op, rates)),
                 0.0)
    parts = {"compute": compute * steps, "memory": memory * steps,
             "communication": exposed_seconds(costs, operations, rates) * steps}
    phase = InferencePhase(
        name=step.phase, seconds=sum(parts.values()),
        floor_seconds=floor_seconds(operations, rates) * steps,
        compute_seconds=parts["compute"], memory_seconds=parts["memory"],
        communication_seconds=parts["communication"], bound=max(parts, key=parts.__getitem__),
        flops=sum(op.flops for op in operations) * steps,
        bytes=sum(op.bytes for op in operations) * steps,
        tokens=int(step.queries), context_tokens=step.prior + step.queries, steps=steps)
    return PhaseResult(phase=phase, operations=tuple(operations), collectives=tuple(costs))


def prefill(serving: Serving, rates: Rates) -> PhaseResult:
    return run_phase(serving, prefill_step(serving), prefill_steps(serving), rates)


def decode(serving: Serving, rates: Rates) -> PhaseResult:
    return run_phase(serving, decode_step(serving), 1, rates)


def compute_bound_batch(serving: Serving, rates: Rates) -> int | None:
    """The smallest batch at which a decode step's compute part reaches its memory part;
    None when none up to COMPUTE_BOUND_SEARCH_LIMIT does (the cache reads grow with the batch
    as fast as the FLOPs)."""

    def memory_bound(batch: int) -> bool:
        phase = decode(serving.with_batch(batch), rates).phase
        return phase.compute_seconds < phase.memory_seconds

    below = largest_fitting(memory_bound, COMPUTE_BOUND_SEARCH_LIMIT)
    return None if below is None else below + 1

