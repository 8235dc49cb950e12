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
