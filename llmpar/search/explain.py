"""What a field of a search result's JSON means: `explain_search(result, "results[0].objective")`.

A path into a layout's plan (`results[0].plan.training.mfu`, `hardware[1].best.plan...`)
is that plan's own explanation (`Plan.explain`: its recorded derivation, or how the field
relates to the plan's others). Any other field is answered with its value and the meaning
the search result's JSON Schema gives it (`llmpar.output_schema`, from the result classes'
field and property docstrings), so every leaf of `to_dict()` has an answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from llmpar.plan_explain import Path, format_path, parse_path


class SearchJson(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def explain_search(result: SearchJson, text: str, *, data: Mapping[str, Any] | None = None,
                   schema: dict[str, Any] | None = None) -> str:
    """The field `text` of `result.to_dict()` explained; KeyError when it has no such
    field. `data` (the result's `to_dict()`) and `schema` (`output_schema("search")`)
    spare making them again when many fields are explained."""
    from llmpar.output_schema import output_schema
    from llmpar.plan import Plan

    path = parse_path(text)
    whole = result.to_dict() if data is None else data
    data = whole
    for index, token in enumerate(path):
        data = _step(data, token, path)
        if token == "plan" and isinstance(data, Mapping) and index + 1 < len(path):
            return Plan.from_dict(data).explain(format_path(path[index + 1:]))
    meaning = _meaning(output_schema("search") if schema is None else schema, whole, path)
    return f"{text} = {data!r}\n  meaning: {meaning}"


def _step(data: Any, token: str | int, path: Path) -> Any:
    if isinstance(token, int):
        if not isinstance(data, list) or not 0 <= token < len(data):
            raise KeyError(format_path(path))
        return data[token]
    if not isinstance(data, Mapping) or token not in data:
        raise KeyError(format_path(path))
    return data[token]


def _meaning(root: dict[str, Any], data: Any, path: Path) -> str:
    """The description of the deepest schema node on `path` that has one."""
    node = _branch(root, root, data)
    found = ""
    for token in path:
        node = _branch(root, node, data)
        if isinstance(token, int):
            node = _resolved(root, node.get("items", {}))
        else:
            child = node.get("properties", {}).get(token)
            if child is None and isinstance(node.get("additionalProperties"), dict):
                child = node["additionalProperties"]
            node = child if isinstance(child, dict) else {}
            found = node.get("description", found)
        data = data[token]
    return found or "(no meaning recorded)"


def _branch(root: dict[str, Any], node: dict[str, Any], value: Any) -> dict[str, Any]:
    """`node` resolved, and of an anyOf the branch `value` takes (an object's by its keys)."""
    node = _resolved(root, node)
    if "anyOf" not in node:
        return node
    for part in node["anyOf"]:
        branch = _branch(root, part, value)
        kind = branch.get("type")
        if isinstance(value, Mapping) and kind == "object" and set(value) <= set(
                branch.get("properties", {})) | ({*value} if branch.get(
                    "additionalProperties") not in (None, False) else set()):
            return {**branch, **{k: v for k, v in node.items() if k == "description"}}
        if isinstance(value, list) and kind == "array":
            return branch
    return node


def _resolved(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node
