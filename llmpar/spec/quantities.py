"""Types of spec fields that accept numbers with units (see `llmpar.units`).

They are plain `int`/`float` at run time; the loader's converter recognises the
names and parses strings such as "80 GiB" into base units.
"""

from __future__ import annotations

from typing import NewType

Bytes = NewType("Bytes", int)
"""A size in bytes; a spec may write "80 GiB" or "40 GB"."""

MemorySize = NewType("MemorySize", int)
"""The memory of a device or a node, in bytes; written like Bytes, and a bare number under
1 GiB is taken for a unit left out (`memory_bytes = 80` meant "80 GB")."""

FlopRate = NewType("FlopRate", float)
"""FLOP per second; a spec may write "989 TFLOP/s"."""

ByteRate = NewType("ByteRate", float)
"""Bytes per second; a spec may write "900 GB/s" or "400 Gb/s" (bits)."""

Seconds = NewType("Seconds", float)
"""A duration in seconds; a spec may write "5 us"."""

Count = NewType("Count", float)
"""A large count (parameters, tokens) that TOML may hold as 7e9 or 7_000_000_000."""
