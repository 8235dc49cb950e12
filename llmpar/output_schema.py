"""The JSON Schema (draft 2020-12) of a Plan's and of a search result's JSON, built from
their attrs classes.

A record's keys are its attrs fields as cattrs writes them (`Plan.to_dict()`), with each
field's type and the docstring written under it; a search record's `to_dict()` also writes
properties and a few values of its parts, listed here by record (`SEARCH_KEYS`) with the
property's return type and docstring, or the type stated here. Every record's keys are
required and no other key is allowed, so a field added to a class without its schema, or
to the JSON without its class, fails the tests that check every output against it
(tests/conftest.py). The command line's JSON adds `llmpar_version` (and a search's
`schema_version`), which the schema allows at the top.

`llmpar schema --plan` and `--search` print the schemas; docs/generate.py writes them to
docs/reference/ and into the package (`llmpar/schemas/`, read by `shipped_schema`).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from importlib import resources
from typing import Any

import attrs

from llmpar.loading.docstrings import field_sources

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SEARCH_SCHEMA_VERSION = 1
"""Version of the search result's JSON (`llmpar search --format json` writes it as
`schema_version`); raised when a key is renamed, removed or changes meaning."""
SCHEMA_NAMES = ("plan", "search")
"""The output schemas, as `llmpar schema --plan` / `--search` name them."""
SUFFIX_UNITS = (("_bytes", "bytes"), ("_seconds", "s"), ("_flops", "FLOP"),
                ("_flops_per_step", "FLOP"), ("flops_per_step_6nd", "FLOP"),
                ("_per_s", "1/s"), ("_tokens", "tokens"), ("_hours", "GPU-hours"))
"""Units of numbers, from the key's name (`x-unit`)."""


class Extra(typing.NamedTuple):
    """A key of a record's JSON that is no field or property of its class."""

    kind: Any
    doc: str


def _search_keys() -> dict[type, dict[str, str | Extra]]:
    """Each search record's JSON keys, in `to_dict()`'s order: the attribute of the class
    it holds (a field or property), or its type and meaning."""
    from llmpar.plan import Plan
    from llmpar.search.hardware import HardwareEntry, HardwareSearchResult
    from llmpar.search.result import GpuCount, GpusPoint, ParetoPoint, Ranked, SearchResult
    from llmpar.search.serving import ServingCandidate, ServingCount, ServingSearchResult

    def same(*names: str) -> dict[str, str | Extra]:
        return {name: name for name in names}

    gpus = Extra(int, "GPUs of the layout.")
    total = Extra(int, "The plan's total_bytes: memory of its busiest GPU.")
    step = Extra(float | None, "The plan's step_seconds.")
    return {
        SearchResult: {**same("objective", "considered", "evaluated",
                              "ranked", "rejected"),
                       "rejection_examples": "examples",
                       **same("seconds", "warnings", "results", "pareto",
                              "gpu_counts", "gpus_pareto")},
        Ranked: {"rank": "rank", "num_gpus": gpus, "layout": "layout", "choices": "choices",
                 "objective": "objective", "total_bytes": total, "step_seconds": step,
                 "plan": Extra(Plan, "The layout's Plan, as `llmpar evaluate` prints it.")},
        ParetoPoint: {**same("layout", "choices", "total_bytes",
                             "step_seconds"), "num_gpus": gpus},
        GpuCount: same(*(f.name for f in attrs.fields(GpuCount))),
        GpusPoint: same("num_gpus", "layout", "choices", "total_bytes",
                        "step_seconds", "cost"),
        ServingSearchResult: same("objective", "tried", "rejected",
                                  "limits", "results", "gpu_counts", "gpus_pareto"),
        ServingCandidate: same("layout", "score", "ttft_seconds",
                               "tpot_seconds", "tokens_per_second_per_gpu", "total_bytes",
                               "num_gpus", "replicas", "request_rate_per_s",
                               "max_request_rate_per_s"),
        ServingCount: same("num_gpus", "tried", "kept"),
        HardwareSearchResult: {"objective": "objective", "serving": "serving",
                               "best_hardware": Extra(str | None, "The first entry's name "
                                                      "when a layout fits on it, else null."),
                               "seconds": "seconds", "hardware": "entries"},
        HardwareEntry: {"hardware": "name", "kind": "kind", "gpu": "gpu",
                        "gpu_hour_cost": "gpu_hour_cost",
                        "cost_per_million_tokens": "cost_per_million_tokens",
                        "best": "best", "search": "result"},
    }


