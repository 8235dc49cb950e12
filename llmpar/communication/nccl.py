"""NCCL's choice of algorithm and protocol for a collective, and its time.

NCCL prices every (algorithm, protocol) pair it may run for a collective as
    time = latency + bytes / algorithm bandwidth
and runs the cheapest (NVIDIA NCCL v2.30.7, src/graph/tuning.cc: `ncclTopoTuneModel`
builds the latencies and bandwidths, `ncclTopoGetAlgoTime` the time). This module
follows that model, algorithm by algorithm:

- ring (all-reduce, all-gather, reduce-scatter): bus bandwidth = the ring's link
  (`collectives.link_of`) x `collective_efficiency`, the role NCCL's channels x
  per-channel bandwidth play; LL halves it, capped at NCCL's `llMaxBws`; LL128 keeps
  0.92 of it. Latency: NCCL's base latency + one hardware latency per step, the
  network's for the steps between nodes (2(N-1) of an all-reduce over N nodes).
- tree (all-reduce): NCCL's double binary tree, a chain inside each node and a
  binary tree of depth log2(N) across nodes. Bus bandwidth 0.92 x the tree's (the
  node's NICs; on two nodes up to twice them, as NCCL's search raises a tree's
  intra-node bandwidth to 2 x its network bandwidth, src/graph/search.cc, bounded by
  the intra-node link), LL 1/3.8 of it, LL128 7/9 (one node) or 120/128; the
  algorithm bandwidth is half the bus bandwidth, and NCCL's `treeCorrectionFactor`
  scales it by size. Latency: base + 2 x ((GPUs per node - 1) x intra + log2(N) x
  network).
- nvls (NVLink SHARP, one NVSwitch domain, Simple only; where `[hardware] nvls`):
  bus bandwidth = intra-node bandwidth x NCCL's `nvlsEfficiency` x (h - 1) / h over
  h GPUs, x 2 for an all-reduce (the switch reduces, so it pipelines two operations),
  x (h - 1) / h for an all-gather or reduce-scatter, whose bus bandwidth is already
  its algorithm bandwidth. Latency: NCCL's NVLink latency for NVLS (25 us).
- nvls-tree (all-reduce across nodes, where `nvls`): NVLS inside each node, a tree
  between nodes: bus bandwidth min(NVLS's, the node's NICs, x 2 on two nodes).
  Latency: 25 us + 2 log2(N) x 20.9 us.
All-to-all and send-recv are NCCL's point-to-point operations, outside this model:
they keep the alpha-beta cost of `collectives.seconds_of`.

Not modelled (they need NCCL's topology search): the channel count and the
per-channel caps (`perChMax*Bws`, which bind only with few channels), CollNet
(in-network reduction, which needs a SHARP-capable network plugin), PAT (one GPU per
node), the tree's 0.85 when NCCL falls back to an unbalanced tree pattern (a balanced
tree is taken), the network plugin's own latency (0 for InfiniBand, src/transport/
net_ib/init.cc), and the CPU-dependent multi-node LL cap and network overhead, taken for
Intel x86 hosts.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from llmpar.arrays import is_array, minimum
from llmpar.spec import Hardware

SOURCE = "NVIDIA NCCL v2.30.7, src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime)"

PROTOCOLS = ("LL", "LL128", "Simple")
US = 1e-6
GB = 1e9

BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
                   "nvls": (0.0, 0.0, 0.0), "nvls-tree": (0.0, 0.0, 0.0)}
"""`baseLatencies` (LL, LL128, Simple), microseconds."""
HARDWARE_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "nvls": (0.0, 0.0, 25.0), "nvls-tree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
            "nvls": (0.0, 0.0, 0.0), "nvls-tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
            "nvls": (0.0, 0.0, 18.0), "nvls-tree": (0.0, 0.0, 20.9)},
}
"""`hwLatencies` per link (NVLink, PCI, network), algorithm and protocol, microseconds."""
LL_MAX_BUS_GBPS_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0,
                            "blackwell": 2 * 141.0}
"""`llMaxBws` of one node, by GPU generation (NCCL's compute-capability index)."""
GENERATION = {"volta": "volta", "turing": "volta", "ampere": "ampere", "ada": "ampere",
              "hopper": "hopper", "blackwell": "blackwell"}
"""NCCL's compute-capability index of each architecture (below 8.0: Volta's; 8.x: Ampere's);
an unstated one takes Ampere's."""
LL_MAX_BUS_GBPS_NODES = (39.0, 20.4)
"""`llMaxBws` across 2 and across more nodes, Intel x86 hosts (NCCL's CPU index 0)."""
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""`nvlsEfficiency`; NVLS needs Hopper or later."""
NET_OVERHEAD_US = 1.0
"""`getNetOverhead` on Intel x86 (3x with Simple): each ring step's floor across nodes."""
RING_PLATEAU = 1.4
"""Ring/Simple all-reduce latency factor across nodes, compute capability >= 8.0."""
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
              .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
               .7, .8, .9, .9, .9),
}
"""`treeCorrectionFactor`: the tree's bandwidth factor at sizes 64 B x 2^i."""

