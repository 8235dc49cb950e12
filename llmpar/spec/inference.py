"""`[inference]`: a serving workload, in place of `[training]`.

The parallel strategies come from the same `[parallel.*]` tables as in training:
tensor, pipeline, expert and context split one replica; data is the number of
replicas, each serving `batch_size` sequences.
"""

from __future__ import annotations

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import Bytes

WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
"""Formats the blocks' linear weights may be stored in."""
KV_CACHE_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8")
"""Formats of the key/value cache (vLLM's kv_cache_dtype "auto" or "fp8")."""
QUANTIZED_FORMATS = ("fp8", "int8", "int4")
"""Formats that keep only the blocks' linear layers quantized; embeddings, output layer,
norms and router stay in `[precision] activations` (see llmpar.inference.formats)."""


def _default_group_size(instance: Inference) -> int | None:
    return 128 if instance.weights == "int4" else None


@attrs.frozen(kw_only=True)
class Inference:
    """One serving workload: how many sequences at once, how long, and in what formats."""

    batch_size: int = attrs.field(default=1, validator=v.positive)
    """Sequences each replica serves at once (one data-parallel rank; the whole cluster
    serves batch_size x data degree)."""
    prompt_tokens: int = attrs.field(validator=v.positive)
    """Tokens of each prompt (the prefill)."""
    generated_tokens: int = attrs.field(validator=v.positive)
    """Tokens each sequence generates, the first one included (it comes from the prefill)."""
    weights: str = attrs.field(default="bf16", validator=v.one_of(*WEIGHT_FORMATS))
    """Format of the blocks' linear weights; fp8, int8 and int4 keep embeddings, output
    layer, norms and router in `[precision] activations`."""
    weights_group_size: int | None = attrs.field(
        default=attrs.Factory(_default_group_size, takes_self=True), validator=v.positive)
    """Weights sharing one quantization scale (and, for int formats, one zero point), as in
    GPTQ/AWQ checkpoints. Default: 128 for int4; None: per-channel or per-tensor scales,
    counted as nothing."""
    kv_cache: str = attrs.field(default="bf16", validator=v.one_of(*KV_CACHE_FORMATS))
    """Format of the key/value cache."""
    kv_block_tokens: int | None = attrs.field(default=None, validator=v.positive)
    """Paged cache: each sequence's cache is allocated in blocks of this many tokens (vLLM's
    block_size, 16 by default); None: exactly the tokens held."""
    sliding_window: bool | None = None
    """Whether windowed layers keep only the model's sliding_window tokens in the cache.
    None: when the model has a window; true requires one; false caches every token."""
    prefill_chunk_tokens: int | None = attrs.field(default=None, validator=v.positive)
    """Tokens per prefill step (chunked prefill, vLLM's max_num_batched_tokens). None: the
    whole batch's prompts in one step."""
    memory_utilization: float = attrs.field(default=0.9, validator=v.fraction)
    """Share of GPU memory the serving engine may use (vLLM's gpu_memory_utilization); the
    rest is headroom for allocator slack and fragmentation."""
    runtime_overhead_bytes: Bytes | None = attrs.field(default=None, validator=v.non_negative)
    """CUDA context, libraries and communication buffers on each GPU. None: llmpar's stated
    allowance (see llmpar.inference.overhead)."""

    @property
    def context_tokens(self) -> int:
        """Tokens a sequence holds at the end: prompt + generated."""
        return self.prompt_tokens + self.generated_tokens
