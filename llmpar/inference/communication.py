"""Communication of one forward step, costed per call by
`llmpar.communication.collectives.call_seconds` (alpha-beta ring costs on the link the group
spans: latency-bound for the small buffers of decode).

- tensor: an all-reduce of the hidden states after attention and after the MLP in every
  layer (Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3), one after the vocabulary-parallel
  embedding, and an all-gather of the sampled rows' logits (vLLM's VocabParallelEmbedding
  and logits gather);
- expert: dispatch and combine all-to-alls of every MoE layer, k copies of each token
  (Lepikhin et al. 2020, GShard, arXiv:2006.16668);
- pipeline: p - 1 hand-offs of the hidden states, one per stage boundary, on the critical
  path (stages run the step one after another: no interleaving of micro-batches);
- context: in prefill, ring attention passes each rank's K/V chunk around the ring in c - 1
  sends per layer, behind that layer's attention (Liu et al. 2023, arXiv:2310.01889); in
  decode each rank attends its share of the cache and the partial outputs are gathered
  (flash-decoding's split-KV combine, one all-gather per layer).
"""

from __future__ import annotations

from llmpar.communication.collectives import call_seconds, members_per_node
from llmpar.dtypes import bytes_per_element
from llmpar.inference.kv_cache import kv_bytes_per_token
from llmpar.inference.operations import Step
from llmpar.inference.serving import Serving
from llmpar.plan import CollectiveCost
from llmpar.strategies.expert import network_copies
from llmpar.strategy import Collective

RING = "inference.context-ring"
"""The collective that runs behind attention."""


def _collective(serving: Serving, strategy: str, name: str, operation: str,
                buffer_bytes: float, group: int, calls: float, reason: str) -> Collective:
    return Collective(strategy=strategy, name=name, operation=operation,
                      buffer_bytes=buffer_bytes, group_size=group,
                      group_stride=serving.layout.stride(strategy),
                      calls_per_step=calls, overlap=1.0 if name == RING else 0.0,
                      reason=reason)


def tensor_collectives(serving: Serving, step: Step) -> list[Collective]:
    model, t = serving.spec.model, serving.degree("tensor")
    assert model.hidden_size is not None and model.vocab_size is not None
    act = bytes_per_element(serving.spec.precision.activations)
    layers = model.num_layers or 0
    return [
        _collective(serving, "tensor", "inference.tensor-all-reduce", "all-reduce",
                    step.tokens * model.hidden_size * act, t, 2 * layers + 1,
                    f"{step.phase}: attention and MLP outputs of every layer, and the embedding"),
        _collective(serving, "tensor", "inference.logits-all-gather", "all-gather",
                    step.rows * model.vocab_size * act, t, 1,
                    f"{step.phase}: the sampled rows' logits over the split vocabulary"),
    ]


def expert_collectives(serving: Serving, step: Step) -> list[Collective]:
    model = serving.spec.model
    if model.moe is None:
        return []
    assert model.hidden_size is not None
    act = bytes_per_element(serving.spec.precision.activations)
    e = serving.degree("expert")
    dispatcher = getattr(serving.spec.parallel.get("expert"), "dispatcher", "all-to-all")
    members = members_per_node(e, serving.layout.stride("expert"),
                               serving.spec.hardware.gpus_per_node)
    copies = network_copies(dispatcher, model.moe.experts_per_token, e, members)
    buffer = step.tokens * copies * model.hidden_size * act
    return [_collective(serving, "expert", "inference.expert-all-to-all", "all-to-all", buffer,
                        e, 2 * model.num_moe_layers,
                        f"{step.phase}: token dispatch and combine of every MoE layer"
                        + (" (DeepEP)" if dispatcher == "deepep" else ""))]


def pipeline_collectives(serving: Serving, step: Step) -> list[Collective]:
    p, model = serving.degree("pipeline"), serving.spec.model
    assert model.hidden_size is not None
    act = bytes_per_element(serving.spec.precision.activations)
    return [_collective(serving, "pipeline", "inference.pipeline-send", "send-recv",
                        step.tokens * model.hidden_size * act, 2 if p > 1 else 1, p - 1,
                        f"{step.phase}: hidden states to the next stage")]


def context_collectives(serving: Serving, step: Step) -> list[Collective]:
    model, c, t = serving.spec.model, serving.degree("context"), serving.degree("tensor")
    layers = model.num_layers or 0
    if step.phase == "prefill":
        chunk = step.tokens * kv_bytes_per_token(model, serving.inference.kv_cache, t)
        return [_collective(serving, "context", RING, "send-recv", chunk, c, (c - 1) * layers,
                            "prefill: K/V chunks around the ring, behind attention")]
    act = bytes_per_element(serving.spec.precision.activations)
    partial = step.tokens * model.attention_output_width / t * act
    return [_collective(serving, "context", "inference.context-combine", "all-gather", partial,
                        c, layers, "decode: partial attention outputs of the split cache")]


def step_collectives(serving: Serving, step: Step) -> list[Collective]:
    """Every collective of one forward step with a group of more than one GPU."""
    found = (tensor_collectives(serving, step) + expert_collectives(serving, step)
             + pipeline_collectives(serving, step) + context_collectives(serving, step))
    return [c for c in found if c.group_size > 1 and c.calls_per_step > 0]


def cost(serving: Serving, collective: Collective) -> CollectiveCost:
    """One collective's calls of a step, on its link; an unknown link costs nothing (the
    plan warns)."""
    per_call, tier = call_seconds(collective, serving.spec.hardware)
    seconds = (per_call or 0.0) * collective.calls_per_step
    return CollectiveCost(strategy=collective.strategy, operation=collective.operation,
                          name=collective.name, buffer_bytes=round(collective.buffer_bytes),
                          group_size=collective.group_size, tier=tier,
                          calls_per_step=collective.calls_per_step, seconds=seconds,
                          exposed_seconds=seconds * (1 - collective.overlap),
                          reason=collective.reason)


def unknown_links(serving: Serving, collectives: list[Collective]) -> list[str]:
    """Warnings for collectives whose link bandwidth the hardware does not state."""
    found = []
    for collective in collectives:
        per_call, tier = call_seconds(collective, serving.spec.hardware)
        if per_call is None:
            found.append(f"{collective.name}: no {tier} bandwidth in [hardware]; not costed")
    return found
