"""The JSON report of a Plan: `plan.to_dict()`, documented in docs/json-schema.md."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.plan import Plan


def json_report(plan: Plan) -> str:
    """The plan as indented JSON; `schema_version` names the field set (the command
    line adds `llmpar_version`: `llmpar.cli.output`)."""
    return strict_json(plan.to_dict())


@functools.cache
def llmpar_version() -> str:
    """The installed distribution's version (a source tree without metadata: unknown)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmpar")
    except PackageNotFoundError:
        return "unknown (not installed)"


def strict_json(value: Any) -> str:
    """Indented JSON that any JSON reader accepts: a NaN or an infinity, which JSON has no
    words for, is a SpecError naming where it is instead of a `NaN` in the output."""
    try:
        return json.dumps(value, indent=2, allow_nan=False)
    except ValueError:
        where = ", ".join(path for path, _ in _non_finite(value, "$"))
        raise SpecError([Problem(where or "$", "not a finite number; a value in the spec is "
                                               "out of the range llmpar plans for")]) from None


def _non_finite(value: Any, path: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, float) and not math.isfinite(value):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{index}]")