def _optional_parts(kind: Any) -> list[Any]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return list(typing.get_args(kind))
    return [kind]


def _unit(name: str) -> str:
    return next((unit for suffix, unit in SUFFIX_UNITS if name.endswith(suffix)), "")


def _doc(cls: type) -> str:
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())


class _Builder:
    """Schemas of output types, each record once under `$defs`."""

    def __init__(self, keys: dict[type, dict[str, str | Extra]]) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self.keys = keys

    def type_schema(self, kind: Any) -> dict[str, Any]:
        parts = _optional_parts(kind)
        if len(parts) > 1:
            return {"anyOf": [self.type_schema(part) for part in parts]}
        kind = parts[0]
        if kind is type(None) or kind is None:
            return {"type": "null"}
        if attrs.has(kind):
            return self.ref(kind)
        simple = {int: "integer", float: "number", str: "string", bool: "boolean"}
        if kind in simple:
            return {"type": simple[kind]}
        if kind is Any:
            return {}
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin in (tuple, list) and (len(args) == 1 or args[-1] is Ellipsis):
            return {"type": "array", "items": self.type_schema(args[0])}
        if origin is tuple:
            return {"type": "array", "prefixItems": [self.type_schema(a) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.type_schema(args[1])}
        raise TypeError(f"no JSON Schema for the output type {kind!r}")

    def ref(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder while its fields are built
            self.defs[name] = self.record(cls)
        return {"$ref": f"#/$defs/{name}"}

    def record(self, cls: type) -> dict[str, Any]:
        from llmpar.plan import Plan

        if cls is Plan:
            properties = _plan_properties(self)
        elif cls in self.keys:
            properties = {key: self.member(cls, key, source)
                          for key, source in self.keys[cls].items()}
        else:
            hints = typing.get_type_hints(cls)
            docs = field_sources(cls)
            properties = {f.name: self.described(hints[f.name], docs[f.name].doc, f.name)
                          for f in attrs.fields(cls)}
        return {"type": "object", "title": cls.__name__, "description": _doc(cls),
                "properties": properties, "required": list(properties),
                "additionalProperties": False}

    def member(self, cls: type, key: str, source: str | Extra) -> dict[str, Any]:
        """A search record's key: its field's or property's type and docstring."""
        if isinstance(source, Extra):
            return self.described(source.kind, source.doc, key)
        fields = attrs.fields_dict(cls)
        if source in fields:
            doc = field_sources(cls)[source].doc
            return self.described(typing.get_type_hints(cls)[source], doc, key)
        prop = inspect.getattr_static(cls, source)
        if not isinstance(prop, property) or prop.fget is None:
            raise TypeError(f"{cls.__name__}.{source} is no field or property")
        kind = typing.get_type_hints(prop.fget)["return"]
        return self.described(kind, inspect.cleandoc(prop.fget.__doc__ or ""), key)

    def described(self, kind: Any, doc: str, name: str) -> dict[str, Any]:
        schema = self.type_schema(kind)
        tables = [part for part in _optional_parts(kind) if attrs.has(part)]
        doc = doc or (_doc(tables[0]) if tables else "")
        if doc:
            schema["description"] = " ".join(doc.split())
        unit = _unit(name)
        if unit and not tables:
            schema["x-unit"] = unit
        return schema


def _plan_properties(builder: _Builder) -> dict[str, Any]:
    """A Plan's keys (`llmpar.plan_json.KEYS`): its fields, and schema 1's flat keys with
    the type their descriptor declares and the docstring of the part's field behind them."""
    from llmpar.plan import PLAN_SCHEMA_VERSION, Plan, ServingPool, TrainingPart
    from llmpar.plan_json import KEYS

    hints, docs = typing.get_type_hints(Plan), field_sources(Plan)
    part_docs = {TrainingPart: field_sources(TrainingPart), ServingPool: field_sources(ServingPool)}
    properties: dict[str, Any] = {}
    for key in KEYS:
        if key == "schema_version":
            properties[key] = {"const": PLAN_SCHEMA_VERSION, "description": inspect.cleandoc(
                "Version of the plan's field names and meanings.")}
        elif key in hints and key in docs:
            properties[key] = builder.described(hints[key], docs[key].doc, key)
        else:
            descriptor = Plan.__dict__[key]
            (kind,) = typing.get_args(descriptor.__orig_class__)
            doc = ""
            for part, spelled in ((TrainingPart, descriptor.training),
                                  (ServingPool, descriptor.serving)):
                if isinstance(spelled, str) and not doc:
                    doc = part_docs[part][spelled].doc
            properties[key] = builder.described(kind, doc or "Schema 1's flat key.", key)
    return properties


VERSIONS = {"llmpar_version": {"type": "string", "description":
                               "The version of llmpar that wrote it (the command line's "
                               "JSON)."}}


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of `Plan.to_dict()` (and of `llmpar evaluate --format json`)."""
    from llmpar.plan import PLAN_SCHEMA_VERSION, Plan

    builder = _Builder({})
    builder.ref(Plan)
    plan = builder.defs.pop("Plan")
    plan["properties"] = {**plan["properties"], **VERSIONS}
    return {"$schema": DIALECT, "$id": f"urn:llmpar:plan:{PLAN_SCHEMA_VERSION}",
            "title": "llmpar plan", **{k: v for k, v in plan.items() if k != "title"},
            "$defs": dict(sorted(builder.defs.items()))}


def search_json_schema() -> dict[str, Any]:
    """The JSON Schema of a search result's `to_dict()`, of the three kinds `llmpar search
    --format json` prints (a training search, a serving search, a hardware comparison)."""
    from llmpar.search.hardware import HardwareSearchResult
    from llmpar.search.result import SearchResult
    from llmpar.search.serving import ServingSearchResult

    builder = _Builder(_search_keys())
    tops = [builder.ref(cls) for cls in (SearchResult, ServingSearchResult,
                                         HardwareSearchResult)]
    version = {"schema_version": {"const": SEARCH_SCHEMA_VERSION, "description":
                                  "Version of the search result's keys and meanings (the "
                                  "command line's JSON)."}, **VERSIONS}
    for cls in (SearchResult, ServingSearchResult, HardwareSearchResult):
        builder.defs[cls.__name__]["properties"].update(version)
    return {"$schema": DIALECT, "$id": f"urn:llmpar:search:{SEARCH_SCHEMA_VERSION}",
            "title": "llmpar search result",
            "description": "A training search (SearchResult), a serving search "
                           "(ServingSearchResult) or a comparison of machines "
                           "(HardwareSearchResult).",
            "anyOf": tops, "$defs": dict(sorted(builder.defs.items()))}


def output_schema(name: str) -> dict[str, Any]:
    """The schema `name` ("plan" or "search")."""
    if name == "plan":
        return plan_json_schema()
    if name == "search":
        return search_json_schema()
    raise ValueError(f"no output schema {name!r}; one of {SCHEMA_NAMES}")


def schema_text(name: str) -> str:
    """`output_schema(name)` as indented JSON, as `llmpar schema --plan` prints it and
    docs/reference/<name>.schema.json and the package hold it."""
    return json.dumps(output_schema(name), indent=2, ensure_ascii=False) + "\n"


def shipped_schema(name: str) -> dict[str, Any]:
    """The schema `name` as the package ships it (`llmpar/schemas/<name>.schema.json`),
    without building it from the classes."""
    text = resources.files("llmpar").joinpath("schemas", f"{name}.schema.json").read_text(
        encoding="utf-8")
    found: dict[str, Any] = json.loads(text)
    return found
