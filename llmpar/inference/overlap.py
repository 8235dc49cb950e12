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

A communication kernel that runs on some of the GPU's streaming multiprocessors
(`Collective.compute_share` s, DeepEP's normal kernels: `llmpar.communication.deepep`)
leaves the computation it hides behind 1 - s of them while it runs (DeepSeek-V3 report,
Sec. 3.2.2: the SMs given to communication are taken from computation). With M seconds of
such communication, shares weighted by their seconds, and W seconds of work, the work
runs slowed for the window h = min(M, W / (1 - s)) the two share, so

    step = W + s h + (M - h) = max(M, W + s M)

the work s h seconds longer, the communication exposed for M - h.

A prefill step runs its MoE layers on SGLang's lockstep schedule instead
(python/sglang/srt/operations_strategy.py, `_compute_moe_deepseek_blog_prefill`, with
`tbo_delta_stages=0`; the same in the May 2025 development build the large-scale EP runs
used): each layer is three stages, (a) attention with its projections, norms and the
router, then the dispatch launched; (e) the dispatch awaited, the routed experts, the
combine launched; (s) the shared experts, the combine awaited. Both micro-batches run each
stage in turn (A's, then B's) on one compute stream, and the dispatch and combine of both
run in turn on one communication stream (`lockstep_layer_seconds`): nothing is sent while
the first micro-batch's attention runs, so a layer takes at least a + 2 (d + c). Under that
schedule SGLang runs DeepGEMM's products on the SMs DeepEP leaves
(`deep_gemm_num_sms = total - DeepEPConfig.num_sms`, for the whole overlapped step): the
stages' compute-bound products run at (1 - s) of their rate.

A decode step runs its MoE layers on SGLang's staged schedule
(operations_strategy.py, `_compute_moe_deepseek_blog_decode`, `tbo_delta_stages=2`, the
five-stage decoding pipeline of DeepSeek's inference-system overview, github.com/
deepseek-ai/open-infra-index, 202502OpenSourceWeek day 6): a layer is (1) the attention's
preparation, its projections up to the attention kernel; (2) the attention kernel, the
output projection and the router; (3) the dispatch sent, the shared experts; (4) the
dispatch received, the routed experts, the combine sent; (5) the combine received. The
second micro-batch runs two stages behind the first, A3 B1 A4 B2 A5 B3 A1' B4 A2' B5
(two_batch_overlap.py, `execute_overlapped_operations`), and DeepEP's low-latency kernels
receive through a hook, taking no SMs while the data travels (DeepEP README,
"low-latency kernels ... hook-based communication-computation overlapping"): each
transfer hides behind only what runs between its send and its receive,

    exposed a layer and micro-batch = max(0, d - shared - stage 1) + max(0, c - stage 2)

(`staged_decode_layer_seconds`), never behind the routed experts or the other stages.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.parameters import attention_matmul_weights
from llmpar.inference.operations import (
    EXCHANGE_PASSES,
    LayerKind,
    Step,
    layer_kinds,
    layer_ops,
)
from llmpar.inference.serving import Serving
from llmpar.plan import CollectiveCost
from llmpar.roofline import Operation, Rates, compute_seconds, memory_seconds, seconds
from llmpar.strategies.expert import dispatch_share

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


def _window(costs: list[CollectiveCost], overlapped: list[bool], shares: list[float],
            work_seconds: float) -> tuple[float, float, float]:
    """(M, s, h): the seconds of the collectives that hide behind the other micro-batch,
    their compute share weighted by those seconds, and the window they share with the
    work."""
    hiding = [(c.seconds, share) for c, hides, share in zip(costs, overlapped, shares,
                                                           strict=True) if hides]
    total = sum(seconds for seconds, _ in hiding)
    if total <= 0:
        return 0.0, 0.0, 0.0
    share = sum(seconds * s for seconds, s in hiding) / total
    return total, share, min(total, work_seconds / (1 - share))


def behind_other_micro_batch(costs: list[CollectiveCost], overlapped: list[bool],
                             work_seconds: float,
                             shares: list[float] | None = None) -> list[CollectiveCost]:
    """The costs of the collectives that state `Collective.overlaps_micro_batch` (flagged
    in `overlapped`, in the same order) with the exposure the overlap leaves, M - h shared
    in proportion to their seconds; the others as they were. `shares`: each one's
    `Collective.compute_share` (default none)."""
    shares = [0.0] * len(costs) if shares is None else shares
    total, _, hidden = _window(costs, overlapped, shares, work_seconds)
    if total <= 0:
        return costs
    exposed = max(0.0, total - hidden) / total
    return [attrs.evolve(c, exposed_seconds=c.seconds * exposed,
                         hides_behind="other-micro-batch") if hides else c
            for c, hides in zip(costs, overlapped, strict=True)]


def exposed_as(costs: list[CollectiveCost], overlapped: list[bool],
               exposed_seconds: float) -> list[CollectiveCost]:
    """The flagged collectives' costs with `exposed_seconds` shared in proportion to their
    seconds; the others as they were."""
    total = sum(c.seconds for c, hides in zip(costs, overlapped, strict=True) if hides)
    share = min(1.0, exposed_seconds / total) if total > 0 else 0.0
    return [attrs.evolve(c, exposed_seconds=c.seconds * share,
                         hides_behind="other-micro-batch") if hides else c
            for c, hides in zip(costs, overlapped, strict=True)]


def contention_seconds(costs: list[CollectiveCost], overlapped: list[bool],
                       shares: list[float], work_seconds: float) -> float:
    """s h: how much longer the work runs for the streaming multiprocessors the hiding
    collectives take from it (0 when none takes any)."""
    _, share, hidden = _window(costs, overlapped, shares, work_seconds)
    return share * hidden


def lockstep_layer_seconds(attention: float, experts: float, shared: float,
                           dispatch: float, combine: float) -> float:
    """One MoE layer of two micro-batches A and B on the lockstep schedule: stage times
    per micro-batch (attention side, routed experts, shared experts) and its dispatch and
    combine. Compute runs A.a, B.a, A.e, B.e, A.s, B.s; each expert stage waits for its
    dispatch, each shared stage ends when its combine has arrived; the communication stream
    runs A's dispatch, B's dispatch, A's combine, B's combine, each once its data is made."""
    a_attention = attention
    a_dispatch = a_attention + dispatch
    b_attention = a_attention + attention
    b_dispatch = max(a_dispatch, b_attention) + dispatch
    a_experts = max(b_attention, a_dispatch) + experts
    a_combine = max(a_experts, b_dispatch) + combine
    b_experts = max(a_experts, b_dispatch) + experts
    b_combine = max(b_experts, a_combine) + combine
    a_shared = max(b_experts + shared, a_combine)
    return max(a_shared + shared, b_combine)


STAGE_OF = {"routed experts": "experts", "shared experts": "shared"}
"""The lockstep stage of an MoE layer's operation; any other runs in the attention stage."""


@attrs.frozen(kw_only=True)
class Lockstep:
    """The MoE layers of a step under SGLang's schedule, the prefill's lockstep or the
    decode's staged one (per step, both micro-batches)."""

    work_seconds: float
    """Their operations' roofline times as the step sums them (unslowed)."""
    slowdown_seconds: float
    """What the SMs the communication kernels hold add to those operations."""
    exposed_seconds: float
    """The schedule's time beyond both: communication nothing hides."""


def _slowed(op: Operation, rates: Rates, share: float) -> float:
    """An operation's time on 1 - share of the SMs (its compute part slowed)."""
    return max(compute_seconds(op, rates) / (1 - share), memory_seconds(op, rates))


def _moe_exchange(serving: Serving, costs: list[CollectiveCost], overlapped: list[bool],
                  shares: list[float]
                  ) -> tuple[list[tuple[LayerKind, int]], float, float, float] | None:
    """What both schedules of a two-micro-batch step start from: the MoE layer kinds and
    their counts, the SM share the overlapped collectives take, one micro-batch's
    dispatch + combine seconds per MoE layer and the dispatch's part of them; None
    without MoE layers or such collectives."""
    total, share, _ = _window(costs, overlapped, shares, 0.0)
    moe = [(kind, count) for kind, count in layer_kinds(serving) if kind.moe]
    layers = sum(count for _, count in moe)
    if total <= 0 or not layers:
        return None
    per_layer = total / (layers * MICRO_BATCHES)
    expert = serving.spec.parallel.get("expert")
    dispatcher = getattr(expert, "dispatcher", "all-to-all")
    return moe, share, per_layer, per_layer * dispatch_share(dispatcher, serving.spec)


def lockstep_prefill(serving: Serving, unit: Step, rates: Rates,
                     costs: list[CollectiveCost], overlapped: list[bool],
                     shares: list[float]) -> Lockstep | None:
    """The lockstep schedule of a two-micro-batch prefill step (`unit`: one micro-batch),
    its dispatch and combine the collectives flagged in `overlapped`; None without MoE
    layers or such collectives."""
    exchange = _moe_exchange(serving, costs, overlapped, shares)
    if exchange is None:
        return None
    moe, share, per_layer, dispatch = exchange
    work = slowdown = scheduled = 0.0
    for kind, count in moe:
        plain = {"attention": 0.0, "experts": 0.0, "shared": 0.0}
        slow = dict(plain)
        for op in layer_ops(serving, unit, kind):
            stage = STAGE_OF.get(op.name, "attention")
            plain[stage] += seconds(op, rates)
            slow[stage] += _slowed(op, rates, share)
        work += count * MICRO_BATCHES * sum(plain.values())
        slowdown += count * MICRO_BATCHES * (sum(slow.values()) - sum(plain.values()))
        scheduled += count * lockstep_layer_seconds(
            slow["attention"], slow["experts"], slow["shared"], dispatch, per_layer - dispatch)
    return Lockstep(work_seconds=work, slowdown_seconds=slowdown,
                    exposed_seconds=max(0.0, scheduled - work - slowdown))


UNHIDING = ("routed experts", EXCHANGE_PASSES, "latent norms and rotary")
"""Operations of the staged decode that hide neither transfer: the routed experts (stage 4,
between the dispatch received and the combine sent), DeepEP's send and receive kernels
(each before its transfer or after it), and MLA's latent norms and rotary embedding, counted
in stage 1 below."""


def staged_decode_layer_seconds(prepare: float, core: float, shared: float,
                                dispatch: float, combine: float) -> float:
    """The communication one micro-batch's MoE layer leaves exposed on the staged decode
    schedule: its dispatch runs beside its own shared experts and the other micro-batch's
    stage 1 (`prepare`), its combine beside the other's stage 2 (`core`)."""
    return max(0.0, dispatch - shared - prepare) + max(0.0, combine - core)


def attention_core_share(serving: Serving) -> float:
    """The share of a layer's attention projection weights run after the attention kernel
    (stage 2 of the staged decode): the output projection, and with MLA the absorbed value
    up-projection (SGLang's forward_absorb_core: w_vc then o_proj, deepseek_v2.py); the
    rest (query, key/value down and the absorbed key up-projection) prepares it."""
    model = serving.spec.model
    assert model.hidden_size is not None
    core = model.attention_output_width * model.hidden_size
    if model.mla is not None:
        core += model.mla.kv_lora_rank * model.attention_output_width
    return core / attention_matmul_weights(model)


def staged_decode(serving: Serving, unit: Step, rates: Rates, costs: list[CollectiveCost],
                  overlapped: list[bool], shares: list[float]) -> Lockstep | None:
    """The staged schedule of a two-micro-batch decode step (`unit`: one micro-batch), its
    dispatch and combine the collectives flagged in `overlapped`; None without MoE layers
    or such collectives."""
    exchange = _moe_exchange(serving, costs, overlapped, shares)
    if exchange is None:
        return None
    moe, share, per_layer, dispatch = exchange
    after = attention_core_share(serving)
    work = slowdown = exposed = 0.0
    for kind, count in moe:
        stage = {"prepare": 0.0, "core": 0.0, "shared": 0.0}
        for op in layer_ops(serving, unit, kind):
            plain, slow = seconds(op, rates), _slowed(op, rates, share)
            work += count * MICRO_BATCHES * plain
            slowdown += count * MICRO_BATCHES * (slow - plain)
            if op.name == "attention projections":
                stage["prepare"] += slow * (1 - after)
                stage["core"] += slow * after
            elif op.name == "shared experts":
                stage["shared"] += slow
            elif op.name == "latent norms and rotary":  # before the attention kernel
                stage["prepare"] += slow
            elif op.name == "norms and residuals":  # the norm before each module
                stage["prepare"] += slow / 2
                stage["core"] += slow / 2
            elif op.name not in UNHIDING:  # attention, indexer, router
                stage["core"] += slow
        exposed += count * MICRO_BATCHES * staged_decode_layer_seconds(
            stage["prepare"], stage["core"], stage["shared"], dispatch, per_layer - dispatch)
    return Lockstep(work_seconds=work, slowdown_seconds=slowdown, exposed_seconds=exposed)
