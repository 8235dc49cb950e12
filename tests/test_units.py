"""Quantities with units: decimal and binary prefixes, bits and bytes."""

from __future__ import annotations

import pytest

from llmpar import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80 GiB", 80 * 2**30), ("80 GB", 80e9), ("512", 512), ("1.5 TB", 1.5e12),
     ("16 MiB", 16 * 2**20), ("8 Gb", 1e9)],
)
def test_bytes(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("989 TFLOP/s", 989e12), ("2250 TFLOPS", 2250e12), ("1.5 PFLOP/s", 1.5e15)],
)
def test_flop_rates(text, expected):
    assert units.parse_flop_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("900 GB/s", 900e9), ("400 Gb/s", 50e9), ("3.35 TB/s", 3.35e12)],
)
def test_byte_rates(text, expected):
    assert units.parse_byte_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["80 Gibs", "fast", "900 TB/s x", "1e9 FLOP"])
def test_unreadable_quantities_raise(text):
    with pytest.raises(units.UnitError):
        units.parse_bytes(text) if "FLOP" not in text else units.parse_flop_rate(text)


def test_durations_use_julian_years():
    assert units.format_duration(41.4 * 365.25 * 86400) == "41.40 years"
    assert units.format_duration(2.1 * 7 * 86400) == "2.10 weeks"
