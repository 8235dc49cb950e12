"""`[parallel.offload]`: what lives in host memory, and the host's speeds."""

from __future__ import annotations

import attrs
from llmpar.spec.validators import fraction, positive

CPU_ADAM_BYTES_PER_PARAMETER = 28
"""Host-memory traffic of one CPU Adam update: the fp32 master weight, momentum and
variance read and written (24 bytes), the 16-bit gradient read and the 16-bit weight
written (4 bytes); ZeRO-Offload keeps exactly these on the host (Ren et al. 2021,
arXiv:2101.06840, Sec. 4.1, Fig. 2)."""


@attrs.frozen(kw_only=True)
class OffloadConfig:
    """`[parallel.offload]`. Present with no keys: ZeRO-Offload (optimizer states and
    gradients on the host, weights on the GPU)."""

    optimizer: bool = True
    """Optimizer states (fp32 master weights, moments) in host memory, updated by the
    host's CPU (ZeRO-Offload, Sec. 4.1)."""
    gradients: bool = True
    """Gradients leave the GPU as each micro-batch's backward pass reduces them and
    accumulate in host memory (ZeRO-Offload, Sec. 4.1); needs `optimizer`."""
    weights: bool = False
    """Weights in host memory too, fetched layer by layer for every forward and
    backward pass (ZeRO-Infinity, Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 5);
    needs `optimizer` and ZeRO-3, as DeepSpeed's `offload_param` does."""
    delayed_parameter_update: bool = False
    """ZeRO-Offload's one-step delayed parameter update (Sec. 4.2): the host's update
    and the weight copy run beside the next step's compute."""
    cpu_optimizer_parameters_per_s: float = attrs.field(default=1e9, validator=positive)
    """Parameters per second the host's optimizer step updates for one GPU (that GPU's
    share of the host's cores and memory bandwidth). An assumption, to replace with a
    measurement of DeepSpeedCPUAdam on the host at hand: CPU Adam is bound by memory
    bandwidth at CPU_ADAM_BYTES_PER_PARAMETER (28) bytes per parameter; a two-socket
    DDR5-4800 host (2 x 8 channels x 38.4 GB/s = 614 GB/s, e.g. DGX H100's two Xeon
    8480C) shared by 8 GPUs gives 77 GB/s, 2.7e9 parameters/s per GPU at the roofline;
    the default assumes about a third of that."""
    host_link_efficiency: float = attrs.field(default=0.8, validator=fraction)
    """Share of `hardware.host_bandwidth_bytes_per_s` that pinned-memory copies reach.
    An assumption: NVIDIA's bandwidthTest shows about 25 of 31.5 GB/s on PCIe Gen4 x16."""