ALGORITHMS = {
    "all-reduce": ("ring", "tree", "nvls", "nvls-tree"),
    "all-gather": ("ring", "nvls"),
    "reduce-scatter": ("ring", "nvls"),
}


class Group(NamedTuple):
    """What NCCL's model needs of one collective's group on one system."""

    operation: str
    ranks: int
    nodes: int
    per_node: int
    ring_bus_bytes_per_s: float
    """The ring's bus bandwidth: its link x collective efficiency."""
    intra_bus_bytes_per_s: float | None
    """The intra-node link x collective efficiency."""
    network_bus_bytes_per_s: float | None
    """The group's NICs in one node together x collective efficiency (across nodes)."""
    nvlink: bool
    generation: str
    nvls: bool


def _log2i(value: int) -> int:
    return int(math.floor(math.log2(value))) if value >= 1 else -1


def _tree_correction(buffer_bytes: Any, protocol: str, limit: int) -> Any:
    """NCCL's correction of a tree's bandwidth at the buffer's size (1 outside the table)."""
    table = TREE_CORRECTION[protocol]
    if not is_array(buffer_bytes):
        index = _log2i(int(buffer_bytes) >> 6)
        return table[index] if 0 <= index < limit else 1.0
    sixty_fourths = np.floor(np.asarray(buffer_bytes, dtype=float) / 64)
    indices = np.where(sixty_fourths >= 1, np.floor(np.log2(np.maximum(sixty_fourths, 1))), -1)
    inside = (indices >= 0) & (indices < limit)
    return np.where(inside, np.asarray(table)[np.clip(indices, 0, 23).astype(int)], 1.0)


def _ll_cap(group: Group) -> float:
    if group.nodes == 1:
        return LL_MAX_BUS_GBPS_ONE_NODE[group.generation] * GB
    return LL_MAX_BUS_GBPS_NODES[0 if group.nodes <= 2 else 1] * GB


def _steps(operation: str, ranks: int) -> int:
    return 2 * (ranks - 1) if operation == "all-reduce" else ranks - 1


def bus_bandwidth(group: Group, algorithm: str, protocol: str) -> float:
    """NCCL's bus bandwidth of one algorithm and protocol, bytes/s (0: not run)."""
    p = PROTOCOLS.index(protocol)
    if algorithm in ("nvls", "nvls-tree") and protocol != "Simple":
        return 0.0
    if protocol == "LL128" and not group.nvlink:
        return 0.0  # LL128 only over NVLink paths (typeIntra <= PATH_NVB)
    if algorithm == "ring":
        bus = group.ring_bus_bytes_per_s
        if p == 0:
            return min(_ll_cap(group), bus * 0.5)
        return bus * 0.92 if p == 1 else bus
    if algorithm == "tree":
        if group.operation != "all-reduce" or group.intra_bus_bytes_per_s is None:
            return 0.0
        if group.nodes == 1:
            tree = group.intra_bus_bytes_per_s
        else:
            network = group.network_bus_bytes_per_s or 0.0
            tree = (min(group.intra_bus_bytes_per_s, 2 * network) if group.nodes == 2
                    else network)
        bus = tree * 0.92
        if p == 0:
            return min(bus / 3.8, _ll_cap(group))
        if p == 1:
            return bus * (7.0 / 9.0 if group.nodes == 1 else 120.0 / 128.0)
        return bus
    # NVLS and NVLS tree: NVLink SHARP inside each node (one NVSwitch domain).
    efficiency = NVLS_EFFICIENCY.get(group.generation)
    h = group.per_node
    if not group.nvls or efficiency is None or h < 2 or group.intra_bus_bytes_per_s is None:
        return 0.0
    if (algorithm == "nvls") != (group.nodes == 1):
        return 0.0  # NVLS across nodes needs CollNet; NVLS tree needs 2+ nodes
    intra = group.intra_bus_bytes_per_s * efficiency * (h - 1) / h
    intra *= 2.0 if group.operation == "all-reduce" else (h - 1) / h
    if algorithm == "nvls":
        return intra
    network = (group.network_bus_bytes_per_s or 0.0) * (2 if group.nodes <= 2 else 1)
    return min(intra, network)


