"""The docstrings written under attrs fields, read from the source.

attrs keeps no field docstrings at run time, so the string literal right after each
annotated field is read with `ast`. The generated spec reference (docs/generate.py) and
the spec's JSON Schema (`llmpar.loading.json_schema`) both describe a field with it.
"""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path
from typing import NamedTuple


class FieldSource(NamedTuple):
    """What the source says about one attrs field: its annotation, the `attrs.field(...)`
    call (or plain default) and the string literal right after it."""

    annotation: ast.expr
    value: ast.expr | None
    doc: str


@functools.cache
def parsed(path: str) -> ast.Module:
    """The module at `path`, parsed (once)."""
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def field_sources(cls: type) -> dict[str, FieldSource]:
    """Annotated fields of `cls` as its source file writes them, with their docstrings."""
    path = inspect.getsourcefile(cls)
    if path is None:
        raise ValueError(f"no source file for {cls.__qualname__}")
    node = next(n for n in ast.walk(parsed(path))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    found = {}
    for index, statement in enumerate(node.body):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        after = node.body[index + 1] if index + 1 < len(node.body) else None
        doc = ""
        if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            doc = inspect.cleandoc(after.value.value)
        found[statement.target.id] = FieldSource(statement.annotation, statement.value, doc)
    return found
