"""GPUs and the machines they sit in."""

from __future__ import annotations

import attrs

from llmpar.spec import validators as v
from llmpar.spec.quantities import ByteRate, Bytes, FlopRate


@attrs.frozen(kw_only=True)
class Gpu:
    """One accelerator. Peak rates are dense (no structured sparsity)."""

    name: str = "custom"
    """Preset name or a label."""
    source: str = ""
    """Datasheet the numbers come from."""
    memory_bytes: Bytes = attrs.field(validator=v.positive)
    """On-device memory (HBM)."""
    peak_fp32_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    peak_tf32_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    peak_bf16_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    peak_fp16_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    peak_fp8_flops_per_s: FlopRate | None = attrs.field(default=None, validator=v.positive)
    hbm_bandwidth_bytes_per_s: ByteRate | None = attrs.field(default=None, validator=v.positive)
    """Memory bandwidth."""
    nvlink_bandwidth_bytes_per_s: ByteRate | None = attrs.field(
        default=None, validator=v.positive
    )
    """Total intra-node link bandwidth per GPU (both directions, as datasheets state)."""
    achievable_mfu: float | None = attrs.field(default=None, validator=v.fraction)
    """Model FLOPs utilization that large training runs reach on this GPU."""
    achievable_mfu_source: str = ""
    """The published run behind `achievable_mfu`."""

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """Dense peak for math in `dtype`, or None when the datasheet gives none."""
        value: float | None = getattr(self, f"peak_{dtype}_flops_per_s", None)
        return value


@attrs.frozen(kw_only=True)
class Hardware:
    """How many GPUs, and how they are grouped into nodes."""

    gpu: Gpu
    num_gpus: int = attrs.field(default=1, validator=v.positive)
    gpus_per_node: int = attrs.field(default=8, validator=v.positive)

    @property
    def num_nodes(self) -> int:
        """Nodes used, counting a partly filled node as one."""
        return -(-self.num_gpus // self.gpus_per_node)