def latency_seconds(group: Group, algorithm: str, protocol: str) -> float:
    """NCCL's latency of one call of one algorithm and protocol."""
    p = PROTOCOLS.index(protocol)
    link = "nvlink" if group.nvlink else "pci"
    intra = HARDWARE_LATENCY_US[link][algorithm][p]
    # With one GPU per node NCCL takes the tree's network latency.
    network = HARDWARE_LATENCY_US["net"]["tree" if group.per_node == 1 else algorithm][p]
    n, nodes = group.ranks, group.nodes
    if algorithm == "ring":
        steps = _steps(group.operation, n)
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
        between = 0 if nodes == 1 else (2 * (nodes - 1) if group.operation == "all-reduce"
                                        else nodes - 1)
        latency = BASE_LATENCY_US[algorithm][p] + (steps - between) * intra + between * network
        if protocol == "Simple" and nodes > 1 and group.operation == "all-reduce":
            latency *= RING_PLATEAU
        return latency * US
    if algorithm == "tree":
        return (BASE_LATENCY_US[algorithm][p]
                + 2 * ((group.per_node - 1) * intra + _log2i(nodes) * network)) * US
    if algorithm == "nvls":
        return intra * US
    return (intra + 2 * _log2i(nodes) * network) * US


def algorithm_bandwidth(group: Group, algorithm: str, protocol: str) -> float:
    """Bytes of the buffer per second: NCCL's conversion of bus to algorithm bandwidth."""
    bus = bus_bandwidth(group, algorithm, protocol)
    if algorithm != "ring" and group.operation != "all-reduce":
        return bus
    if algorithm == "tree":
        return bus * 0.5
    return bus * group.ranks / _steps(group.operation, group.ranks)


@functools.lru_cache(maxsize=4096)
def candidates(group: Group, algorithms: tuple[str, ...] | None = None
               ) -> tuple[tuple[str, str, float, float], ...]:
    """Every (algorithm, protocol, latency seconds, algorithm bytes/s) NCCL would run
    (among `algorithms` only, as NCCL_ALGO restricts it)."""
    found = []
    for algorithm in ALGORITHMS[group.operation]:
        if algorithms is not None and algorithm not in algorithms:
            continue
        for protocol in PROTOCOLS:
            bandwidth = algorithm_bandwidth(group, algorithm, protocol)
            if bandwidth > 0:
                found.append((algorithm, protocol, latency_seconds(group, algorithm, protocol),
                              bandwidth))
    return tuple(found)


def time_of(group: Group, algorithm: str, protocol: str, latency: float, bandwidth: float,
            buffer_bytes: Any) -> Any:
    """`ncclTopoGetAlgoTime`: latency + bytes / bandwidth, with the tree's correction."""
    if algorithm == "tree" or (algorithm == "nvls-tree" and group.generation == "blackwell"):
        bandwidth = bandwidth * _tree_correction(buffer_bytes, protocol,
                                                 23 if algorithm == "tree" else 24)
    return latency + buffer_bytes / bandwidth


def chosen(group: Group, buffer_bytes: Any,
           algorithms: tuple[str, ...] | None = None) -> tuple[Any, Any]:
    """The least time over NCCL's candidates, and the name ("tree/LL") of the one chosen
    (for an array of buffers, an array of names)."""
    best: Any = None
    name: Any = ""
    for algorithm, protocol, latency, bandwidth in candidates(group, algorithms):
        seconds = time_of(group, algorithm, protocol, latency, bandwidth, buffer_bytes)
        label = f"{algorithm}/{protocol}"
        if best is None:
            best, name = seconds, (np.full(np.shape(seconds), label, dtype=object)
                                   if is_array(seconds) else label)
            continue
        better = seconds < best
        name = np.where(better, label, name) if is_array(better) else (label if better else name)
        best = minimum(best, seconds) if is_array(seconds) else min(best, seconds)
    return best, name


def group_of(operation: str, ranks: int, per_node: int, crosses: bool,
             ring_bandwidth: float, hardware: Hardware) -> Group:
    """The group as NCCL's model sees it: its nodes, GPUs per node and bus bandwidths."""
    efficiency = hardware.collective_efficiency
    intra = hardware.intra_node_bandwidth
    nic = hardware.inter_node_bandwidth_bytes_per_s
    nodes = max(1, ranks // per_node) if crosses else 1
    return Group(operation=operation, ranks=ranks, nodes=nodes,
                 per_node=per_node if crosses else ranks,
                 ring_bus_bytes_per_s=ring_bandwidth * efficiency,
                 intra_bus_bytes_per_s=None if intra is None else intra * efficiency,
                 network_bus_bytes_per_s=(None if nic is None or not crosses
                                          else per_node * nic * efficiency),
                 nvlink=hardware.gpu.nvlink_bandwidth_bytes_per_s is not None,
                 generation=GENERATION.get(hardware.gpu.architecture, "ampere"),
                 nvls=hardware.nvls)

