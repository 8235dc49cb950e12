"""Fused attention as its own kernel in a training step.

A framework profile whose attention is fused (FlashAttention-2/3, cuDNN, torch SDPA's
flash backend: the activation model keeps no scores) and that times attention by its
kernel (`Framework.attention_timing = "kernel"`) runs attention's Q.K^T and scores.V at
the rate its kernel was measured at on the GPU (`Gpu.attention_kernels`, the law of
`llmpar.spec.hardware.AttentionKernelRate`), forward and backward apart, instead of the
GPU's matmul_efficiency:

    seconds = forward FLOPs / (peak x forward share(k, d))
            + 2.5 x one forward's FLOPs / (peak x backward share(k, d))

- the forward FLOPs are what the kernel executes in the forward pass and in every rerun
  recomputation makes (the step's executed attention less the backward's twice-the-
  forward), each at the forward's share;
- the backward runs 5 products of the forward's size against the forward's 2 (it
  recomputes the scores: FlashAttention-2, Dao 2023, arXiv:2307.08691, Sec. 4.1, and
  FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, Sec. 4.1, count its FLOPs so),
  at the backward's share;
- k, the keys each query attends per call: the sequence without a causal mask; with one,
  128 x (n + 1) / 2 for n = s / 128 tiles a side (the tiles above the diagonal skipped,
  the diagonal ones computed whole, as `llmpar.footprint.flops.executed_attention_share`
  counts the executed FLOPs); under ring context parallelism each of the ring's calls
  attends the chunk of s / steps keys at hand (Liu et al. 2023, arXiv:2310.01889);
- d, the head width: the mean of the query-key and the value widths (MLA's 192 and 128).

A causal mask changes what the kernel executes (about half the square) and so the time;
`[training] attention_flops` only changes what MFU counts, never this. The law was
measured in 16-bit: attention in another format, a hybrid model's recurrent mixers
(counted with attention's FLOPs) and DeepSeek sparse attention (its indexer) keep
matmul_efficiency, as does a GPU that states no rate for the profile's kernel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from llmpar.arrays import Value, where
from llmpar.dtypes import math_format
from llmpar.evaluation.matmuls import RankShape
from llmpar.footprint.flops import (
    BACKWARD_TO_FORWARD,
    FUSED_ATTENTION_TILE_TOKENS,
    attends_causally,
)
from llmpar.spec import Spec
from llmpar.spec.hardware import AttentionKernelRate

BACKWARD_PARTS = 2.5
"""The backward kernel's FLOPs over the forward's: 5 products against 2 (it recomputes
the scores; FlashAttention-2, arXiv:2307.08691, Sec. 4.1)."""
MEASURED_AS: Mapping[str, str] = MappingProxyType({
    # torch SDPA's flash backend runs FlashAttention-2's kernels, vendored into PyTorch
    # (aten/src/ATen/native/transformers/cuda/flash_attn/, PyTorch 2.2 on).
    "sdpa-flash": "flash-attention-2",
})
"""The measured kernel a profile's `attention_kernel` runs, where it is another's code."""
SIXTEEN_BIT = ("bf16", "fp16")
UNMEASURED: Mapping[str, str] = MappingProxyType({
    "volta": "no fused attention kernel of this architecture is measured: FlashAttention-2 "
             "and cuDNN's fused attention need compute capability 8.0 (Ampere) or later "
             "(FlashAttention-2's README; the cuDNN frontend's SDPA support matrix), so on "
             "Volta torch SDPA runs its math or memory-efficient (xFormers-derived) kernel",
})
"""Why a GPU architecture states no attention rate at all, added to the fallback warning."""


def _timed_by_kernel(spec: Spec) -> bool:
    """The profile times attention by its kernel, and the law applies to this model's
    attention (16-bit, no recurrent mixers or sparse indexer among its FLOPs; a model
    given by its size alone has no attention of its own: 6ND counts none)."""
    model = spec.model
    return (spec.training.profile.attention_timing == "kernel" and model.has_architecture
            and model.recurrent_mixer is None and model.sparse_attention is None
            and math_format(spec.precision.attention_format) in SIXTEEN_BIT)


def kernel_rates(spec: Spec) -> tuple[AttentionKernelRate, AttentionKernelRate] | None:
    """The (forward, backward) rates the step's attention runs at, or None where it runs
    at matmul_efficiency (the profile times it so, the GPU states no rate for its kernel,
    attention is not 16-bit, or the model's attention FLOPs hold other kernels')."""
    if not _timed_by_kernel(spec):
        return None
    gpu = spec.hardware.gpu
    runs = spec.training.profile.attention_kernel_on(gpu.architecture)
    for kernel in dict.fromkeys((runs, MEASURED_AS.get(runs, ""))):
        forward = gpu.attention_rate(kernel, "forward")
        backward = gpu.attention_rate(kernel, "backward")
        if forward is not None and backward is not None:
            return forward, backward
    return None


def kernel_fallback_warning(spec: Spec) -> str | None:
    """Where the profile times fused attention by its kernel but the GPU states no rate
    for that kernel: attention then runs at matmul_efficiency, which the plan says."""
    if not _timed_by_kernel(spec) or kernel_rates(spec) is not None:
        return None
    gpu = spec.hardware.gpu
    kernel = spec.training.profile.attention_kernel_on(gpu.architecture)
    measured = sorted({rate.kernel for rate in gpu.attention_kernels})
    stated = (f" (it states {', '.join(measured)}: set training.framework's "
              "attention_kernel to one of them if the stack runs it)") if measured else ""
    why = f" ({UNMEASURED[gpu.architecture]})" if gpu.architecture in UNMEASURED else ""
    return (f"{gpu.name!r} states no measured rate of the {kernel} attention kernel"
            f"{stated}{why}: attention is timed at its matmul_efficiency")


def keys_per_query(spec: Spec, shape: RankShape) -> Value:
    """Keys each query attends per kernel call, as the kernel runs them."""
    s = spec.training.sequence_length
    steps = shape.context_steps
    whole = (FUSED_ATTENTION_TILE_TOKENS * (math.ceil(s / FUSED_ATTENTION_TILE_TOKENS) + 1) / 2
             if attends_causally(spec.model) else float(s))
    return where(steps > 1, s / steps, whole)


def head_width(spec: Spec) -> float:
    """The head width the kernel runs at: the mean of the query-key and value widths."""
    model = spec.model
    return (model.qk_head_dim + model.value_head_dim) / 2


def attention_seconds(spec: Spec, shape: RankShape, forward_flops: Value, executed_flops: Value,
                      peak: float,
                      rates: tuple[AttentionKernelRate, AttentionKernelRate]) -> Value:
    """Seconds on one GPU-equivalent of a step's attention (all GPUs' FLOPs, as
    `executed_flops`): `forward_flops` one forward pass's executed attention FLOPs, the
    rest of `executed_flops` beyond its backward (twice it) forward reruns."""
    forward, backward = rates
    keys, width = keys_per_query(spec, shape), head_width(spec)
    forward_kind = executed_flops - BACKWARD_TO_FORWARD * forward_flops
    return (forward_kind / (peak * forward.efficiency(keys, width))
            + BACKWARD_PARTS * forward_flops / (peak * backward.efficiency(keys, width)))
