"""Reading a spec source (a file, TOML text or a mapping) into a plain table."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from llmpar.errors import Problem, SpecError, printable
from llmpar.loading.limits import (
    MAX_FILE_BYTES,
    plain_table,
    read_text,
    too_deep,
)

SpecSource = str | PathLike[str] | Mapping[str, Any]


def _looks_like_toml(text: str) -> bool:
    return "\n" in text or "=" in text or "[" in text


def existing_file(text: str) -> Path | None:
    """`text` as the path of an existing file, or None (a name too long for the
    filesystem, or one that is not there, is not a file)."""
    if "\n" in text or "\0" in text or not text.strip():
        return None
    try:
        path = Path(text)
        return path if path.is_file() else None
    except (OSError, ValueError):
        return None


def with_text(source: object, text: str | None,
              label: str = "<text>") -> Any:
    """The source of a call that takes a spec as `source` or as TOML `text` (the
    explicit form): the table the text holds, or `source` as given. Both, or a text
    that is not a string, is a SpecError."""
    if text is None:
        return source
    if source is not None:
        raise SpecError([Problem("$", "give the spec either as a source (a path, a table, "
                                      "a Spec) or as TOML text, not both")], None)
    if not isinstance(text, str):
        raise SpecError([Problem("$", "text must be TOML text (a str), got "
                                      f"{type(text).__name__}")], None)
    return parse_toml(text, label)


def read_source(source: SpecSource) -> tuple[dict[str, Any], str | None]:
    """The spec's table and a label for messages (the file name, or None).

    A string is a file when a file of that name exists, else TOML text when it looks
    like TOML (so `a=b.toml` on disk is read as the file it is), else a file name. That
    TOML text is still read for callers that pass it, but the explicit form is
    `text=` (`llmpar.evaluate(text=...)`, `Session.evaluate(text=...)`) or
    `--spec-text` on the command line: a string that means a file is then never taken
    for TOML, nor TOML for a file.
    """
    if isinstance(source, Mapping):
        return plain_table(source, None), None
    if not isinstance(source, (str, PathLike)):
        raise SpecError([Problem("$", "expected a spec: a file path, TOML text or a table, "
                                      f"got {type(source).__name__}")], None)
    if isinstance(source, str):
        path = existing_file(source)
        if path is None and (_looks_like_toml(source) or not source.strip()):
            return parse_toml(source, None), None
    path = Path(source)
    label = printable(str(path))
    return parse_toml(read_text(path, label), label), label


def parse_toml(text: str, label: str | None) -> dict[str, Any]:
    """TOML text to a table within llmpar's limits; an empty document or bad TOML is a
    SpecError."""
    text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the document
    if not text.strip():
        raise SpecError([Problem("$", "the spec is empty: it needs at least `model = ...` "
                                      "and a [hardware] table with `gpu = ...`, and a "
                                      "[training] or [inference] table for the workload "
                                      "(specs/examples/ has complete ones)")], label)
    if len(text) > MAX_FILE_BYTES:
        raise SpecError([Problem("$", f"the spec is {len(text):,} characters; llmpar reads at "
                                      f"most {MAX_FILE_BYTES:,}")], label)
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([Problem("$", f"not valid TOML: {exc}")], label) from None
    except RecursionError:
        raise SpecError([too_deep("$")], label) from None
    return plain_table(table, label)


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
    except RecursionError:
        raise SpecError([too_deep(printable(key.strip()))], None) from None
    return key.strip(), parsed


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys (`training.sequence_length`) in a spec table.

    A preset name on the way (`model = "7b"`) becomes `{preset = "7b"}` so that a
    field of the preset can be overridden.
    """
    if not isinstance(overrides, Mapping):
        raise SpecError([Problem("$", "overrides must be a table of dotted keys and values, "
                                      "e.g. {'hardware.num_gpus': 8}; got "
                                      f"{type(overrides).__name__}")], None)
    for dotted, value in plain_table(overrides, None).items():
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
