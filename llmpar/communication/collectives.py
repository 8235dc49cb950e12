"""Latency-bandwidth (alpha-beta) cost of ring collectives.

Per GPU, a ring all-reduce of B bytes over n GPUs sends 2(n-1)/n * B in 2(n-1)
steps; all-gather and reduce-scatter of a B-byte tensor send (n-1)/n * B in n-1
steps; an all-to-all of B bytes per GPU sends (n-1)/n * B (pairwise exchange,
n-1 steps); a send moves B in one step (Thakur, Rabenseifner and Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", Sec. 4; the
bus-bandwidth convention of NVIDIA's nccl-tests, doc/PERFORMANCE.md). Across nodes
the ring collectives share the node's NICs (`link_of`) and an all-to-all sends only
what leaves the node.

With `[hardware] collective_algorithms = "nccl"` the ring collectives are costed as
NCCL chooses among its algorithms and protocols instead (`llmpar.communication.nccl`),
on the same links.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llmpar.communication import nccl
from llmpar.placement import ring_crosses_nodes
from llmpar.spec import Hardware
from llmpar.strategy import Collective

RING_OPERATIONS = ("all-reduce", "all-gather", "reduce-scatter")
INTRA_NODE = "intra-node"
INTER_NODE = "inter-node"


def traffic_and_steps(operation: str, buffer_bytes: Any, group_size: int,
                      members_per_node: int = 1) -> tuple[Any, int]:
    """Bytes one GPU sends over the group's slowest link, and the number of sequential
    steps, for one call. An all-to-all whose group has `members_per_node` GPUs in each
    node sends the share bound for other nodes over the network: (n - k)/n of B."""
    n = group_size
    if n <= 1:
        return 0.0, 0
    share = (n - 1) / n
    if operation == "all-reduce":
        return 2 * share * buffer_bytes, 2 * (n - 1)
    if operation == "all-to-all":
        return (n - min(members_per_node, n - 1)) / n * buffer_bytes, n - 1
    if operation in ("all-gather", "reduce-scatter"):
        return share * buffer_bytes, n - 1
    if operation == "send-recv":
        return buffer_bytes, 1
    raise ValueError(f"unknown collective {operation!r}")


def spans_nodes(collective: Collective, gpus_per_node: int) -> bool:
    """Whether the group's ranks (stride apart) leave one node."""
    return collective.group_stride * collective.group_size > gpus_per_node


class Link(NamedTuple):
    tier: str
    bandwidth_bytes_per_s: float | None
    latency_seconds: float


