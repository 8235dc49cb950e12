"""The JSON Schemas of a plan's and a search result's JSON: generated from the attrs
classes, shipped in the package as generated, printed by `llmpar schema --plan` and
`--search`, met by the outputs (tests/conftest.py checks every output a test makes; here
jsonschema agrees where installed), and agreeing with docs/json-schema.md's types."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import attrs
import pytest
from schema_validator import errors

import llmpar
from llmpar.cli.main import main
from llmpar.cli.output import OUTPUT_SCHEMA_VERSION
from llmpar.output_schema import (
    SCHEMA_NAMES,
    SEARCH_SCHEMA_VERSION,
    output_schema,
    schema_text,
    shipped_schema,
)
from llmpar.plan import PLAN_SCHEMA_VERSION, Plan
from llmpar.plan_json import KEYS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "specs" / "examples").glob("*.toml"))
DOC = ROOT / "docs" / "json-schema.md"


def as_json(data: object) -> object:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_the_package_ships_the_schema_the_classes_make(name):
    assert shipped_schema(name) == output_schema(name)


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_llmpar_schema_prints_it(name, capsys):
    assert main(["schema", f"--{name}"]) == 0
    assert capsys.readouterr().out == schema_text(name)


def test_schemas_are_versioned():
    assert output_schema("plan")["$id"] == f"urn:llmpar:plan:{PLAN_SCHEMA_VERSION}"
    assert output_schema("plan")["properties"]["schema_version"]["const"] == PLAN_SCHEMA_VERSION
    assert output_schema("search")["$id"] == f"urn:llmpar:search:{SEARCH_SCHEMA_VERSION}"
    assert SEARCH_SCHEMA_VERSION == OUTPUT_SCHEMA_VERSION  # what the command line writes


def test_a_plan_has_every_key_of_to_dict_and_no_other():
    schema = output_schema("plan")
    assert list(schema["properties"]) == [*KEYS, "llmpar_version"]
    assert schema["required"] == list(KEYS)
    assert schema["additionalProperties"] is False


def test_fields_bring_their_docstrings_and_units():
    schema = output_schema("plan")
    step = schema["$defs"]["TrainingPart"]["properties"]["hardware_flops_per_step"]
    assert "recomputation" in step["description"] and step["x-unit"] == "FLOP"
    assert schema["properties"]["capacity_bytes"]["x-unit"] == "bytes"
    search = output_schema("search")["$defs"]
    assert "Dollars per GPU-hour" in search["HardwareEntry"]["properties"]["gpu_hour_cost"][
        "description"]  # a field's docstring
    assert "GPU preset of the best layout" in search["HardwareEntry"]["properties"]["gpu"][
        "description"]  # a property's docstring


def test_a_changed_field_breaks_the_schema():
    plan = llmpar.evaluate(EXAMPLES[0]).to_dict()
    schema = output_schema("plan")
    assert list(errors(as_json(plan), schema)) == []
    assert list(errors(as_json({**plan, "new_key": 1}), schema)) == ["$.new_key: not allowed"]
    broken = as_json(plan)
    broken["training"]["mfu"] = "high"
    assert any("$.training.mfu" in e for e in errors(broken, schema))
    del broken["fits"]
    assert "$.fits: required" in list(errors(broken, schema))


def _jsonschema_agrees(value: object, name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = output_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    found = sorted(e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(value))
    assert found == [] and list(errors(value, schema)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_plan_meets_the_schema_in_jsonschema_too(path):
    _jsonschema_agrees(as_json(llmpar.evaluate(path).to_dict()), "plan")


@pytest.mark.parametrize("example, changes", [
    ("llama-3-8b-fsdp-8-h100", {"search.num_gpus": [8, 16]}),
    ("serve-llama-3.1-70b-fp8-vllm-4-h100", {}),
    ("llama-3-8b-fsdp-8-h100", {"search.hardware": ["dgx-h100", "dgx-b200"]}),
], ids=["training", "serving", "hardware"])
def test_every_kind_of_search_meets_the_schema(example, changes, capsys):
    argv = ["search", example, "--top", "2", "--format", "json"]
    argv += [arg for key, value in changes.items()
             for arg in ("--set", f"{key}={json.dumps(value)}")]
    assert main(argv) == 0
    _jsonschema_agrees(json.loads(capsys.readouterr().out), "search")


def test_the_command_lines_plan_json_meets_the_schema(capsys):
    assert main(["evaluate", "inference-llama-2-70b-h100", "--format", "json"]) == 0
    _jsonschema_agrees(json.loads(capsys.readouterr().out), "plan")


# --- docs/json-schema.md says what the schema says -------------------------------------

def _words(schema: dict[str, object]) -> str:
    """A property's type as docs/json-schema.md's type column writes it."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "const" in schema:
        return type(schema["const"]).__name__.replace("int", "integer")
    if "anyOf" in schema:
        parts = [_words(part) for part in schema["anyOf"]]  # type: ignore[attr-defined]
        if "number" in parts and "integer" in parts:
            parts.remove("integer")  # an integer is a number
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    kind = schema.get("type")
    if kind == "array":
        inner = _words(schema["items"])  # type: ignore[arg-type]
        return "array of " + {"string": "strings", "number": "numbers"}.get(inner, inner)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "object: string -> " + _words(schema["additionalProperties"])  # type: ignore
    return str(kind)


def _documented_types() -> dict[str, dict[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    found = {}
    for section in re.finditer(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \|", section.group(2), re.M)
        found[section.group(1)] = {key: kind.strip() for key, kind in rows}
    return found


def test_docs_json_schema_page_states_the_schemas_types():
    schema = output_schema("plan")
    records = {"Plan": schema, **schema["$defs"]}
    documented = _documented_types()
    assert set(documented) == set(records)
    for name, rows in documented.items():
        properties = {k: v for k, v in records[name]["properties"].items()
                      if k != "llmpar_version"}
        assert set(rows) == set(properties), name
        wrong = {key: (kind, _words(properties[key])) for key, kind in rows.items()
                 if kind != _words(properties[key])}
        assert wrong == {}, f"docs/json-schema.md ## {name}: (page, schema) {wrong}"


def test_every_plan_record_class_is_in_the_schema():
    found = [Plan]
    for cls in found:
        for hint in typing.get_type_hints(cls).values():
            found += [arg for arg in _classes(hint) if arg not in found]
    assert {cls.__name__ for cls in found} == {"Plan", *output_schema("plan")["$defs"]}


def _classes(hint: object) -> list[type]:
    if isinstance(hint, type) and attrs.has(hint):
        return [hint]
    return [cls for arg in typing.get_args(hint) for cls in _classes(arg)]
