"""Human units for plan numbers, chosen from the unit in each field's name."""

from __future__ import annotations

from llmpar.units import GB, GiB, format_count, format_duration

PERCENT_FIELDS = ("mfu", "hfu")
"""Fractions without `_fraction` in their names."""

_DECIMAL_BYTES = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def format_size(num_bytes: float) -> str:
    """One decimal unit, labelled: 1.5e8 -> '150.00 MB' (MB = 10^6 bytes)."""
    for name, size in _DECIMAL_BYTES:
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:,.2f} {name}"
    return f"{num_bytes:,.0f} B"


def format_gb_gib(num_bytes: float) -> str:
    """Both conventions, labelled: '85.90 GB / 80.00 GiB'."""
    return f"{num_bytes / GB:,.2f} GB / {num_bytes / GiB:,.2f} GiB"


def format_value(name: str, value: object) -> str:
    """`value` of the plan field `name` in human units ('-' for None)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("_bytes"):
        return format_gb_gib(value)
    if leaf.endswith("_seconds"):
        return format_duration(value)
    if leaf.endswith("_fraction") or leaf in PERCENT_FIELDS:
        return f"{value:.1%}"
    if "flops" in leaf:
        return f"{value:.4g} FLOP"
    if leaf == "gpu_hours":
        return f"{value:,.0f} GPU-hours"
    if leaf == "tokens_per_second":
        return f"{value:,.0f} tokens/s"
    if leaf.startswith("activation_k"):
        return f"{value:.2f}"
    if isinstance(value, int) and abs(value) < 10**6:
        return f"{value:,}"
    return format_count(value)
