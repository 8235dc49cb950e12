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
    # bitsandbytes' 4-bit formats (Dettmers et al. 2023, QLoRA, arXiv:2305.14314, Sec. 3):
    # 4 bits per element; the per-block scales are `blockwise_bytes_per_element`'s.
    "nf4": 4 / 8,
    "bnb-fp4": 4 / 8,
}
BLOCKWISE_FORMATS = ("nf4", "bnb-fp4")
"""Formats stored in blocks that share one absmax scale (bitsandbytes' 4-bit storage)."""
SECOND_LEVEL_BLOCK_SIZE = 256
"""Double quantization's blocks of first-level scales (QLoRA, Sec. 3: blocksize 256)."""


def bytes_per_element(dtype: str) -> float:
    """Bytes per element of `dtype`; raises KeyError for an unknown name."""
    return BYTES_PER_ELEMENT[dtype]


def blockwise_bytes_per_element(dtype: str, block_size: int, double_quantization: bool) -> float:
    """Bytes per element of a block-wise quantized weight, its block scales included.

    QLoRA (Dettmers et al. 2023, arXiv:2305.14314, Sec. 3, "Double Quantization"): each
    block of `block_size` 4-bit weights keeps one fp32 absmax, 32 / 64 = 0.5 bits per
    parameter at blocksize 64; double quantization stores those absmax values in 8 bits,
    with one fp32 second-level constant per 256 of them: 8 / 64 + 32 / (64 * 256) = 0.127
    bits per parameter. Other formats keep their element size."""
    size = bytes_per_element(dtype)
    if dtype not in BLOCKWISE_FORMATS:
        return size
    if not double_quantization:
        return size + 4.0 / block_size
    return size + 1.0 / block_size + 4.0 / (block_size * SECOND_LEVEL_BLOCK_SIZE)
