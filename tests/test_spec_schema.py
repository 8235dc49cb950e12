"""The spec's JSON Schema (llmpar.loading.json_schema, docs/reference/spec.schema.json,
`llmpar schema`) accepts every spec llmpar ships and every spec the Hypothesis strategies
draw, refuses what the loader refuses within one table, and says for each key what the
spec reference says."""

from __future__ import annotations

import json
import tomllib
import typing
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from schema_validator import errors

import llmpar
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.loading.json_schema import PRESET_KINDS, spec_json_schema
from llmpar.testing.specs import parallel_training_specs, training_specs

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
EXAMPLES = sorted((SPECS / "examples").glob("*.toml"))

SESSION = llmpar.Session(load_entry_points=False)
SCHEMA = spec_json_schema(SESSION.strategies)


def _problems(table: object, schema: dict = SCHEMA) -> list[str]:
    found = list(errors(table, schema, SCHEMA))
    try:  # the reference implementation, where it is installed, agrees
        import jsonschema
    except ImportError:
        return found
    validator = jsonschema.Draft202012Validator(
        schema if schema is SCHEMA else {**schema, "$defs": SCHEMA["$defs"]})
    assert validator.is_valid(table) == (not found), found
    return found


def test_the_schema_is_a_draft_2020_12_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_committed_schema_is_what_llmpar_schema_prints(capsys):
    assert main(["schema", "--builtin"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == SCHEMA
    committed = ROOT / "docs" / "reference" / "spec.schema.json"
    if committed.is_file():  # an sdist ships no docs; tests/test_docs.py checks it's fresh
        assert committed.read_text(encoding="utf-8") == printed


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_shipped_example_validates(path):
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    assert _problems(table) == []


def _presets() -> list[tuple[type, Path]]:
    return [(cls, path) for cls, kind in PRESET_KINDS.items()
            for path in sorted((SPECS / kind).glob("*.toml"))]


@pytest.mark.parametrize(("cls", "path"), _presets(), ids=lambda x: getattr(x, "stem", ""))
def test_every_preset_validates_as_its_table(cls, path):
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    table.setdefault("name", path.stem)  # as the catalogue reads a preset
    assert _problems(table, {"$ref": f"#/$defs/{cls.__name__}"}) == []


@settings(max_examples=25)
@given(spec=training_specs() | parallel_training_specs())
def test_drawn_specs_validate(spec):
    assert _problems(spec) == []


BASE = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8}}


@pytest.mark.parametrize(("change", "where"), [
    ({"trainig": {}}, "$.trainig"),
    ({"training": {"recompute": "partial"}}, "$.training.recompute"),
    ({"training": {"mfu": 1.5}}, "$.training.mfu"),
    ({"training": {"micro_batch_size": 0}}, "$.training.micro_batch_size"),
    ({"training": {"sequence_length": "8k"}}, "$.training.sequence_length"),
    ({"hardware": {"gpu": {"preset": "h100-sxm", "memory_bytes": 80}}},
     "$.hardware.gpu"),
    ({"hardware": {"gpu": "h100-sxm", "inter_node_bandwidth_bytes_per_s": "fast"}},
     "$.hardware.inter_node_bandwidth_bytes_per_s"),
    ({"hardware": {"num_gpus": 8}}, "$.hardware"),
    ({"parallel": {"tensr": {"degree": 2}}}, "$.parallel.tensr"),
    ({"parallel": {"pipeline": {"schedule": "1f1b", "degre": 2}}}, "$.parallel.pipeline.degre"),
    ({"model": {"preset": "llama-3-8b", "num_layers": 2.5}}, "$.model"),
    ({"version": 2}, "$.version"),
])
def test_what_the_loader_refuses_in_one_table_the_schema_refuses(change, where):
    table = {**BASE, **change}
    found = _problems(table)
    assert any(problem.startswith(where) for problem in found), found
    with pytest.raises(SpecError):
        SESSION.load_spec(table)


def test_each_key_carries_its_type_default_unit_and_meaning():
    gpu = SCHEMA["$defs"]["Gpu"]["properties"]
    memory = gpu["memory_bytes"]
    assert memory["x-unit"] == "bytes"
    assert memory["description"].startswith("On-device memory (HBM)")
    number, text = memory["anyOf"]
    assert number == {"type": "integer", "minimum": 2**30}  # converter.BARE_FLOORS
    assert text["type"] == "string"
    training = SCHEMA["$defs"]["Training"]["properties"]
    assert training["recompute"]["enum"] == ["none", "selective", "full"]
    assert training["recompute"]["default"] == llmpar.spec.Training().recompute
    context = SCHEMA["$defs"]["ContextConfig"]["properties"]["kind"]
    assert context["enum"] == ["ring", "all-to-all", "hybrid"]
    assert SCHEMA["properties"]["parallel"]["properties"]["order"]["default"] == "tp-cp-ep-dp-pp"


@pytest.mark.parametrize("name", sorted(SCHEMA["$defs"]))
def test_every_key_of_every_table_is_described(name):
    table = SCHEMA["$defs"][name]
    cls = next(c for c in _classes() if c.__name__ == name)
    keys = set(table["properties"]) - {"preset", "file", "hf_config"}
    assert keys == {f.name for f in attrs.fields(cls)}
    undescribed = [key for key, value in table["properties"].items()
                   if not value.get("description")]
    assert not undescribed


def _classes() -> list[type]:
    """Every attrs class a Spec's fields reach, and each strategy's table."""
    found: list[type] = []

    def visit(tp: object) -> None:
        if attrs.has(tp) and tp not in found:
            found.append(tp)
            for field in attrs.fields(attrs.resolve_types(tp)):
                visit(field.type)
        for arg in typing.get_args(tp):
            visit(arg)

    visit(llmpar.spec.Spec)
    return found + [s.config_type for s in SESSION.strategies.values()]


@attrs.frozen(kw_only=True)
class OffloadConfig:
    degree: int = attrs.field(default=1, validator=llmpar.spec.validators.positive)
    """Ranks the toy strategy spreads over."""


class ToyOffload(llmpar.Strategy):
    """A toy strategy that changes nothing."""

    name = "toy"
    config_type = OffloadConfig
    phase = 50

    def transform(self, config, ctx):
        return llmpar.Transform(strategy=self.name)


class ToyPlugin:
    @llmpar.hookimpl
    def llmpar_register_strategies(self, register):
        register(ToyOffload())


def test_a_plugins_table_is_in_the_schema_of_its_session():
    session = llmpar.Session(load_entry_points=False, plugins=[ToyPlugin()])
    schema = spec_json_schema(session.strategies)
    toy = schema["properties"]["parallel"]["properties"]["toy"]
    assert toy["$ref"] == "#/$defs/OffloadConfig"
    degree = schema["$defs"]["OffloadConfig"]["properties"]["degree"]
    assert degree == {"type": "integer", "exclusiveMinimum": 0, "default": 1,
                      "description": "Ranks the toy strategy spreads over."}
    assert list(errors({**BASE, "parallel": {"toy": {"degree": 2}}}, schema)) == []
    assert list(errors({**BASE, "parallel": {"toy": {"degree": 0}}}, schema))
    assert "toy" not in SCHEMA["properties"]["parallel"]["properties"]  # llmpar's own
