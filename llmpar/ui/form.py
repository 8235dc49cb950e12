"""The page's form, generated from the spec's JSON Schema (`llmpar.loading.json_schema`,
the one `llmpar schema` prints, with the session's plugin strategies' tables): one
field per key and one collapsible table per table, at every depth, each with its type,
unit (`x-unit`), choices (`enum`, the catalog's presets where a preset fills the table,
true/false), default and docstring. The page's script only draws these nodes.

The form also reads values: what a field sends is text (or null, to remove its key),
parsed here as `--set` parses it (a TOML value, else a string; a string-only key keeps
the text as typed), so "80 GB" reaches the loader as a size with its unit, as in a spec
file. And it places problems: a `SpecError` path belongs to the deepest form key on it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import attrs

from llmpar.loading.dump import toml_text
from llmpar.loading.json_schema import PRESET_KINDS
from llmpar.loading.reader import parse_override

TABLE_PRESETS = {cls.__name__: kind for cls, kind in PRESET_KINDS.items()}
"""`$defs` names of the tables a preset may fill, and the preset kind of their menus."""
KEY_PRESETS = {"hardware.cluster": "clusters"}
"""Keys (not tables) that name a preset: a cluster fills `[hardware]`
(`llmpar.loading.loader`)."""
FILE_KEYS = ("file", "hf_config")
"""Keys that name a file the loader would read: the page has no field for them."""
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
"""A TOML key that needs no quotes (TOML 1.0, "Keys")."""
QUANTITY_HINT = "a number in base units, or with its unit as in a spec file (\"80 GB\")"
TOML_HINT = "a TOML value, as in a spec file"


@attrs.frozen(kw_only=True)
class FormField:
    """One key of the spec, as the page shows it."""

    key: str
    """Dotted key path (`parallel.tensor.degree`)."""
    type: str
    """"integer", "number", "boolean", "string", "quantity" (a number or a string with a
    unit), "preset" (a preset's name, or a table under `key`), or "toml" (an array, a
    table or a mix of types, typed as a TOML value)."""
    description: str = ""
    unit: str = ""
    """`x-unit` of the schema: of a bare number (a quantity also takes its own)."""
    choices: tuple[str, ...] = ()
    """A menu: the enum, a preset kind's names, or true/false."""
    default: str | None = None
    """The schema's default as the field would show it (None: none stated)."""
    preset: str = ""
    """The preset kind ("models", "gpus", ...) whose names the menu lists."""
    hint: str = ""
    """How to type the value, where the type alone does not say."""


@attrs.frozen(kw_only=True)
class FormTable:
    """A table of the spec: collapsible, its keys inside."""

    key: str
    description: str = ""
    children: tuple[FormField | FormTable, ...] = ()
    preset: str = ""
    """Where a preset may fill the table: its kind; the table then follows the menu of
    its `key` (a FormField of type "preset") and holds the keys that override it."""


Node = FormField | FormTable


def value_text(value: Any) -> str:
    """A value as its field shows it: a string as it is, anything else as an inline TOML
    value (which `parse_value` reads back)."""
    return value if isinstance(value, str) else _inline(value)


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        items = ", ".join(f"{_inline_key(str(k))} = {_inline(v)}" for k, v in value.items()
                          if v is not None)
        return f"{{ {items} }}" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_inline(item) for item in value if item is not None) + "]"
    if isinstance(value, float) and math.isfinite(value) and value != 0 and (
            abs(value) >= 1e6 or abs(value) < 1e-3):
        # 15e12 as `1.5e+13`, not `15000000000000.0`: the shortest digits that read back
        # to the same float (Python's repr), in TOML's exponent form.
        text = str(Decimal(repr(value)).normalize()).lower()
        return text if "." in text or "e" in text else f"{text}.0"
    return toml_text({"v": value}).removeprefix("v = ").strip()


def _inline_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else _inline(key)


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> tuple[str, Mapping[str,
                                                                                      Any]]:
    """The `$defs` name (or "") and the schema behind a `$ref`."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return name, {**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
    return "", schema


def _alternatives(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = schema.get("anyOf")
    return list(parts) if isinstance(parts, list) else [schema]


def _field_type(schema: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The field's type and menu, from its schema."""
    parts = _alternatives(schema)
    types = [part.get("type") for part in parts]
    if len(parts) == 2 and types[1] == "string" and "pattern" in parts[1] and types[0] in (
            "integer", "number"):
        return "quantity", ()
    if len(parts) == 1:
        kind = types[0]
        if kind == "boolean":
            return "boolean", ("true", "false")
        if kind in ("integer", "number", "string"):
            enum = parts[0].get("enum")
            return str(kind), tuple(str(item) for item in enum) if enum else ()
    return "toml", ()


