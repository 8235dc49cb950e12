"""Two-batch overlap (`[inference] two_batch_overlap`): each forward step's sequences split
into two micro-batches, the expert all-to-all of one running while the other computes.

SGLang's two-batch overlap (--enable-two-batch-overlap) and DeepSeek's dual micro-batch
overlap (DeepSeek-V3 technical report, arXiv:2412.19437, Sec. 3.4.1 for prefilling: "two
micro-batches with similar computational workloads ... overlapping the attention and MoE
of one micro-batch with the dispatch and combine of another"; Sec. 3.4.2 the same for
decoding) alternate the two micro-batches layer by layer, so over a step of many layers
the dispatch and combine of both are hidden up to the computation of both:

    exposed all-to-all = max(0, all-to-all seconds - computation seconds)

(the first micro-batch's first layer, which nothing hides, is one layer in many: left
out). The price is that each micro-batch runs its own products: every weight is read once
per micro-batch, and each collective runs once per micro-batch on half the tokens.
"""

from __future__ import annotations

import attrs

from llmpar.inference.operations import Step
from llmpar.inference.serving import Serving
from llmpar.plan import CollectiveCost

MICRO_BATCHES = 2


def micro_batches(serving: Serving, step: Step) -> int:
    """Micro-batches a step runs in: two under two-batch overlap with two sequences or
    more, else one."""
    split = serving.inference.two_batch_overlap and step.sequences >= MICRO_BATCHES
    return MICRO_BATCHES if split else 1


def micro_batch_step(step: Step, count: int) -> Step:
    """One of `count` equal micro-batches of `step`: its share of the sequences, their
    tokens and their sampled rows."""
    if count == 1:
        return step
    return attrs.evolve(step, tokens=step.tokens / count, rows=step.rows / count,
                        sequences=step.sequences / count)


def behind_other_micro_batch(costs: list[CollectiveCost], overlapped: list[bool],
                             work_seconds: float) -> list[CollectiveCost]:
    """The costs of the collectives that state `Collective.overlaps_micro_batch` (flagged
    in `overlapped`, in the same order) with the exposure the overlap leaves, shared in
    proportion to their seconds; the others as they were."""
    total = sum(c.seconds for c, hides in zip(costs, overlapped, strict=True) if hides)
    if total <= 0:
        return costs
    share = max(0.0, total - work_seconds) / total
    return [attrs.evolve(c, exposed_seconds=c.seconds * share,
                         hides_behind="other-micro-batch") if hides else c
            for c, hides in zip(costs, overlapped, strict=True)]
