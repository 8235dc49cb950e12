"""The JSON Schema (draft 2020-12) of a spec file, built from the spec's attrs classes.

It describes a spec as TOML writes it (`tomllib.load`'s table), so that an editor or a
pipeline can check one without llmpar: every table and key, its type, its allowed
values (a `one_of` validator or a `Literal` is an `enum`; `positive`, `non_negative`,
`fraction` and `share_below_one` are bounds), its default, its unit (`x-unit`) and the
docstring written under the field (`description`). Keys that take a preset take its name
or a table (`preset = "..."`, or `file = "..."`, plus keys that override it); sizes and
rates take a number in base units or a string with its unit, and a bare number under a
GPU's floor is refused as the loader refuses it (`converter.BARE_FLOORS`).

The schema checks what one table says about itself; what the loader checks across tables
(a degree that divides the heads, degrees that multiply to the GPU count, an activation
model the session knows) and what a preset holds are left to `llmpar evaluate`. `docs/
reference/spec.schema.json` is the schema of llmpar's own strategies; `llmpar schema`
prints the installed one, with each plugin's `[parallel.<name>]` table.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar import units
from llmpar.dtypes import BYTES_PER_ELEMENT
from llmpar.loading.converter import BARE_FLOORS
from llmpar.loading.docstrings import field_sources
from llmpar.loading.loader import DEFAULT_OPTIMIZER, SECTIONS
from llmpar.placement import ORDER_KEY, RANK_ORDER, order_text
from llmpar.spec import SCHEMA_VERSION, Spec, validators
from llmpar.spec.framework import Framework
from llmpar.spec.hardware import Gpu
from llmpar.spec.inference import Engine
from llmpar.spec.model import Model
from llmpar.spec.optimizer import Optimizer
from llmpar.spec.quantities import ByteRate, Bytes, Count, FlopRate, MemorySize, Seconds
from llmpar.spec.search import RANGE_KEYS, GpuCounts

if TYPE_CHECKING:
    from llmpar.strategy import Strategy
    from llmpar.workload import Workload

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:llmpar:spec:{version}"
"""The schema's `$id`: a name for it, one per spec schema version (`version = 1`)."""

PRESET_KINDS: dict[type, str] = {Model: "models", Gpu: "gpus", Optimizer: "optimizers",
                                 Framework: "frameworks", Engine: "engines"}
"""Tables a preset may fill (`llmpar.loading.loader.resolve_preset`), and its folder."""

QUANTITY_UNITS: dict[Any, str] = {Bytes: "bytes", MemorySize: "bytes", FlopRate: "FLOP/s",
                                  ByteRate: "bytes/s", Seconds: "s"}
"""The quantity types that take a string with a unit, and their base unit."""
SUFFIX_UNITS = (("_bytes", "bytes"), ("_seconds", "s"), ("_tokens", "tokens"),
                ("_per_s", "1/s"))
"""Units of plain numbers, from the field's name."""

NUMBER_BOUNDS: dict[Any, dict[str, float]] = {
    validators.positive: {"exclusiveMinimum": 0},
    validators.non_negative: {"minimum": 0},
    validators.fraction: {"exclusiveMinimum": 0, "maximum": 1},
    validators.share_below_one: {"minimum": 0, "exclusiveMaximum": 1},
}
"""What the number validators of `llmpar.spec.validators` allow, as JSON Schema bounds."""


def _validators(validator: Any) -> list[Any]:
    """The single validators inside attrs' `and_` and `optional` wrappers."""
    if validator is None:
        return []
    inner = getattr(validator, "_validators", None)  # attrs' and_ (a list of validators)
    if inner is not None:
        return [item for part in inner for item in _validators(part)]
    wrapped = getattr(validator, "validator", None)  # attrs.validators.optional
    if wrapped is not None and type(validator).__name__ == "_OptionalValidator":
        return _validators(wrapped)
    return [validator]


def _bounds(field: attrs.Attribute[Any]) -> dict[str, Any]:
    """Bounds and choices the field's validators state (the others are left to llmpar)."""
    found: dict[str, Any] = {}
    for check in _validators(field.validator):
        if check in NUMBER_BOUNDS:
            found.update(NUMBER_BOUNDS[check])
        elif check is validators.dtype:
            found["enum"] = list(BYTES_PER_ELEMENT)
        elif hasattr(check, "choices"):  # validators.one_of
            found["enum"] = list(check.choices)
    return found


