"""DeepEP's low-latency dispatch and combine, the kernels a decode step's expert
all-to-all runs under `[parallel.expert] dispatcher = "deepep"`.

They send each routed copy of a token straight to its expert's GPU over RDMA (no NVLink
forwarding, no ring), dispatching in FP8 with one fp32 scale per 128 channels and
combining in bf16 (deepseek-ai/DeepEP, docs/legacy.md, "Low-latency kernels with pure
RDMA"). Their measured bandwidth, logical bytes over latency, at 128 tokens a rank, top-8,
hidden 7168, on H800 with one 400 Gb/s ConnectX-7 NIC (50 GB/s) a GPU, falls with the
number of expert ranks (validation/published/kernels/deepep_low_latency_h800.toml):
kept here as shares of the NIC's bandwidth, so that another network scales them.
One call moves `elements` = tokens x k x hidden:

    dispatch = elements * (1 + 4/128) / (dispatch share(e) * NIC bandwidth)
    combine  = elements * 2 / (combine share(e) * NIC bandwidth)

plus the network's latency once (one RDMA hop). The bytes of 128 tokens give the measured
latencies back within 2%. The shares are interpolated in log2 of the expert ranks and held
at the ends of the table (8 and 256); below 128 tokens a rank the kernels are assumed to
keep their bandwidth (a lower bound on their time).
"""

from __future__ import annotations

import math

MEASURED_NIC_BYTES_PER_S = 50e9
"""The measured GPUs' NIC: ConnectX-7 InfiniBand at 400 Gb/s."""
DISPATCH_BYTES_PER_ELEMENT = 1 + 4 / 128
"""FP8 with one fp32 scale per 128 channels."""
COMBINE_BYTES_PER_ELEMENT = 2.0
"""bf16."""
LOW_LATENCY_SHARES: tuple[tuple[int, float, float], ...] = (
    # expert ranks, dispatch and combine bandwidth as shares of the NIC's 50 GB/s
    (8, 98 / 50, 127 / 50),
    (16, 63 / 50, 74 / 50),
    (32, 48 / 50, 53 / 50),
    (64, 43 / 50, 46 / 50),
    (128, 39 / 50, 39 / 50),
    (256, 39 / 50, 40 / 50),
)
"""Above 1 at 8 and 16 ranks: the logical bandwidth counts the copies a GPU keeps."""
NORMAL_KERNEL_SMS = 20
"""Streaming multiprocessors DeepEP's normal (high-throughput) dispatch and combine run on
(deepseek-ai/DeepEP, deep_ep/buffer.py: `Buffer.num_sms = 20`, set by `Buffer.set_num_sms`;
the DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.2.2: "only 20 SMs are sufficient to fully
utilize the bandwidths of IB and NVLink"). SGLang's DeepEP dispatcher keeps this default
unless `--deepep-config` names another. The low-latency kernels occupy no SM while their
transfers are in flight (DeepEP README, hook-based overlap), so they take nothing."""
MEAN_BYTES_PER_ELEMENT = (DISPATCH_BYTES_PER_ELEMENT + COMBINE_BYTES_PER_ELEMENT) / 2
"""A layer's dispatch and combine stated as two calls of one buffer: its mean."""


def low_latency_shares(expert_ranks: int) -> tuple[float, float]:
    """(dispatch, combine) bandwidth as shares of the NIC's, at `expert_ranks`."""
    table = LOW_LATENCY_SHARES
    if expert_ranks <= table[0][0]:
        return table[0][1], table[0][2]
    for (low, d0, c0), (high, d1, c1) in zip(table, table[1:]):
        if expert_ranks <= high:
            at = (math.log2(expert_ranks) - math.log2(low)) / (math.log2(high) - math.log2(low))
            return d0 + (d1 - d0) * at, c0 + (c1 - c0) * at
    return table[-1][1], table[-1][2]


def low_latency_call_seconds(buffer_bytes: float, expert_ranks: int,
                             nic_bytes_per_s: float, latency_seconds: float) -> float:
    """One call (the mean of a dispatch and a combine) of a buffer of
    `elements * MEAN_BYTES_PER_ELEMENT` bytes."""
    elements = buffer_bytes / MEAN_BYTES_PER_ELEMENT
    dispatch_share, combine_share = low_latency_shares(expert_ranks)
    dispatch = elements * DISPATCH_BYTES_PER_ELEMENT / (dispatch_share * nic_bytes_per_s)
    combine = elements * COMBINE_BYTES_PER_ELEMENT / (combine_share * nic_bytes_per_s)
    return (dispatch + combine) / 2 + latency_seconds
