"""Hostile and extreme specs: a clear SpecError in bounded time, never a traceback, never a
number that is not a number, never a file the spec should not reach."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar
from llmpar import SpecError
from llmpar.cli.main import main
from llmpar.loading.limits import (
    MAX_ARRAY_ITEMS,
    MAX_FILE_BYTES,
    MAX_NESTING_DEPTH,
    MAX_STAGES,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
BASE = (EXAMPLES / "llama-3-8b-fsdp-8-h100.toml").read_text(encoding="utf-8")
SECONDS_FOR_A_BAD_SPEC = 5.0
"""A bad spec is refused well within this on a slow machine (each takes under 0.5 s)."""


def problems_of(source, **kwargs) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        llmpar.evaluate(source, **kwargs)
    return [(p.path, p.message) for p in caught.value.problems]


def refused_quickly(source) -> SpecError:
    start = time.perf_counter()
    with pytest.raises(SpecError) as caught:
        llmpar.evaluate(source)
    assert time.perf_counter() - start < SECONDS_FOR_A_BAD_SPEC
    return caught.value


# 1. Time and memory bounded by the limits, not by the values ---------------------------

def test_a_trillion_layers_is_planned_in_bounded_time():
    start = time.perf_counter()
    plan = llmpar.evaluate(BASE, overrides={"model.num_layers": 10**12})
    assert time.perf_counter() - start < SECONDS_FOR_A_BAD_SPEC
    assert not plan.fits
    assert plan.parameters > 10**12 * 200_000_000  # each Llama-3-8B layer is ~218M


def test_a_trillion_layer_serving_spec_is_planned_in_bounded_time():
    start = time.perf_counter()
    plan = llmpar.evaluate(EXAMPLES / "inference-llama-2-70b-h100.toml",
                           overrides={"model.num_layers": 10**12})
    assert time.perf_counter() - start < SECONDS_FOR_A_BAD_SPEC
    assert not plan.fits


@given(st.integers(1, 80), st.integers(1, 7), st.integers(0, 12),
       st.sampled_from([None, 1, 2, 3, 6]), st.booleans(), st.booleans(), st.data())
def test_layer_kinds_are_counted_as_visiting_every_layer_would(
        layers, frequency, dense, pattern, windowed, moe, data):
    base = llmpar.load_spec({"model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm"}}).model
    model = attrs.evolve(
        base, num_layers=layers,
        moe=attrs.evolve(base.moe, layer_frequency=frequency, dense_layers=dense) if moe
        else None,
        sliding_window=4096 if windowed else None,
        sliding_window_pattern=pattern if windowed else None)
    first = data.draw(st.integers(0, layers))
    count = data.draw(st.integers(0, layers - first))
    visited: dict[tuple[bool, bool], int] = {}
    for index in range(first, first + count):
        kind = (model.is_moe_layer(index), model.is_sliding_window_layer(index))
        visited[kind] = visited.get(kind, 0) + 1
    assert model.layer_kinds_in(first, count) == visited


def test_stages_are_planned_in_bounded_time_up_to_the_limit():
    pipeline = {"model.num_layers": MAX_STAGES, "parallel.data.fsdp": False,
                "parallel.pipeline.degree": MAX_STAGES, "hardware.num_gpus": MAX_STAGES}
    start = time.perf_counter()
    assert len(llmpar.evaluate(BASE, overrides=pipeline).stages) == MAX_STAGES
    assert time.perf_counter() - start < SECONDS_FOR_A_BAD_SPEC
    beyond = {**pipeline, "model.num_layers": 10**6, "parallel.pipeline.degree": 10**6,
              "hardware.num_gpus": 10**6}
    [(path, message)] = problems_of(BASE, overrides=beyond)
    assert path == "$.parallel.pipeline.degree"
    assert "at most 10,000 stages" in message


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    spec = tmp_path / "big.toml"
    spec.write_text(BASE + "# " + "x" * MAX_FILE_BYTES + "\n", encoding="utf-8")
    error = refused_quickly(spec)
    assert "1 MiB" in str(error)


def test_many_unknown_keys_are_reported_fast_and_briefly():
    text = "".join(f"k{i} = 1\n" for i in range(15_000)) + BASE
    error = refused_quickly(text)
    assert len(error.problems) == 15_000
    assert len(str(error)) < 5_000
    assert "and 14,950 more" in str(error)


def test_too_many_values_is_one_problem():
    text = BASE.replace("[training]\n", "[training]\n" + "".join(
        f"k{i} = [1, 2]\n" for i in range(8_000)))
    error = refused_quickly(text)
    assert [p.message for p in error.problems] == [
        "more than 20,000 keys and array items (llmpar's limit for one spec)"]


def test_an_array_over_the_limit_is_refused():
    text = BASE + "[search]\nmicro_batch_sizes = [" + "1, " * (MAX_ARRAY_ITEMS + 1) + "]\n"
    assert problems_of(text)[0][0] == "$.search.micro_batch_sizes"


# 4. Every number finite: out-of-range values are errors at their key --------------------

@pytest.mark.parametrize(("key", "value"), [
    ("training.tokens", 1e300),
    ("hardware.num_gpus", 1e300),
    ("training.sequence_length", 1e300),
    ("hardware.gpu.hbm_bandwidth_bytes_per_s", 1e-300),
    ("hardware.gpu.peak_bf16_flops_per_s", 1e-300),
    ("hardware.inter_node_latency_seconds", 1e300),
    ("parallel.data.degree", 2**1100),
])
def test_out_of_range_numbers_are_errors_at_their_key(key, value):
    spec = BASE.replace('cluster = "dgx-h100"', 'cluster = "dgx-h100"\ngpu = "h100-sxm"')
    [(path, message)] = problems_of(spec, overrides={key: value})
    assert path == f"$.{key}"
    assert "magnitude" in message


def test_a_huge_integer_is_blamed_on_its_key_not_its_table():
    text = BASE.replace("num_gpus = 8", f"num_gpus = {2**1100}")
    [(path, message)] = problems_of(text)
    assert path == "$.hardware.num_gpus"
    assert "2**1100" in message


def strict_loads(text: str):
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json(capsys):
    for example in sorted(EXAMPLES.glob("*.toml")):
        assert main(["evaluate", str(example), "--format", "json"]) == 0
        strict_loads(capsys.readouterr().out)


def test_strict_json_names_a_non_finite_value():
    from llmpar.report.json_format import strict_json

    with pytest.raises(SpecError, match=r"\$\.a\[1\]"):
        strict_json({"a": [1.0, float("inf")]})


# 5. No traceback from what reaches the reader ------------------------------------------

@pytest.mark.parametrize("text", [
    "model = " + "[" * 5_000 + "]" * 5_000,
    "model = " + "{ a = " * 5_000 + "1" + " }" * 5_000,
    "model = " + "[" * (MAX_NESTING_DEPTH + 5) + "]" * (MAX_NESTING_DEPTH + 5),
])
def test_deep_nesting_is_a_spec_error(text):
    assert "levels deep" in refused_quickly(text).problems[0].message


def test_a_deeply_nested_hf_config_is_a_spec_error(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE.replace('model = "llama-3-8b"',
                                 'model = { hf_config = "config.json" }'), encoding="utf-8")
    [(path, message)] = problems_of(spec)
    assert path == "$.model.hf_config"
    assert "levels deep" in message


def test_a_file_name_over_the_filesystem_limit_is_a_spec_error():
    [(path, message)] = problems_of("x" * 5_000 + ".toml")
    assert (path, message[:15]) == ("$", "cannot read the")


@pytest.mark.parametrize("source", [
    types.MappingProxyType({"model": "llama-3-8b"}),
    {"model": "llama-3-8b", 3: "x"},
    {None: 1},
    (item for item in ["model"]),
    42,
])
def test_odd_python_sources_are_spec_errors(source):
    with pytest.raises(SpecError):
        llmpar.evaluate(source)


def test_a_mapping_proxy_spec_is_read_like_a_dict():
    table = {"model": "llama-3-8b",
             "hardware": types.MappingProxyType({"cluster": "dgx-h100", "num_gpus": 8}),
             "training": {"sequence_length": 1024, "global_batch_size": 8}}
    assert llmpar.evaluate(types.MappingProxyType(table)).num_gpus == 8


@pytest.mark.parametrize("overrides", [["training.tokens=1"], "training.tokens=1"])
def test_overrides_that_are_not_a_table_are_spec_errors(overrides):
    [(path, message)] = problems_of(BASE, overrides=overrides)
    assert "overrides must be a table" in message


def test_set_of_an_out_of_range_value_exits_2(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE, encoding="utf-8")
    assert main(["evaluate", str(spec), "--set", "training.sequence_length=1e300"]) == 2
    assert "$.training.sequence_length" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly():
    command = [sys.executable, "-m", "llmpar.cli", "evaluate",
               str(EXAMPLES / "gpt3-175b-1024-a100.toml")]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader goes away before the report is written
        error = process.stderr.read()
    assert b"Traceback" not in error


# 6. Presets by name only; files through an explicit key --------------------------------

@pytest.mark.parametrize("name", [
    "../examples/gpt3-175b-1024-a100", str(EXAMPLES / "gpt3-175b-1024-a100"), "/etc/passwd",
    "a/b", ".hidden", "x" * 200,
])
def test_a_preset_name_is_never_a_path(name):
    [(path, message)] = problems_of(BASE.replace('"llama-3-8b"', json.dumps(name)))
    assert path == "$.model"
    assert "not a path" in message
    assert name not in message  # a path is not echoed back


def test_a_toml_file_is_named_by_the_file_key(tmp_path):
    (tmp_path / "mine.toml").write_text('preset = "llama-3-8b"\n', encoding="utf-8")
    model = (EXAMPLES.parent / "models" / "llama-3-8b.toml").read_text(encoding="utf-8")
    (tmp_path / "mine.toml").write_text(model, encoding="utf-8")
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE.replace('model = "llama-3-8b"',
                                 'model = { file = "mine.toml", num_layers = 2 }'),
                    encoding="utf-8")
    plan = llmpar.evaluate(spec)
    reference = llmpar.evaluate(BASE, overrides={"model.num_layers": 2})
    assert plan.parameters == reference.parameters


def test_a_file_name_given_as_a_preset_points_to_the_file_key():
    [(_, message)] = problems_of(BASE.replace('"llama-3-8b"', '"my-model.toml"'))
    assert "file =" in message


@pytest.mark.parametrize(("value", "fragment"), [
    ('{ file = "../../etc/passwd" }', "expected the path of a .toml file"),
    ('{ file = "missing.toml" }', "file not found"),
    ('{ file = "x.toml", preset = "llama-3-8b" }', "not both"),
])
def test_file_key_problems(value, fragment):
    [(path, message)] = problems_of(BASE.replace('"llama-3-8b"', value))
    assert path.startswith("$.model")
    assert fragment in message


def test_hf_config_is_size_limited_and_must_be_an_object(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE.replace('model = "llama-3-8b"',
                                 'model = { hf_config = "config.json" }'), encoding="utf-8")
    (tmp_path / "config.json").write_text("[1, 2]", encoding="utf-8")
    assert "expected a JSON object" in problems_of(spec)[0][1]
    (tmp_path / "config.json").write_text(" " * (MAX_FILE_BYTES + 1) + "{}", encoding="utf-8")
    assert "1 MiB" in problems_of(spec)[0][1]


# 10. An existing file is read as a file, whatever its name -----------------------------

@pytest.mark.parametrize("name", ["a=b.toml", "[x].toml"])
def test_file_names_with_toml_characters_are_files(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(BASE, encoding="utf-8")
    assert llmpar.evaluate(name).num_gpus == 8


# 11. Control characters in echoed keys are escaped -------------------------------------

def test_control_characters_in_keys_are_escaped():
    error = refused_quickly(BASE + '"\\u001b[2Jclear\\nforged: line" = 1\n')
    text = str(error)
    assert "\x1b" not in text
    assert "\\x1b[2Jclear\\nforged" in text
    assert len(text.splitlines()) == 2


# 12. Wording ----------------------------------------------------------------------------

def test_a_table_where_an_array_belongs_is_called_so():
    [(path, message)] = problems_of(BASE + "[search]\nmicro_batch_sizes = { a = 1 }\n")
    assert (path, message) == ("$.search.micro_batch_sizes", "expected an array, got {'a': 1}")


def test_a_byte_order_mark_is_not_part_of_the_spec(tmp_path):
    spec = tmp_path / "bom.toml"
    spec.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    assert llmpar.evaluate(spec).num_gpus == 8


def test_an_empty_spec_says_what_a_spec_needs():
    [(_, message)] = problems_of("\n")
    assert "model" in message and "[hardware]" in message and "specs/examples" in message


# 3. A plugin's transform is checked before it is composed -------------------------------

@attrs.frozen(kw_only=True)
class _Table:
    degree: int = 1


def _session_with(transform):
    class Hostile(llmpar.Strategy):
        name, config_type, phase = "hostile", _Table, 50

        def degree(self, config):
            return 1

        def transform(self, config, ctx):
            return transform()

    class Plugin:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            register(Hostile())

    return llmpar.Session(load_entry_points=False, plugins=[Plugin()])


@pytest.mark.parametrize(("transform", "fragment"), [
    (lambda: llmpar.Transform(strategy="hostile", buffer_bytes=-1e15), "buffer_bytes"),
    (lambda: llmpar.Transform(strategy="hostile", extra_flops_per_step=math.inf),
     "extra_flops_per_step"),
    (lambda: llmpar.Transform(strategy="hostile", shards=(
        llmpar.Shard(component="weights", divisor=0.5, reason="x"),)), "divisor"),
    (lambda: {"buffer_bytes": 1}, "not Transform"),
])
def test_a_transform_outside_the_contract_is_named_not_planned(transform, fragment):
    session = _session_with(transform)
    spec = BASE + "[parallel.hostile]\n"
    with pytest.raises(llmpar.PluginError, match="strategy 'hostile'") as caught:
        session.evaluate(spec)
    assert fragment in str(caught.value)
    with pytest.raises(llmpar.PluginError, match="strategy 'hostile'"):
        llmpar.search(spec, session=session)  # never ranked as fitting
    plain = BASE.replace("[parallel.data]\nfsdp = true\n", "")
    assert session.evaluate(plain).total_bytes > 0  # specs without it still plan


def test_control_characters_in_values_are_refused_before_a_report_prints_them():
    [(path, message)] = problems_of(BASE, overrides={"model.name": "\x1b[2Jllama"})
    assert path == "$.model.name"
    assert "control characters" in message and "\\x1b" in message