def members_per_node(group_size: int, group_stride: int, gpus_per_node: int) -> int:
    """How many of the group's GPUs share one node (the group's ranks stride apart)."""
    if group_stride >= gpus_per_node:
        return 1
    return max(1, min(group_size, gpus_per_node // group_stride))


def link_of(collective: Collective, hardware: Hardware) -> Link:
    """The slowest link the group spans.

    Across nodes, a ring collective whose group has k GPUs in each node runs one ring
    (NCCL channel) per NIC, so each node's k NICs carry the ring's traffic together:
    the link is k x the per-GPU network bandwidth, at most the intra-node link (NCCL
    builds a ring per NIC, each crossing the network once per node; measured busbw on
    multi-node DGX/HGX systems sits near the node's total network bandwidth,
    docs/validation-collectives.md). Sends and all-to-alls use each GPU's own NIC; a
    ring of sends (ring attention) is as slow as its slowest hop, so it crosses the
    network once any two consecutive members sit on different nodes
    (`llmpar.placement.ring_crosses_nodes`)."""
    if collective.operation == "send-recv":
        # Each member sends to the next one, group_stride ranks on (a ring's last back to
        # its first): the slowest of those hops. A pipeline states the pair of two
        # consecutive stages.
        crosses = ring_crosses_nodes(collective.group_size, collective.group_stride,
                                     hardware.gpus_per_node)
    else:
        crosses = spans_nodes(collective, hardware.gpus_per_node)
    intra = hardware.intra_node_bandwidth
    if not (crosses and hardware.num_gpus > hardware.gpus_per_node):
        return Link(tier=INTRA_NODE, bandwidth_bytes_per_s=intra,
                    latency_seconds=hardware.intra_node_latency_seconds)
    bandwidth: float | None = hardware.inter_node_bandwidth_bytes_per_s
    if bandwidth is not None and collective.operation in RING_OPERATIONS:
        k = members_per_node(collective.group_size, collective.group_stride,
                             hardware.gpus_per_node)
        bandwidth = min(k * bandwidth, intra) if intra is not None else k * bandwidth
    return Link(tier=INTER_NODE, bandwidth_bytes_per_s=bandwidth,
                latency_seconds=hardware.inter_node_latency_seconds)


def seconds_of(collective: Collective, hardware: Hardware,
               buffer_bytes: Any = None) -> tuple[Any, str]:
    """Seconds of one call on its link (of `buffer_bytes`, a number or an array, in place
    of the collective's own), and the tier; None when the link is unknown."""
    link = link_of(collective, hardware)
    buffer = collective.buffer_bytes if buffer_bytes is None else buffer_bytes
    k = members_per_node(collective.group_size, collective.group_stride,
                         hardware.gpus_per_node) if link.tier == INTER_NODE else 1
    sent, steps = traffic_and_steps(collective.operation, buffer, collective.group_size, k)
    if steps == 0:
        return 0.0, link.tier
    if link.bandwidth_bytes_per_s is None:
        return None, link.tier
    if hardware.collective_algorithms == "nccl" and collective.operation in RING_OPERATIONS:
        return nccl.chosen(_nccl_group(collective, hardware, link, k), buffer)[0], link.tier
    bandwidth = link.bandwidth_bytes_per_s * hardware.collective_efficiency
    return sent / bandwidth + steps * link.latency_seconds, link.tier


def _nccl_group(collective: Collective, hardware: Hardware, link: Link,
                per_node: int) -> nccl.Group:
    assert link.bandwidth_bytes_per_s is not None
    return nccl.group_of(collective.operation, collective.group_size, per_node,
                         link.tier == INTER_NODE, link.bandwidth_bytes_per_s, hardware)


def nccl_choice(collective: Collective, hardware: Hardware, buffer_bytes: Any = None,
                algorithms: tuple[str, ...] | None = None) -> tuple[Any, str]:
    """NCCL's least time for one call of a ring-type collective and the algorithm/protocol
    chosen (among `algorithms` only, as NCCL_ALGO restricts it); (None, "") on an
    unknown link."""
    link = link_of(collective, hardware)
    if link.bandwidth_bytes_per_s is None:
        return None, ""
    k = members_per_node(collective.group_size, collective.group_stride,
                         hardware.gpus_per_node) if link.tier == INTER_NODE else 1
    buffer = collective.buffer_bytes if buffer_bytes is None else buffer_bytes
    seconds, name = nccl.chosen(_nccl_group(collective, hardware, link, k), buffer, algorithms)
    return seconds, name


def algorithm_of(collective: Collective, hardware: Hardware,
                 buffer_bytes: float | None = None) -> str:
    """The algorithm a call runs: "ring" (ring-only model), NCCL's algorithm/protocol
    ("tree/LL", "nvls/Simple") under `collective_algorithms = "nccl"`, "point-to-point"
    for all-to-all and send-recv; "" for a group of one or an unknown link."""
    if collective.group_size <= 1:
        return ""
    if collective.operation not in RING_OPERATIONS:
        return "point-to-point"
    if hardware.collective_algorithms != "nccl":
        return "ring"
    return str(nccl_choice(collective, hardware, buffer_bytes)[1])


def call_seconds(collective: Collective, hardware: Hardware) -> tuple[float | None, str]:
    """Seconds of one call on its link, and the tier; None when the link is unknown."""
    return seconds_of(collective, hardware)