def _node(key: str, schema: Mapping[str, Any], defs: Mapping[str, Any],
          presets: Mapping[str, tuple[str, ...]], seen: tuple[str, ...]) -> list[Node]:
    """The form's nodes for `key`: a field, a table, or a preset's menu and its table."""
    description = str(schema.get("description", ""))
    default = schema.get("default")
    shown_default = None if default is None or default == {} else value_text(default)
    refs = [_resolve(part, defs) for part in _alternatives(schema) if "$ref" in part]
    if refs and refs[0][0] not in seen:
        name, table = refs[0]
        kind = TABLE_PRESETS.get(name, "")
        children = tuple(node for child, sub in table.get("properties", {}).items()
                         if child not in (*FILE_KEYS, "preset")
                         for node in _node(f"{key}.{child}", sub, defs, presets,
                                           (*seen, name)))
        body = FormTable(key=key, description=description or str(table.get("description",
                                                                            "")),
                         children=children, preset=kind)
        if not kind:
            return [body]
        menu = FormField(key=key, type="preset", description=description, preset=kind,
                         choices=presets.get(kind, ()), default=shown_default)
        return [menu, body]
    if schema.get("type") == "object" and "properties" in schema:
        children = tuple(node for child, sub in schema["properties"].items()
                         for node in _node(f"{key}.{child}", sub, defs, presets, seen))
        return [FormTable(key=key, description=description, children=children)]
    kind, choices = _field_type(schema)
    preset = KEY_PRESETS.get(key, "")
    if preset:
        kind, choices = "preset", presets.get(preset, ())
    hint = {"quantity": QUANTITY_HINT, "toml": TOML_HINT}.get(kind, "")
    return [FormField(key=key, type=kind, description=description,
                      unit=str(schema.get("x-unit", "")), choices=choices,
                      default=shown_default, preset=preset, hint=hint)]


def spec_form(schema: Mapping[str, Any], presets: Mapping[str, tuple[str, ...]]
              ) -> tuple[Node, ...]:
    """The form of a spec whose JSON Schema is `schema`; menus of presets from `presets`
    (names by kind, `Presets.names`)."""
    defs = schema.get("$defs", {})
    return tuple(node for key, sub in schema["properties"].items() if key != "version"
                 for node in _node(key, sub, defs, presets, ()))


def walk(nodes: tuple[Node, ...]) -> Iterator[Node]:
    """Every node, depth first, tables before their keys."""
    for node in nodes:
        yield node
        if isinstance(node, FormTable):
            yield from walk(node.children)


def form_data(nodes: tuple[Node, ...]) -> list[dict[str, Any]]:
    """The nodes as the page receives them (JSON), each with its `node` kind."""
    return [{"node": "table", **attrs.asdict(node, recurse=False),
             "children": form_data(node.children)} if isinstance(node, FormTable)
            else {"node": "field", **attrs.asdict(node)} for node in nodes]


def fields_by_key(nodes: tuple[Node, ...]) -> dict[str, FormField]:
    return {node.key: node for node in walk(nodes) if isinstance(node, FormField)}


def parse_value(field: FormField, value: Any) -> Any:
    """What a field's text means in the spec: a string-only key keeps the text, others
    read it as `llmpar evaluate --set` does (a TOML value, else a string). A value that
    is not text (the page's JSON) is taken as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if field.type in ("string", "preset"):
        return text
    return parse_override(f"{field.key}={text}")[1]


def lookup(table: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key (None: not there); a preset's name where the table
    names one (`model = "x"` or `[model] preset = "x"`)."""
    node: Any = table
    for part in key.split("."):
        if isinstance(node, str):
            return None  # below a preset's name: the preset's keys, not the spec's
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def field_texts(table: Mapping[str, Any], fields: Mapping[str, FormField], *,
                resolved: bool = False) -> dict[str, str]:
    """Each field's text in `table`, for the fields it gives; in a `resolved` table
    (`spec_to_dict`: presets filled in), a preset's field shows the table's name."""
    found: dict[str, str] = {}
    for key, field in fields.items():
        value = lookup(table, key)
        if field.type == "preset" and isinstance(value, Mapping):
            value = value.get("name" if resolved else "preset")
        if value is not None and not (field.type == "preset" and isinstance(value, Mapping)):
            found[key] = value_text(value)
    return found


def problem_key(path: str, keys: Mapping[str, Any]) -> str | None:
    """The deepest form key on a problem's path (`$.parallel.tensor.degree` ->
    `parallel.tensor.degree`; `$.search.values[0]` -> `search.values`), or None."""
    dotted = path.removeprefix("$").removeprefix(".").split("[", 1)[0]
    parts = dotted.split(".") if dotted else []
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in keys:
            return key
    return None
