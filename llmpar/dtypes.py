"""Numeric formats and their sizes in bytes per element.

Sub-byte formats are fractions of a byte (int4 is 0.5), never an integer
division that rounds to zero.
"""

from __future__ import annotations

BYTES_PER_ELEMENT: dict[str, float] = {
    "fp64": 8.0,
    "fp32": 4.0,
    "tf32": 4.0,  # stored as fp32; tf32 is a tensor-core math mode
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 4 / 8,
}


def bytes_per_element(dtype: str) -> float:
    """Bytes per element of `dtype`; raises KeyError for an unknown name."""
    return BYTES_PER_ELEMENT[dtype]
