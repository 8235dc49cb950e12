"""Latency-bandwidth (alpha-beta) cost of ring collectives.

Per GPU, a ring all-reduce of B bytes over n GPUs sends 2(n-1)/n * B in 2(n-1)
steps; all-gather and reduce-scatter of a B-byte tensor send (n-1)/n * B in n-1
steps; an all-to-all of B bytes per GPU sends (n-1)/n * B (pairwise exchange,
n-1 steps); a send moves B in one step. Thakur, Rabenseifner and Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", Sec. 4; the
bus-bandwidth convention of NVIDIA's nccl-tests (doc/PERFORMANCE.md).
"""

from __future__ import annotations

import attrs

from llmpar.spec import Hardware
from llmpar.strategy import Collective

INTRA_NODE = "intra-node"
INTER_NODE = "inter-node"


def traffic_and_steps(operation: str, buffer_bytes: float, group_size: int) -> tuple[float, int]:
    """Bytes one GPU sends, and the number of sequential steps, for one call."""
    n = group_size
    if n <= 1:
        return 0.0, 0
    share = (n - 1) / n
    if operation == "all-reduce":
        return 2 * share * buffer_bytes, 2 * (n - 1)
    if operation in ("all-gather", "reduce-scatter", "all-to-all"):
        return share * buffer_bytes, n - 1
    if operation == "send-recv":
        return buffer_bytes, 1
    raise ValueError(f"unknown collective {operation!r}")


def spans_nodes(collective: Collective, gpus_per_node: int) -> bool:
    """Whether the group's ranks (stride apart) leave one node."""
    return collective.group_stride * collective.group_size > gpus_per_node


@attrs.frozen(kw_only=True)
class Link:
    tier: str
    bandwidth_bytes_per_s: float | None
    latency_seconds: float


def link_of(collective: Collective, hardware: Hardware) -> Link:
    """The slowest link the group spans."""
    if collective.operation == "send-recv":
        # Consecutive pipeline stages sit group_stride ranks apart.
        crosses = collective.group_stride >= hardware.gpus_per_node
    else:
        crosses = spans_nodes(collective, hardware.gpus_per_node)
    if crosses and hardware.num_gpus > hardware.gpus_per_node:
        return Link(tier=INTER_NODE,
                    bandwidth_bytes_per_s=hardware.inter_node_bandwidth_bytes_per_s,
                    latency_seconds=hardware.inter_node_latency_seconds)
    return Link(tier=INTRA_NODE, bandwidth_bytes_per_s=hardware.intra_node_bandwidth,
                latency_seconds=hardware.intra_node_latency_seconds)


def call_seconds(collective: Collective, hardware: Hardware) -> tuple[float | None, str]:
    """Seconds of one call on its link, and the tier; None when the link is unknown."""
    link = link_of(collective, hardware)
    sent, steps = traffic_and_steps(collective.operation, collective.buffer_bytes,
                                    collective.group_size)
    if steps == 0:
        return 0.0, link.tier
    if link.bandwidth_bytes_per_s is None:
        return None, link.tier
    bandwidth = link.bandwidth_bytes_per_s * hardware.collective_efficiency
    return sent / bandwidth + steps * link.latency_seconds, link.tier