def _optional_parts(kind: Any) -> list[Any]:
    """The members of a union other than None (TOML has no null: None is an absent key)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [arg for arg in typing.get_args(kind) if arg is not type(None)]
    return [kind]


def _number_with_bounds(base: str, bounds: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": base, **{k: v for k, v in bounds.items() if k != "enum"}}


def _quantity(kind: Any, bounds: Mapping[str, Any]) -> dict[str, Any]:
    """A number in base units (at least the bare-number floor) or a string with a unit."""
    number = _number_with_bounds("integer" if kind in (Bytes, MemorySize) else "number",
                                 bounds)
    floor = BARE_FLOORS.get(kind)
    if floor is not None:
        if number.get("exclusiveMinimum") == 0 or number.get("minimum", -math.inf) > 0:
            number.pop("exclusiveMinimum", None)
            number["minimum"] = max(floor.floor, number.get("minimum", 0))
        else:
            number["anyOf"] = [{"const": 0}, {"minimum": floor.floor},
                               {"maximum": -floor.floor}]
    return {"anyOf": [number, {"type": "string", "pattern": units.QUANTITY_PATTERN}]}


class _Builder:
    """Schemas of types, with each attrs class once under `$defs`."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self.names: dict[type, str] = {}

    def name(self, cls: type) -> str:
        """`cls`'s key under `$defs`: its name, or its module's too where two share one
        (a plugin's `Config` beside another's)."""
        if cls not in self.names:
            taken = cls.__name__ in self.names.values()
            self.names[cls] = f"{cls.__module__}.{cls.__qualname__}" if taken else cls.__name__
        return self.names[cls]

    def type_schema(self, kind: Any, bounds: Mapping[str, Any]) -> dict[str, Any]:
        parts = _optional_parts(kind)
        if len(parts) > 1:
            return {"anyOf": [self.type_schema(part, bounds) for part in parts]}
        kind = parts[0]
        if attrs.has(kind):
            return self.table_ref(kind)
        if kind in QUANTITY_UNITS:
            return _quantity(kind, bounds)
        if kind is Count or kind is float:
            return _number_with_bounds("number", bounds)
        if kind is int:
            return _number_with_bounds("integer", bounds)
        if kind is bool:
            return {"type": "boolean"}
        if kind is str:
            return {"type": "string", **({"enum": bounds["enum"]} if "enum" in bounds else {})}
        if kind is Any:
            return {}
        if kind is GpuCounts:  # an array of counts, or a range table
            count = {"type": "integer", "minimum": 1}
            return {"anyOf": [{"type": "array", "items": count},
                              {"type": "object", "required": ["min", "max"],
                               "properties": {key: count for key in RANGE_KEYS},
                               "additionalProperties": False}]}
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin is typing.Literal:
            return {"type": "string", "enum": list(args)}
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": self.type_schema(args[0], bounds)}
        if origin is tuple:
            return {"type": "array", "prefixItems": [self.type_schema(a, bounds) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        if origin is dict and args[0] is str:
            return {"type": "object", "additionalProperties": self.type_schema(args[1], {})}
        raise TypeError(f"no JSON Schema for the field type {kind!r}")

    def table_ref(self, cls: type) -> dict[str, Any]:
        """A reference to `cls`'s table; a preset's name or a table where presets fill it."""
        name = self.name(cls)
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder, for tables that hold themselves
            self.defs[name] = self.table(cls)
        ref = {"$ref": f"#/$defs/{name}"}
        kind = PRESET_KINDS.get(cls)
        if kind is None:
            return ref
        return {"anyOf": [{"type": "string", "description":
                           f"a preset's name (llmpar presets {kind})"}, ref]}

    def table(self, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        docs = field_sources(cls)
        properties: dict[str, Any] = {}
        required = []
        for field in attrs.fields(attrs.resolve_types(cls)):
            if field.name in skip:
                continue
            properties[field.name] = self.field(field, docs[field.name].doc)
            if field.default is attrs.NOTHING:
                required.append(field.name)
        kind = PRESET_KINDS.get(cls)
        alternatives = []
        if kind is not None:
            properties["preset"] = {"type": "string", "description":
                                    f"Start from this preset (llmpar presets {kind}); the "
                                    "table's other keys override it."}
            properties["file"] = {"type": "string", "description":
                                  "Start from this TOML file (relative to the spec's "
                                  "folder); the table's other keys override it."}
            alternatives = [["preset"], ["file"]]
        schema: dict[str, Any] = {"type": "object", "title": cls.__qualname__,
                                  "description": _doc(cls), "properties": properties,
                                  "additionalProperties": False}
        if alternatives and required:
            schema["anyOf"] = [{"required": keys} for keys in [*alternatives, required]]
        elif required:
            schema["required"] = required
        return schema

    def field(self, field: attrs.Attribute[Any], doc: str) -> dict[str, Any]:
        schema = self.type_schema(field.type, _bounds(field))
        tables = [part for part in _optional_parts(field.type) if attrs.has(part)]
        doc = doc or (_doc(tables[0]) if tables else "")  # a table's own docstring
        described: dict[str, Any] = {"description": doc} if doc else {}
        unit = _unit(field)
        if unit:
            described["x-unit"] = unit
        default = _json_default(field.default)
        if default is not None:
            described["default"] = default
        return {**schema, **described}


def _doc(cls: type) -> str:
    return inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]


def _unit(field: attrs.Attribute[Any]) -> str:
    for part in _optional_parts(field.type):
        if part in QUANTITY_UNITS:
            return QUANTITY_UNITS[part]
    return next((unit for suffix, unit in SUFFIX_UNITS if field.name.endswith(suffix)), "")


def _json_default(default: Any) -> Any:
    """The default as JSON, or None where there is none to state (required, unset,
    derived from other keys, or a table's own defaults)."""
    if default is attrs.NOTHING or default is None:
        return None
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return None
        default = default.factory()
    if attrs.has(type(default)):
        return None
    if isinstance(default, tuple | list):
        return [_json_default(item) for item in default]
    if isinstance(default, dict):
        return {key: _json_default(value) for key, value in default.items()}
    if isinstance(default, float) and not math.isfinite(default):
        return None
    return default


def spec_json_schema(strategies: Mapping[str, Strategy[Any]],
                     workloads: Mapping[str, Workload[Any]] | None = None) -> dict[str, Any]:
    """The JSON Schema of a spec file whose `[parallel.<name>]` tables are `strategies`'
    and, where any are given, whose `[workload.<name>]` tables are `workloads'` (else
    `[workload]` is any table: what a workload plugin checks itself)."""
    builder = _Builder()
    docs = field_sources(Spec)
    fields = attrs.fields_dict(attrs.resolve_types(Spec))
    properties: dict[str, Any] = {}
    for section in SECTIONS:
        if section == "version":
            properties[section] = {"const": SCHEMA_VERSION, "default": SCHEMA_VERSION,
                                   "description": docs["version"].doc}
        elif section == "parallel":
            properties[section] = _parallel(builder, strategies)
        elif section == "workload" and workloads:
            properties[section] = _workloads(builder, workloads, docs[section].doc)
        else:
            properties[section] = builder.field(fields[section], docs[section].doc)
    properties["optimizer"]["default"] = DEFAULT_OPTIMIZER
    hardware = builder.defs["Hardware"]
    # A cluster preset fills the GPU; without one, [hardware] names it.
    hardware.pop("required", None)
    hardware["anyOf"] = [{"required": ["gpu"]}, {"required": ["cluster"]}]
    hardware["properties"]["cluster"]["description"] += (
        " A cluster preset's name (llmpar presets clusters): it fills this table, and "
        "keys given beside it override it.")
    if "Model" in builder.defs:
        model = builder.defs["Model"]
        model["properties"]["hf_config"] = {
            "type": "string", "description": "Fill the model from this Hugging Face "
            "config.json (relative to the spec's folder); keys given beside it win."}
        if "anyOf" in model:  # the keys a model table needs, which a config.json gives
            model["anyOf"].append({"required": ["hf_config"]})
    return {"$schema": DIALECT, "$id": SCHEMA_ID.format(version=SCHEMA_VERSION),
            "title": "llmpar spec", "description": _doc(Spec), "type": "object",
            "properties": properties, "required": ["model", "hardware"],
            "additionalProperties": False,
            "$defs": dict(sorted(builder.defs.items()))}


def _parallel(builder: _Builder, strategies: Mapping[str, Strategy[Any]]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, strategy in strategies.items():
        module = sys.modules[type(strategy).__module__]
        doc = " ".join(inspect.cleandoc(module.__doc__ or "").split("\n\n")[0].split())
        properties[name] = {**builder.table_ref(strategy.config_type), "description": doc}
    axes = {name: s.axis for name, s in strategies.items() if s.axis is not None}
    properties[ORDER_KEY] = {
        "type": "string", "default": order_text(RANK_ORDER, axes),
        "description": "Where ranks sit, innermost first, in Megatron-Core's names (tp, cp, "
                       "ep, dp, pp), e.g. \"tp-cp-ep-dp-pp\" (llmpar.placement)."}
    return {"type": "object", "description": "One table per strategy; an empty table turns "
            "a strategy on with its defaults.", "properties": properties,
            "additionalProperties": False}


def _workloads(builder: _Builder, workloads: Mapping[str, Workload[Any]],
               doc: str) -> dict[str, Any]:
    """`[workload]`: one table per installed workload, its config's schema."""
    properties: dict[str, Any] = {}
    for name, workload in workloads.items():
        module = sys.modules[type(workload).__module__]
        summary = " ".join(inspect.cleandoc(module.__doc__ or "").split("\n\n")[0].split())
        properties[name] = {**builder.table_ref(workload.config_type), "description": summary}
    return {"type": "object", "description": doc, "properties": properties,
            "additionalProperties": False, "default": {}}


def schema_text(strategies: Mapping[str, Strategy[Any]],
                workloads: Mapping[str, Workload[Any]] | None = None) -> str:
    """`spec_json_schema` as indented JSON, as `llmpar schema` prints it and
    docs/reference/spec.schema.json holds it."""
    return json.dumps(spec_json_schema(strategies, workloads), indent=2,
                      ensure_ascii=False) + "\n"
