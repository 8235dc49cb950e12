"""Reading a spec source (a file, TOML text or a mapping) into a plain table."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from llmpar.errors import Problem, SpecError

SpecSource = str | PathLike[str] | Mapping[str, Any]


def _looks_like_toml(text: str) -> bool:
    return "\n" in text or "=" in text or "[" in text


def read_source(source: SpecSource) -> tuple[dict[str, Any], str | None]:
    """The spec's table and a label for messages (the file name, or None)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), None
    if isinstance(source, str) and (_looks_like_toml(source) or not source.strip()):
        return parse_toml(source, None), None
    path = Path(source)
    label = str(path)
    if not path.is_file():
        problem = "file not found" if not path.exists() else "not a file"
        raise SpecError([Problem("$", problem)], label)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem("$", f"cannot read the file: {exc}")], label) from None
    return parse_toml(text, label), label


def parse_toml(text: str, label: str | None) -> dict[str, Any]:
    """TOML text to a table; an empty document or bad TOML is a SpecError."""
    if not text.strip():
        raise SpecError([Problem("$", "the spec is empty")], label)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([Problem("$", f"not valid TOML: {exc}")], label) from None


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` on top; tables merge key by key, other values replace."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[str, Any]:
    """'hardware.num_gpus=8' -> ('hardware.num_gpus', 8); values are TOML, else strings."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SpecError([Problem("$", f"override {text!r} is not KEY=VALUE")], None)
    try:
        parsed = tomllib.loads(f"value = {value.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.strip(), parsed


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys (`training.sequence_length`) in a spec table.

    A preset name on the way (`model = "7b"`) becomes `{preset = "7b"}` so that a
    field of the preset can be overridden.
    """
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        table = raw
        for key in parents:
            child = table.get(key)
            if isinstance(child, str):
                child = {"preset": child}
            elif not isinstance(child, dict):
                child = {}
            table[key] = child
            table = child
        table[last] = value
    return raw
