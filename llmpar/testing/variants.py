"""Configs of a strategy's table beyond its default: each field set to another value its
validators accept (booleans flipped, every choice of a `one_of` field, numbers scaled),
so the contract suite tries what users write, not only the defaults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs


def _candidates(field: Any, default: Any) -> list[Any]:
    choices = getattr(field.validator, "choices", None)
    if choices is not None:
        return [c for c in choices if c != default]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default * 2, default + 1] if default > 0 else [1, 2]
    if isinstance(default, float):
        return [default * 0.5, default * 2]
    annotation = str(field.type or "")
    if default is None and "tuple" not in annotation and "list" not in annotation:
        numbers = [v for kind, v in (("int", 1), ("int", 2), ("float", 0.5)) if kind in annotation]
        return numbers + ([True] if "bool" in annotation else [])
    return []


def field_variants(config_type: type[Any]) -> Iterator[Any]:
    """The default config with one field changed, for every field and value its
    validators accept (the degree excepted: the contract tries degrees itself)."""
    default = config_type()
    for field in attrs.fields(config_type):
        if field.name == "degree":
            continue
        for value in _candidates(field, getattr(default, field.name)):
            try:
                yield attrs.evolve(default, **{field.name: value})
            except (ValueError, TypeError):
                continue
