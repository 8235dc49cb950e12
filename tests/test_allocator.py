"""The caching allocator's reserved memory against PyTorch's c10/cuda/
CUDACachingAllocator.cpp: `round_size` (512 B blocks, kMinBlockSize),
`get_allocation_size` (a request up to kSmallSize, 1 MiB, takes a 2 MiB kSmallBuffer
segment; below kMinLargeAlloc, 10 MiB, a 20 MiB kLargeBuffer one; from 10 MiB on a
segment of its own rounded to kRoundLarge, 2 MiB) and, under expandable segments,
`find_expandable_block` (one segment per pool and stream, mapped in kLargeBuffer pages)."""

from __future__ import annotations

import numpy as np
import pytest

import llmpar
from llmpar.evaluation.peak import (
    K_LARGE_BUFFER_BYTES,
    allocator_rounded,
    expandable_reserved,
    segment_bytes,
)

MiB = 2**20
TORCHTITAN = "specs/examples/llama-3-8b-torchtitan-op-sac-h100.toml"


@pytest.mark.parametrize(("size", "segment"), [
    (1, 2 * MiB), (MiB, 2 * MiB),                     # size <= kSmallSize
    (MiB + 1, 20 * MiB), (10 * MiB - 1, 20 * MiB),    # size < kMinLargeAlloc
    (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB),   # kRoundLarge * ceil(size / 2 MiB)
    (21 * MiB, 22 * MiB),
])
def test_a_lone_request_gets_the_segment_get_allocation_size_gives(size, segment):
    assert segment_bytes(size) == segment


def test_a_block_above_10_mib_reserves_its_own_segment():
    """A block of 10 MiB or more holds its whole segment (the tail below kSmallSize is
    not split off: should_split needs remaining > 1 MiB, and a 2 MiB-rounded segment
    leaves less than 2 MiB), so its share of reserved memory is the segment; below, its
    512 B-rounded size (the shared segments' slack is not counted)."""
    for size in (10 * MiB, 10 * MiB + 1, 10 * MiB + MiB + 1, 64 * MiB + 7):
        assert allocator_rounded(size) == segment_bytes(size)
    assert allocator_rounded(5 * MiB + 3) == 5 * MiB + 512
    assert allocator_rounded(10 * MiB - 1) == 10 * MiB


def test_expandable_segments_map_20_mib_pages():
    assert expandable_reserved(1) == K_LARGE_BUFFER_BYTES == 20 * MiB
    assert expandable_reserved(20 * MiB) == 20 * MiB
    assert expandable_reserved(20 * MiB + 1) == 40 * MiB
    values = np.array([1.0, 20.0 * MiB, 20.0 * MiB + 1])
    assert expandable_reserved(values).tolist() == [20 * MiB, 20 * MiB, 40 * MiB]


def test_torchtitan_reserves_its_allocated_peak_in_20_mib_pages():
    """torchtitan launches with expandable segments (run_train.sh): reserved is the
    allocated peak rounded up to 20 MiB, never more than 20 MiB above it; without them
    each block is rounded on its own, at least as much."""
    peak = llmpar.evaluate(TORCHTITAN).training.memory_peak
    assert peak.reserved_bytes == -(-peak.allocated_bytes // (20 * MiB)) * 20 * MiB
    assert 0 <= peak.reserved_bytes - peak.allocated_bytes < 20 * MiB
    blocks = llmpar.evaluate(TORCHTITAN, {"training.framework": {
        "preset": "torchtitan", "expandable_segments": False}}).training.memory_peak
    assert blocks.allocated_bytes == peak.allocated_bytes
    assert blocks.reserved_bytes >= blocks.allocated_bytes
    assert peak.device_bytes - peak.reserved_bytes == blocks.device_bytes - blocks.reserved_bytes
