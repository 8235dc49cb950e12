"""What a spec may hold, so that reading and planning one take bounded time and memory.

A spec is a few hundred values; the limits sit orders of magnitude above any real one and
far below what would make a read take seconds. Each limit, when crossed, is a `SpecError`
that names it; the spec reference lists them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmpar.errors import Problem, SpecError, join_path

MAX_FILE_BYTES = 1_048_576
"""The largest spec, preset or `config.json` file read (1 MiB)."""
MAX_NESTING_DEPTH = 32
"""Tables and arrays nested deeper than this are refused (a spec needs about 5)."""
MAX_VALUES = 20_000
"""Keys and array items in one spec, counted over every level."""
MAX_ARRAY_ITEMS = 10_000
"""Items in one array."""
MAX_KEY_CHARS = 200
"""Characters in one key."""
MAX_STAGES = 10_000
"""Pipeline stages in one plan: `Plan.stages` lists each, so its length is bounded (the
deepest published pipelines have 64 to 128)."""
MAX_LAYERS = 100_000
"""The most layers an imported configuration is read with (a config.json's
num_hidden_layers, a Megatron `--moe-layer-freq` list): far beyond any published model, few
enough that the per-layer lists the importers build and check stay small."""
MAX_MAGNITUDE = 1e30
"""The largest magnitude of a number in base units (bytes, FLOP/s, seconds, tokens...).
With every input within [1e-30, 1e30], a product of a handful of them stays far inside
a float64's range, so no plan holds an infinity or a NaN."""
MIN_MAGNITUDE = 1e-30
"""The smallest magnitude of a non-zero number in base units."""


def _exponent(number: float) -> str:
    return format(number, ".0e").replace("e+", "e")


def magnitude_problem(value: float | int) -> str | None:
    """Why a number lies outside [MIN_MAGNITUDE, MAX_MAGNITUDE] (zero passes), or None.
    Integers are compared exactly: one too large for a float is out of range, not an
    OverflowError."""
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            return f"must be at most {_exponent(MAX_MAGNITUDE)} in magnitude, got {_short(value)}"
        return None
    if not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    if abs(value) > MAX_MAGNITUDE:
        return f"must be at most {_exponent(MAX_MAGNITUDE)} in magnitude, got {value!r}"
    if value and abs(value) < MIN_MAGNITUDE:
        return f"must be 0 or at least {_exponent(MIN_MAGNITUDE)} in magnitude, got {value!r}"
    return None


def _short(value: int) -> str:
    digits = str(abs(value)) if value.bit_length() < 4000 else None
    if digits is None or len(digits) > 20:
        return f"an integer of about 2**{value.bit_length() - 1}"
    return str(value)


def read_text(path: Path, label: str) -> str:
    """A file's text, refusing what is not a regular file or is over MAX_FILE_BYTES
    before reading it; every failure is a SpecError attributed to `label`."""
    try:
        if not path.is_file():
            problem = "file not found" if not path.exists() else "not a file"
            raise SpecError([Problem("$", problem)], label)
        size_bytes = path.stat().st_size
        if size_bytes > MAX_FILE_BYTES:
            raise SpecError([Problem("$", f"the file is {size_bytes:,} bytes; llmpar reads "
                                          f"at most {MAX_FILE_BYTES:,} (1 MiB)")], label)
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError([Problem("$", f"cannot read the file: {exc.strerror or exc}")],
                        label) from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError([Problem("$", f"the file is over {MAX_FILE_BYTES:,} bytes (1 MiB)")],
                        label)
    try:
        return data.decode("utf-8-sig")  # a byte-order mark is not part of the text
    except UnicodeDecodeError as exc:
        raise SpecError([Problem("$", f"cannot read the file: not UTF-8 text ({exc.reason} at byte "
                                      f"{exc.start})")],
                        label) from None


def load_json(text: str, label: str | None) -> Any:
    """JSON text to Python values, with nesting beyond Python's reach a SpecError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError([Problem("$", f"not valid JSON: {exc}")], label) from None
    except RecursionError:
        raise SpecError([too_deep("$")], label) from None


def too_deep(path: str) -> Problem:
    """The problem of a table or array nested beyond MAX_NESTING_DEPTH."""
    return Problem(path, f"nested more than {MAX_NESTING_DEPTH} levels deep "
                         f"(llmpar's limit on tables and arrays)")


def plain_table(source: Mapping[Any, Any], label: str | None) -> dict[str, Any]:
    """A copy of a spec table as plain dicts and lists, checked against the limits above:
    string keys, depth, number of values, array length, key length. Iterative, so that
    no nesting reaches Python's recursion limit."""
    problems: list[Problem] = []
    root: dict[str, Any] = {}
    stack: list[tuple[Any, Any, str, int]] = [(source, root, "$", 1)]
    count = 0
    while stack and not problems:
        value, copy, path, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            problems.append(too_deep(path))
            break
        items = _items(value, path, problems)
        count += len(items)
        if count > MAX_VALUES:
            problems.append(Problem("$", f"more than {MAX_VALUES:,} keys and array items "
                                         "(llmpar's limit for one spec)"))
            break
        for key, item in items:
            where = join_path(path, key)
            child = _container_copy(item)
            if isinstance(copy, dict):
                copy[key] = item if child is None else child
            else:
                copy.append(item if child is None else child)
            if child is not None:
                stack.append((item, child, where, depth + 1))
    if problems:
        raise SpecError(problems, label)
    return root


def _container_copy(value: Any) -> dict[str, Any] | list[Any] | None:
    if isinstance(value, Mapping):
        return {}
    if isinstance(value, (list, tuple)):
        return []
    return None


def _items(value: Any, path: str, problems: list[Problem]) -> list[tuple[Any, Any]]:
    """A container's (key, value) pairs, with bad keys and long arrays as problems."""
    if not isinstance(value, Mapping):
        if len(value) > MAX_ARRAY_ITEMS:
            problems.append(Problem(path, f"an array of {len(value):,} items; llmpar's limit "
                                          f"is {MAX_ARRAY_ITEMS:,}"))
            return []
        return list(enumerate(value))
    pairs = list(value.items())
    for key, _ in pairs:
        if not isinstance(key, str):
            problems.append(Problem(path, f"keys must be strings, got {key!r} "
                                          f"({type(key).__name__})"))
        elif len(key) > MAX_KEY_CHARS:
            problems.append(Problem(path, f"a key of {len(key):,} characters; llmpar's "
                                          f"limit is {MAX_KEY_CHARS}"))
    return [] if problems else pairs
