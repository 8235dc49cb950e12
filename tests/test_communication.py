"""Collective costs (llmpar.communication.collectives): ring traffic, the link a group
uses, and the node's NICs shared by the ring collectives of a group spanning nodes."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.communication.collectives import (
    INTER_NODE,
    INTRA_NODE,
    link_of,
    members_per_node,
    seconds_of,
    traffic_and_steps,
)
from llmpar.placement import ring_crosses_nodes
from llmpar.strategy import Collective

SESSION = llmpar.Session(load_entry_points=False)
HARDWARE = SESSION.load_spec({"model": {"parameters": 1e9},
                              "hardware": {"cluster": "dgx-h100", "num_gpus": 64}}).hardware
NIC = 400e9 / 8  # dgx-h100: one 400 Gb/s NIC per GPU
NVLINK = 450e9  # 900 GB/s both ways


def group(operation: str, size: int, stride: int, buffer: float = 1e9) -> Collective:
    return Collective(strategy="test", name="test", operation=operation, buffer_bytes=buffer,
                      group_size=size, group_stride=stride)


def test_ring_traffic_and_steps():
    """Thakur et al. 2005: 2(n-1)/n B in 2(n-1) steps for an all-reduce, (n-1)/n B in n-1
    for an all-gather or reduce-scatter, B in one for a send."""
    assert traffic_and_steps("all-reduce", 8.0, 8) == (14.0, 14)
    assert traffic_and_steps("all-gather", 8.0, 8) == (7.0, 7)
    assert traffic_and_steps("send-recv", 8.0, 2) == (8.0, 1)
    assert traffic_and_steps("all-reduce", 8.0, 1) == (0.0, 0)


@pytest.mark.parametrize(("size", "stride", "expected"),
                         [(16, 1, 8), (16, 2, 4), (16, 8, 1), (16, 16, 1), (4, 1, 4)])
def test_members_per_node(size, stride, expected):
    assert members_per_node(size, stride, 8) == expected


def test_a_group_inside_a_node_uses_nvlink():
    link = link_of(group("all-reduce", 8, 1), HARDWARE)
    assert (link.tier, link.bandwidth_bytes_per_s) == (INTRA_NODE, NVLINK)


@pytest.mark.parametrize(("stride", "expected"), [(1, 8 * NIC), (2, 4 * NIC), (8, NIC)])
def test_ring_collectives_across_nodes_share_the_nodes_nics(stride, expected):
    """A 16-GPU group with k members per node runs k rings, one per NIC (NCCL's
    channels), so its traffic crosses the network at k x one NIC, at most NVLink."""
    link = link_of(group("all-reduce", 16, stride), HARDWARE)
    assert link.tier == INTER_NODE
    assert link.bandwidth_bytes_per_s == pytest.approx(min(expected, NVLINK))


def test_sends_and_all_to_alls_use_their_own_nic():
    assert link_of(group("send-recv", 2, 8), HARDWARE).bandwidth_bytes_per_s == NIC
    assert link_of(group("all-to-all", 16, 1), HARDWARE).bandwidth_bytes_per_s == NIC


def test_all_to_all_across_nodes_sends_only_what_leaves_the_node():
    """16 GPUs, 8 per node: each sends 8/16 of its buffer to the other node."""
    seconds, tier = seconds_of(group("all-to-all", 16, 1, buffer=1e9), HARDWARE)
    efficiency = HARDWARE.collective_efficiency
    latency = HARDWARE.inter_node_latency_seconds
    assert tier == INTER_NODE
    assert seconds == pytest.approx(0.5e9 / (NIC * efficiency) + 15 * latency)


def test_arrays_of_buffers_cost_like_single_buffers():
    np = pytest.importorskip("numpy")
    probe = group("reduce-scatter", 16, 2)
    buffers = np.array([1e6, 1e8])
    many, _ = seconds_of(probe, HARDWARE, buffers)
    assert list(many) == [pytest.approx(seconds_of(group("reduce-scatter", 16, 2, b),
                                                   HARDWARE)[0]) for b in buffers]


def _ring_hop_crosses(size: int, stride: int, per_node: int) -> bool:
    """By enumeration: some group of an axis (size ranks, stride apart, the groups tiling
    size x stride x per_node ranks) has two consecutive members, the last and the first
    included, on different nodes."""
    block = size * stride
    for first in range(block * per_node):
        if first % block >= stride:
            continue  # not a group's first member
        nodes = [(first + j * stride) // per_node for j in range(size)]
        if any(nodes[j] != nodes[(j + 1) % size] for j in range(size)):
            return True
    return False


@pytest.mark.parametrize("per_node", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("stride", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_ring_crosses_nodes_matches_the_members_nodes(size, stride, per_node):
    assert ring_crosses_nodes(size, stride, per_node) == _ring_hop_crosses(size, stride,
                                                                           per_node)


def _kv_ring(context: int) -> llmpar.plan.CollectiveCost:
    plan = SESSION.evaluate({
        "model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 32},
        "training": {"sequence_length": 8192, "global_batch_size": 32},
        "parallel": {"tensor": {"degree": 4}, "context": {"degree": context}}})
    (ring,) = [c for c in plan.collectives if c.name == "context.kv-ring"]
    return ring


def test_a_context_ring_spanning_nodes_is_costed_on_the_network():
    """CP8 x TP4 on 8-GPU DGX H100 nodes: GPU 0's context ranks are GPUs 0, 4 | 8, 12 |
    16, 20 | 24, 28, so the hops 4 -> 8, 12 -> 16, 20 -> 24 and 28 -> 0 cross the
    network, whose NIC paces the ring; CP2 x TP4 (GPUs 0 and 4) stays on NVLink."""
    wide, narrow = _kv_ring(8), _kv_ring(2)
    assert (wide.tier, narrow.tier) == (INTER_NODE, INTRA_NODE)
    # One send per call: the chunk over the slowest hop, plus that hop's latency.
    per_call = wide.seconds / wide.calls_per_step
    expected = (wide.buffer_bytes / (NIC * HARDWARE.collective_efficiency)
                + HARDWARE.inter_node_latency_seconds)
    assert per_call == pytest.approx(expected, rel=1e-6)
    # The stride alone (4 < 8 GPUs per node) said NVLink for both.
    assert link_of(group("send-recv", 8, 4), HARDWARE).tier == INTER_NODE
    assert link_of(group("send-recv", 2, 4), HARDWARE).tier == INTRA_NODE
