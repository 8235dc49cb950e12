"""Offloaded model states: the host memory a node needs for them.

Strategies say which components live in host memory (`Transform.offloads`) and what
each step does with them outside the GPU (`Transform.host_work`, a cost per
parameter); `llmpar.evaluation.memory` and `llmpar.evaluation.step_time` compose them, as
ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4) and ZeRO-Infinity
(Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 6) schedule them.
"""

from __future__ import annotations

from llmpar.spec import Spec


def host_memory_warning(spec: Spec, host_bytes: int) -> list[str]:
    """A warning when the offloaded states of a node's GPUs exceed its host memory."""
    hardware = spec.hardware
    capacity = hardware.host_memory_bytes
    if not host_bytes or capacity is None:
        return []
    gpus = min(hardware.gpus_per_node, hardware.num_gpus)
    needed = host_bytes * gpus
    if needed <= capacity:
        return []
    return [f"offloaded states need {needed / 2**30:,.1f} GiB of host memory per node "
            f"({gpus} GPUs x {host_bytes / 2**30:,.2f} GiB), has {capacity / 2**30:,.1f} GiB"]
