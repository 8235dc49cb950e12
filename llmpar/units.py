"""Quantities with units: parsing spec strings and formatting report numbers.

Specs may write sizes and rates as numbers in base units (bytes, FLOP/s, bytes/s)
or as strings with units ("80 GiB", "989 TFLOP/s", "400 Gb/s"). Decimal prefixes
are powers of 10 (GB = 10^9 bytes) and binary prefixes powers of 2 (GiB = 2^30
bytes), as IEC 80000-13 defines them; a lower-case "b" is a bit.
"""

from __future__ import annotations

import math
import re

GB = 10**9
GiB = 2**30

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}

QUANTITY_PATTERN = r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$"
"""A number and its unit ("80 GiB", "400 Gb/s"), as a regular expression (also the spec's
JSON Schema's pattern for them)."""
_QUANTITY = re.compile(QUANTITY_PATTERN)


class UnitError(ValueError):
    """A quantity string that does not parse, or has the wrong kind of unit."""


def _split(text: str) -> tuple[float, str]:
    match = _QUANTITY.match(text)
    if match is None:
        raise UnitError(f"cannot read {text!r} as a number with a unit")
    return float(match.group(1)), match.group(2)


def _prefix_factor(prefix: str, text: str) -> float:
    if prefix in _BINARY:
        return float(_BINARY[prefix])
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    raise UnitError(f"unknown unit prefix {prefix!r} in {text!r}")


def parse_bytes(text: str) -> float:
    """'80 GiB' -> 85899345920.0; '40 GB' -> 4e10; '512' -> 512.0 (bytes)."""
    value, unit = _split(text)
    if unit in ("", "B"):
        return value
    if unit.endswith("B"):
        return value * _prefix_factor(unit[:-1], text)
    if unit.endswith("b"):
        return value * _prefix_factor(unit[:-1], text) / 8
    raise UnitError(f"expected a size such as '80 GiB' or '40 GB', got {text!r}")


def parse_flop_rate(text: str) -> float:
    """'989 TFLOP/s' -> 9.89e14 (FLOP per second); 'TFLOPS' is accepted too."""
    value, unit = _split(text)
    for suffix in ("FLOP/s", "FLOPS", "flop/s", "flops"):
        if unit.endswith(suffix):
            return value * _prefix_factor(unit[: -len(suffix)], text)
    if unit == "":
        return value
    raise UnitError(f"expected a rate such as '989 TFLOP/s', got {text!r}")


def parse_byte_rate(text: str) -> float:
    """'900 GB/s' -> 9e11 bytes/s; '400 Gb/s' -> 5e10 bytes/s (b is a bit)."""
    value, unit = _split(text)
    if unit == "":
        return value
    if not unit.endswith("/s"):
        raise UnitError(f"expected a bandwidth such as '900 GB/s' or '400 Gb/s', got {text!r}")
    return parse_bytes(f"{value!r} {unit[:-2]}")


def parse_seconds(text: str) -> float:
    """'5 us' -> 5e-6; '2 ms' -> 0.002; '1.5 s' -> 1.5; '30 min' -> 1800; '2 h' -> 7200;
    '14 d' -> 1209600."""
    value, unit = _split(text)
    factors = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0,
               "h": 3600.0, "d": 86400.0}
    if unit not in factors:
        raise UnitError(f"expected a time such as '5 us', '2 ms', '30 min' or '14 d', got "
                        f"{text!r}")
    return value * factors[unit]


def format_bytes(num_bytes: float) -> str:
    """Both conventions, labelled: '85.90 GB (80.00 GiB)'."""
    return f"{num_bytes / GB:,.2f} GB ({num_bytes / GiB:,.2f} GiB)"


_SECONDS_PER = (
    ("years", 365.25 * 86400),
    ("months", 365.25 * 86400 / 12),
    ("weeks", 7 * 86400),
    ("days", 86400),
    ("hours", 3600),
    ("minutes", 60),
    ("s", 1),
)


def format_duration(seconds: float) -> str:
    """Human units: the largest unit with a value of at least 1 ('4.22 weeks').

    A year is 365.25 days and a month a twelfth of it, the conventions behind the
    founding document's training-time table.
    """
    if not math.isfinite(seconds):
        return str(seconds)
    for name, size in _SECONDS_PER:
        if seconds >= size:
            return f"{seconds / size:,.2f} {name}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def format_count(value: float) -> str:
    """Large counts with an SI suffix: 7.0e9 -> '7.00 B' style avoided; '7.00e+09'."""
    for suffix, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f}{suffix}"
    return f"{value:,.0f}"
