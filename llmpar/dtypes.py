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
    # FP8 training recipes, by how they scale (Transformer Engine's and torchao's names;
    # Micikevicius et al. 2022, arXiv:2209.05433): one fp32 scale per tensor or per row,
    # negligible per element; DeepSeek-V3's 1 x 128 blocks (arXiv:2412.19437, Sec. 3.3.1)
    # one fp32 scale per 128 elements; OCP MX (Microscaling Formats v1.0, 2023) one 8-bit
    # E8M0 scale per 32.
    "fp8-tensorwise": 1.0,
    "fp8-rowwise": 1.0,
    "fp8-blockwise": 1.0 + 4 / 128,
    "mxfp8": 1.0 + 1 / 32,
    "int8": 1.0,
    "int4": 4 / 8,
}

MATH_FORMATS: dict[str, str] = {
    "fp8-tensorwise": "fp8", "fp8-rowwise": "fp8", "fp8-blockwise": "fp8", "mxfp8": "fp8",
}
"""Formats whose products run on another format's tensor cores (their peak is that
format's: `Gpu.peak_flops_per_s`); every other format is its own."""


def bytes_per_element(dtype: str) -> float:
    """Bytes per element of `dtype`; raises KeyError for an unknown name."""
    return BYTES_PER_ELEMENT[dtype]


def math_format(dtype: str) -> str:
    """The tensor-core format products in `dtype` run on ("fp8-rowwise" -> "fp8")."""
    return MATH_FORMATS.get(dtype, dtype)
