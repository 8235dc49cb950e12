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
    # FP4 with block scales, Blackwell's block-scaled tensor-core formats (PTX ISA 8.7,
    # `mma.sync.aligned.kind::mxf4nvf4.block_scale`, scale_vec::4X and ::2X; cuBLAS 12.8,
    # "1D Block Scaling Factors Layout"): E2M1 elements (4 bits) and
    # - nvfp4: one FP8 E4M3 scale per 16 elements (1 byte / 16) and one fp32 scale per
    #   tensor (negligible per element);
    # - mxfp4: one 8-bit E8M0 scale per 32 elements (OCP Microscaling Formats (MX) v1.0,
    #   2023, Sec. 5 and Table 1: MXFP4 = E2M1, k = 32, E8M0 shared scale).
    "nvfp4": 4 / 8 + 1 / 16,
    "mxfp4": 4 / 8 + 1 / 32,
    # bitsandbytes' 4-bit formats (Dettmers et al. 2023, QLoRA, arXiv:2305.14314, Sec. 3):
    # 4 bits per element; the per-block scales are `blockwise_bytes_per_element`'s.
    "nf4": 4 / 8,
    "bnb-fp4": 4 / 8,
}
BLOCKWISE_FORMATS = ("nf4", "bnb-fp4")
"""Formats stored in blocks that share one absmax scale (bitsandbytes' 4-bit storage)."""
SECOND_LEVEL_BLOCK_SIZE = 256
"""Double quantization's blocks of first-level scales (QLoRA, Sec. 3: blocksize 256)."""

MATH_FORMATS: dict[str, str] = {
    "fp8-tensorwise": "fp8", "fp8-rowwise": "fp8", "fp8-blockwise": "fp8", "mxfp8": "fp8",
    "nvfp4": "fp4", "mxfp4": "fp4",
}
"""Formats whose products run on another format's tensor cores (their peak is that
format's: `Gpu.peak_flops_per_s`); every other format is its own."""


def bytes_per_element(dtype: str) -> float:
    """Bytes per element of `dtype`; raises KeyError for an unknown name."""
    return BYTES_PER_ELEMENT[dtype]


def math_format(dtype: str) -> str:
    """The tensor-core format products in `dtype` run on ("fp8-rowwise" -> "fp8")."""
    return MATH_FORMATS.get(dtype, dtype)


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
