"""Memory of one GPU while serving: weights + KV cache + workspace + runtime allowance,
for each pipeline stage; the plan reports the stage that needs the most."""

from __future__ import annotations

import attrs

from llmpar.evaluation.compose import Composition
from llmpar.evaluation.stages import stage_parameters
from llmpar.inference.kv_cache import (
    kv_bytes_per_token,
    layer_windows,
    recurrent_state_bytes,
    windowed_cache_bytes,
)
from llmpar.inference.overhead import runtime_overhead
from llmpar.inference.serving import Serving
from llmpar.inference.speculative import draft_weights_bytes
from llmpar.inference.weights import weight_bytes
from llmpar.inference.workspace import WorkspaceRates, workspace_rates
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


def prefill_steps(serving: Serving, batch: int | None = None) -> int:
    """Forward steps of the prefill: the batch's prompts in chunks of prefill_chunk_tokens."""
    inference = serving.inference
    total = (inference.batch_size if batch is None else batch) * inference.computed_prompt_tokens
    chunk = inference.prefill_chunk_tokens or total
    return -(-total // chunk)


def prefill_shape(serving: Serving, batch: int | None = None) -> StepShape:
    """The average prefill step on one GPU (what its time is summed from): its share of
    the prompts' tokens (split over context ranks) and the sequences whose first token it
    samples."""
    inference = serving.inference
    batch = inference.batch_size if batch is None else batch
    steps = prefill_steps(serving, batch)
    tokens = batch * inference.computed_prompt_tokens / steps
    return StepShape(tokens=tokens / serving.degree("context"), rows=batch / steps)


def prefill_peak_shape(serving: Serving, batch: int | None = None,
                       prompt: int | None = None) -> StepShape:
    """The largest prefill step on one GPU (what its workspace is sized by): a whole chunk
    of prefill_chunk_tokens, or the batch's prompts when they are fewer, split over context
    ranks, sampling one row per sequence, at most one per token. vLLM sizes its workspace
    the same way: its profile run is a step of max_num_batched_tokens tokens over
    min(tokens, max_num_seqs) requests, one sampled token each. Unlike the average step it
    never shrinks when the prompts take one more chunk, so memory grows with the prompt."""
    inference = serving.inference
    batch = inference.batch_size if batch is None else batch
    prompt = inference.prompt_tokens if prompt is None else prompt
    total = batch * inference.computed_tokens_of(prompt)
    tokens = min(inference.prefill_chunk_tokens or total, total)
    return StepShape(tokens=tokens / serving.degree("context"), rows=min(batch, tokens))


def decode_shape(serving: Serving, batch: int | None = None) -> StepShape:
    """One decode step: one token per sequence, each sampled."""
    batch = serving.inference.batch_size if batch is None else batch
    return StepShape(tokens=batch, rows=batch)


def stage_workspace(serving: Serving, fixed: StageFixed, batch: int | None = None,
                    prompt: int | None = None) -> float:
    """The larger of the largest prefill step's and a decode step's workspace; logits only
    on the last stage."""
    shapes = (prefill_peak_shape(serving, batch, prompt), decode_shape(serving, batch))
    rates = fixed.workspace
    return max(rates.bytes_of(shape.tokens, shape.rows if fixed.stage.has_head else 0.0)
               for shape in shapes)


@attrs.frozen(kw_only=True)
class StageFixed:
    """What a stage's memory holds whatever the batch and context: its weights, the
    runtime allowance, and its layers counted by cache window."""

    stage: Stage
    weights_bytes: int
    overhead_bytes: int
    windows: tuple[tuple[int | None, int], ...]
    kv_bytes_per_token: float
    """One token's cache in one layer on one GPU."""
    state_bytes: float
    """One sequence's state in one recurrent layer on one GPU (0 without any)."""
    workspace: WorkspaceRates


def fixed_parts(serving: Serving) -> tuple[StageFixed, ...]:
    """Every stage's fixed part (computed once per serving spec)."""
    spec = serving.spec
    overhead = runtime_overhead(spec, serving.layout).total_bytes
    tensor = serving.degree("tensor")
    per_token = kv_bytes_per_token(spec.model, serving.inference.kv_cache, tensor)
    workspace = workspace_rates(spec.model, spec.precision.activations, tensor)
    found = []
    composition: Composition | None = None  # the shards, indexed once for all stages
    whole = serving.weights_by_group  # every layer's weights by group, computed once
    for stage in serving.stages:
        parameters = stage_parameters(spec, serving.footprint, stage)
        layers = range(stage.first_layer, stage.first_layer + stage.num_layers)
        if whole and parameters == serving.footprint.parameters.by_group:  # all of them
            weights = sum(whole.values())
        else:
            composition = composition or Composition(serving.transforms)
            weights = weight_bytes(spec, parameters, composition)
        windows = layer_windows(spec.model, serving.inference, layers)
        if serving.draft is not None and stage.has_head:
            # Speculative decoding's draft head: its layers' weights and KV cache.
            weights += draft_weights_bytes(serving.draft)
            windows = (*windows, *(serving.draft.fixed[0].windows))
        state = recurrent_state_bytes(spec.model, serving.inference, tensor, windows)
        found.append(StageFixed(stage=stage, weights_bytes=round(weights),
                                overhead_bytes=overhead, windows=windows,
                                kv_bytes_per_token=per_token, state_bytes=state,
                                workspace=workspace))
    return tuple(found)


def stage_memory(serving: Serving, fixed: StageFixed, tokens: int,
                 batch: int | None = None, prompt: int | None = None) -> ServingMemory:
    """One GPU of a stage with `batch` sequences (default the spec's) at `tokens` each,
    prefilled from prompts of `prompt` tokens (default the spec's)."""
    inference = serving.inference
    batch = inference.batch_size if batch is None else batch
    return ServingMemory(
        stage=fixed.stage.index, weights_bytes=fixed.weights_bytes,
        kv_cache_bytes=windowed_cache_bytes(fixed.kv_bytes_per_token, fixed.state_bytes,
                                            inference, serving.degree("context"),
                                            fixed.windows, batch, tokens),
        workspace_bytes=round(stage_workspace(serving, fixed, batch, prompt)),
        overhead_bytes=fixed.overhead_bytes)


def peak_memory(serving: Serving, tokens: int | None = None, batch: int | None = None,
                prompt: int | None = None) -> ServingMemory:
    """The stage that needs the most, at `batch` sequences (default the spec's) of
    `prompt` prompt tokens (default the spec's), holding `tokens` each (default prompt +
    generated)."""
    inference = serving.inference
    if tokens is None:
        tokens = (inference.prompt_tokens if prompt is None else prompt) + (
            inference.generated_tokens)
    fixed = serving.fixed or fixed_parts(serving)
    found = [stage_memory(serving, part, tokens, batch, prompt) for part in fixed]
    return max(found, key=lambda memory: memory.total_bytes)
