"""A small JSON Schema (draft 2020-12) validator: the keywords the spec's schema uses
(llmpar.loading.json_schema), so that the tests check specs against it without the
`jsonschema` package. Where that package is installed, tests/test_spec_schema.py checks
that both agree.

Semantics follow the 2020-12 validation vocabulary: a number with a zero fractional part
is an integer; booleans are not numbers; `$ref` is a local JSON pointer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

KNOWN = {"$schema", "$id", "$defs", "$ref", "title", "description", "default", "x-unit",
         "type", "enum", "const", "properties", "additionalProperties", "required",
         "items", "prefixItems", "minItems", "maxItems", "minimum", "maximum",
         "exclusiveMinimum", "exclusiveMaximum", "pattern", "anyOf", "allOf", "not"}
"""Keywords this validator applies or knows to be annotations; any other is an error,
so that the schema cannot grow a keyword these tests would silently ignore."""


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return name == "number" or (name == "integer" and float(value).is_integer())


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return dict(node)


def errors(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None,
           path: str = "$") -> Iterator[str]:
    """Every way `value` breaks `schema`, each as "path: what"."""
    root = schema if root is None else root
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"keywords this validator does not know: {sorted(unknown)}")
    if "$ref" in schema:
        yield from errors(value, _resolve(root, schema["$ref"]), root, path)
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        yield f"{path}: expected {kind}, got {value!r}"
        return
    if "const" in schema and value != schema["const"]:
        yield f"{path}: expected {schema['const']!r}, got {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: expected one of {schema['enum']!r}, got {value!r}"
    if _is_type(value, "number"):
        for keyword, holds in (("minimum", lambda b: value >= b),
                               ("maximum", lambda b: value <= b),
                               ("exclusiveMinimum", lambda b: value > b),
                               ("exclusiveMaximum", lambda b: value < b)):
            if keyword in schema and not holds(schema[keyword]):
                yield f"{path}: {value!r} breaks {keyword} {schema[keyword]!r}"
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"],
                                                                         value):
        yield f"{path}: {value!r} does not match {schema['pattern']!r}"
    if isinstance(value, dict):
        yield from _object_errors(value, schema, root, path)
    if isinstance(value, list):
        yield from _array_errors(value, schema, root, path)
    for part in schema.get("allOf", []):
        yield from errors(value, part, root, path)
    if "anyOf" in schema:
        found = [list(errors(value, part, root, path)) for part in schema["anyOf"]]
        if all(found):
            yield f"{path}: matches none of anyOf: " + " | ".join("; ".join(f) for f in found)
    if "not" in schema and not list(errors(value, schema["not"], root, path)):
        yield f"{path}: matches the schema under not"


def _object_errors(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any],
                   path: str) -> Iterator[str]:
    properties = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            yield f"{path}.{key}: required"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            yield from errors(item, properties[key], root, f"{path}.{key}")
        elif extra is False:
            yield f"{path}.{key}: not allowed"
        elif isinstance(extra, dict):
            yield from errors(item, extra, root, f"{path}.{key}")


def _array_errors(value: list[Any], schema: dict[str, Any], root: dict[str, Any],
                  path: str) -> Iterator[str]:
    prefix = schema.get("prefixItems", [])
    for index, item in enumerate(value):
        if index < len(prefix):
            yield from errors(item, prefix[index], root, f"{path}[{index}]")
        elif "items" in schema:
            yield from errors(item, schema["items"], root, f"{path}[{index}]")
    if len(value) < schema.get("minItems", 0):
        yield f"{path}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        yield f"{path}: more than {schema['maxItems']} items"


def is_valid(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> bool:
    """Whether `value` meets `schema`: what `errors` finds, without building its
    messages (a fast first pass; `errors` says what is wrong)."""
    root = schema if root is None else root
    if "$ref" in schema and not is_valid(value, _resolve_cached(root, schema["$ref"]), root):
        return False
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", ())):
            return False
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = properties.get(key)
            if sub is not None:
                if not is_valid(item, sub, root):
                    return False
            elif extra is False or (isinstance(extra, dict) and not is_valid(item, extra, root)):
                return False
    elif isinstance(value, list):
        prefix = schema.get("prefixItems", ())
        items = schema.get("items")
        for index, item in enumerate(value):
            sub = prefix[index] if index < len(prefix) else items
            if sub is not None and not is_valid(item, sub, root):
                return False
    if "anyOf" in schema and not any(is_valid(value, part, root) for part in schema["anyOf"]):
        return False
    if "allOf" in schema and not all(is_valid(value, part, root) for part in schema["allOf"]):
        return False
    # bounds, patterns, item counts and `not` are left to `errors`
    return not (schema.keys() & _CHECKED_BY_ERRORS_ONLY) or not list(errors(value, schema, root))


_CHECKED_BY_ERRORS_ONLY = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                           "pattern", "minItems", "maxItems", "not"}
_RESOLVED: dict[tuple[int, str], tuple[dict[str, Any], dict[str, Any]]] = {}
"""Resolved references by (schema, reference), with the schema kept so its id stays its."""


def _resolve_cached(root: dict[str, Any], ref: str) -> dict[str, Any]:
    key = (id(root), ref)
    if key not in _RESOLVED or _RESOLVED[key][0] is not root:
        _RESOLVED[key] = (root, _resolve(root, ref))
    return _RESOLVED[key][1]
