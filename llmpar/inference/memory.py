"""Memory of one GPU while serving: weights + KV cache + workspace + runtime allowance,
for each pipeline stage; the plan reports the stage that needs the most."""

from __future__ import annotations

import attrs

from llmpar.evaluation.stages import stage_parameters
from llmpar.inference.kv_cache import kv_cache_bytes
from llmpar.inference.overhead import runtime_overhead
from llmpar.inference.serving import Serving
from llmpar.inference.weights import weight_bytes
from llmpar.inference.workspace import workspace_bytes
from llmpar.strategy import Stage


@attrs.frozen(kw_only=True)
class StepShape:
    """Tokens one GPU processes in a forward step, and the rows it samples."""

    tokens: float
    rows: float


@attrs.frozen(kw_only=True)
class ServingMemory:
    stage: int
    weights_bytes: int
    kv_cache_bytes: int
    workspace_bytes: int
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.workspace_bytes
                + self.overhead_bytes)


def prefill_steps(serving: Serving) -> int:
    """Forward steps of the prefill: the batch's prompts in chunks of prefill_chunk_tokens."""
    inference = serving.inference
    total = inference.batch_size * inference.prompt_tokens
    chunk = inference.prefill_chunk_tokens or total
    return -(-total // chunk)


def prefill_shape(serving: Serving) -> StepShape:
    """One prefill step on one GPU: its share of the prompts' tokens (split over context
    ranks) and the sequences whose first token it samples."""
    inference = serving.inference
    steps = prefill_steps(serving)
    tokens = inference.batch_size * inference.prompt_tokens / steps
    return StepShape(tokens=tokens / serving.degree("context"),
                     rows=inference.batch_size / steps)


def decode_shape(serving: Serving) -> StepShape:
    """One decode step: one token per sequence, each sampled."""
    batch = serving.inference.batch_size
    return StepShape(tokens=batch, rows=batch)


def stage_workspace(serving: Serving, stage: Stage) -> float:
    """The larger of a prefill and a decode step's workspace; logits only on the last stage."""
    spec = serving.spec
    shapes = (prefill_shape(serving), decode_shape(serving))
    return max(workspace_bytes(spec.model, spec.precision.activations, serving.degree("tensor"),
                               shape.tokens, shape.rows if stage.has_head else 0.0)
               for shape in shapes)


def stage_memory(serving: Serving, stage: Stage, tokens: int) -> ServingMemory:
    """One GPU of `stage` with the batch's sequences at `tokens` tokens each."""
    spec, inference = serving.spec, serving.inference
    parameters = stage_parameters(spec, serving.footprint, stage)
    layers = range(stage.first_layer, stage.first_layer + stage.num_layers)
    return ServingMemory(
        stage=stage.index,
        weights_bytes=round(weight_bytes(spec, parameters, list(serving.transforms))),
        kv_cache_bytes=kv_cache_bytes(spec.model, inference, serving.layout, layers,
                                      inference.batch_size, tokens),
        workspace_bytes=round(stage_workspace(serving, stage)),
        overhead_bytes=runtime_overhead(spec, serving.layout).total_bytes)


def peak_memory(serving: Serving, tokens: int | None = None) -> ServingMemory:
    """The stage that needs the most, at `tokens` per sequence (default prompt + generated)."""
    held = serving.inference.context_tokens if tokens is None else tokens
    found = [stage_memory(serving, stage, held) for stage in serving.stages]
    return max(found, key=lambda memory: memory.total_bytes)
