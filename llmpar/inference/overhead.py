"""The runtime allowance on each GPU: what a serving engine holds besides weights, cache
and workspace. Stated, not measured; `[inference] runtime_overhead_bytes` replaces the
first two parts and `memory_utilization` sets the third.

- CUDA context and libraries: 1 GiB. A bare PyTorch CUDA initialization takes 781 MB
  (pytorch/pytorch issue #34323); cuBLAS workspaces and kernel images come on top.
- Communication buffers: NCCL keeps a buffer of NCCL_BUFFSIZE (4 MiB by default, NCCL
  environment-variable docs) per channel and direction; up to 32 channels on NVLink:
  4 MiB x 2 x 32 = 256 MiB for each group (tensor, pipeline, expert, context) of more
  than one GPU.
- Headroom: the share of memory the engine leaves unallocated, 1 - memory_utilization
  (vLLM's gpu_memory_utilization, 0.9 by default; TensorRT-LLM's free_gpu_memory_fraction
  is 0.9 too), against allocator fragmentation and CUDA graphs.
"""

from __future__ import annotations

import attrs

from llmpar.spec import Spec
from llmpar.strategy import Layout

CUDA_CONTEXT_BYTES = 2**30
NCCL_BUFFSIZE_BYTES = 4 * 2**20
NCCL_CHANNELS = 32
COMMUNICATOR_BYTES = NCCL_BUFFSIZE_BYTES * 2 * NCCL_CHANNELS
COMMUNICATING_STRATEGIES = ("tensor", "pipeline", "expert", "context")
SOURCE = ("llmpar.inference.overhead: CUDA context 1 GiB (PyTorch issue #34323 measures "
          "781 MB at init); NCCL_BUFFSIZE 4 MiB x 2 directions x 32 channels per group (NCCL "
          "docs); headroom 1 - memory_utilization (vLLM gpu_memory_utilization, default 0.9)")


@attrs.frozen(kw_only=True)
class Overhead:
    """The three parts of the allowance on one GPU, in bytes."""

    context_bytes: float
    communication_bytes: float
    headroom_bytes: float
    stated: bool
    """Whether the first two parts come from `[inference] runtime_overhead_bytes`."""

    @property
    def total_bytes(self) -> int:
        return round(self.context_bytes + self.communication_bytes + self.headroom_bytes)


def communicators(layout: Layout) -> int:
    """Groups of more than one GPU that a GPU communicates in."""
    return sum(layout.degree(name) > 1 for name in COMMUNICATING_STRATEGIES)


def runtime_overhead(spec: Spec, layout: Layout) -> Overhead:
    """The allowance of one GPU."""
    inference = spec.inference
    assert inference is not None
    headroom = (1 - inference.memory_utilization) * spec.hardware.gpu.usable_bytes
    if inference.runtime_overhead_bytes is not None:
        return Overhead(context_bytes=float(inference.runtime_overhead_bytes),
                        communication_bytes=0.0, headroom_bytes=headroom, stated=True)
    return Overhead(context_bytes=float(CUDA_CONTEXT_BYTES),
                    communication_bytes=float(COMMUNICATOR_BYTES * communicators(layout)),
                    headroom_bytes=headroom, stated=False)
