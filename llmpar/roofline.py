"""The roofline of one operation (Williams, Waterman and Patterson 2009, "Roofline: an
insightful visual performance model", CACM 52(4)):

    time  = max(FLOPs / (peak x matmul_efficiency), bytes / (HBM bandwidth x memory_efficiency))
            (+ fixed_seconds where a measured kernel states one)
    floor = max(FLOPs / peak, bytes / HBM bandwidth)

An operation is compute-bound when its first term is the larger. Efficiencies come from the
GPU preset; where it states none, DEFAULT_MATMUL_EFFICIENCY and DEFAULT_MEMORY_EFFICIENCY
apply (and the plan warns): the a100-sxm-80gb preset's values, matmul calibrated on the
published A100 training runs in validation/published/ (Narayanan et al. 2021, Korthikanti
et al. 2022, BLOOM-176B), memory assumed at 80% of HBM bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from llmpar.dtypes import BYTES_PER_ELEMENT
from llmpar.spec import Gpu

DEFAULT_MATMUL_EFFICIENCY = 0.674
DEFAULT_MEMORY_EFFICIENCY = 0.8
DEFAULT_SOURCE = ("llmpar.roofline defaults (the a100-sxm-80gb preset's: matmul "
                  "calibrated on published A100 training runs, memory assumed)")


@attrs.frozen(kw_only=True)
class Operation:
    """One kernel (or a fused group) of a forward step, on one GPU."""

    name: str
    flops: float
    bytes: float
    dtype: str
    """The format whose peak its FLOPs run at."""
    memory_efficiency: float | None = None
    """Share of HBM bandwidth its bytes move at, where its kernel's own is known (a serving
    engine's weight and attention kernels, `llmpar.inference.engine`); None: the GPU's."""
    matmul_efficiency: float | None = None
    """Share of the peak its FLOPs run at, where its kernel's own is known (a serving
    engine's attention kernels); None: the GPU's."""
    fixed_seconds: float = 0.0
    """Time of its calls beyond both rooflines (a measured kernel's launch and tail), added
    to either: time = fixed_seconds + max(compute, memory)."""


@attrs.frozen(kw_only=True)
class Rates:
    """What one GPU sustains."""

    gpu: Gpu
    matmul_efficiency: float
    memory_efficiency: float
    source: str
    peaks: Mapping[str, float] = attrs.field(factory=dict, eq=False)
    """Each format's peak the GPU states, looked up once (`Gpu.peak_flops_per_s`)."""

    @property
    def bandwidth(self) -> float:
        assert self.gpu.hbm_bandwidth_bytes_per_s is not None
        return self.gpu.hbm_bandwidth_bytes_per_s

    def peak(self, dtype: str) -> float:
        value = self.peaks.get(dtype) or self.gpu.peak_flops_per_s(dtype)
        assert value is not None, f"no {dtype} peak"
        return value


def rates_of(gpu: Gpu) -> Rates:
    """The GPU's rates, with the default efficiencies where its preset states none."""
    stated = gpu.matmul_efficiency is not None and gpu.memory_efficiency is not None
    return Rates(gpu=gpu,
                 matmul_efficiency=gpu.matmul_efficiency or DEFAULT_MATMUL_EFFICIENCY,
                 memory_efficiency=gpu.memory_efficiency or DEFAULT_MEMORY_EFFICIENCY,
                 source=gpu.efficiency_source if stated else DEFAULT_SOURCE,
                 peaks={dtype: peak for dtype in BYTES_PER_ELEMENT
                        if (peak := gpu.peak_flops_per_s(dtype)) is not None})


def compute_seconds(op: Operation, rates: Rates) -> float:
    # `rates.peak`, its lookup in line: asked for every operation of every decode step tried
    peak = rates.peaks.get(op.dtype) or rates.peak(op.dtype)
    return op.fixed_seconds + op.flops / (
        peak * (op.matmul_efficiency or rates.matmul_efficiency))


def memory_seconds(op: Operation, rates: Rates) -> float:
    # `rates.bandwidth`, read in line (as the peak in `compute_seconds`)
    bandwidth = rates.gpu.hbm_bandwidth_bytes_per_s or rates.bandwidth
    return op.fixed_seconds + op.bytes / (
        bandwidth * (op.memory_efficiency or rates.memory_efficiency))


def seconds(op: Operation, rates: Rates) -> float:
    """The roofline time of `op`."""
    return max(compute_seconds(op, rates), memory_seconds(op, rates))


def is_compute_bound(op: Operation, rates: Rates) -> bool:
    return compute_seconds(op, rates) > memory_seconds(op, rates)


def floor_seconds(ops: list[Operation], rates: Rates) -> float:
    """No implementation of `ops` is faster: all FLOPs at peak, or all bytes at full
    bandwidth, whichever takes longer."""
    flops = sum(op.flops / rates.peak(op.dtype) for op in ops)
    moved = sum(op.bytes for op in ops) / rates.bandwidth
    return max(flops, moved)
