"""`[search] values` and `max_degrees` checked against the dimensions; search errors name
the spec's file; `llmpar search SPEC --dimensions` lists the keys."""

from __future__ import annotations

import json

import pytest
from search_specs import small_spec

import llmpar
from llmpar.cli.main import main
from llmpar.loading.dump import toml_text


def _problems(**search) -> list[llmpar.Problem]:
    spec = small_spec()
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search({**spec, "search": {**spec["search"], **search}})
    return list(error.value.problems)


@pytest.mark.parametrize(("search", "path", "says"), [
    ({"values": {"data.zero": [7]}}, "$.search.values.data.zero[0]", "must be 0, 1, 2 or 3"),
    ({"values": {"data.zero": [1, "2"]}}, "$.search.values.data.zero[1]",
     "expected an integer"),
    ({"values": {"data.zero": "12"}}, "$.search.values.data.zero", "expected an array"),
    ({"values": {"data.zero": 1}}, "$.search.values.data.zero", "expected an array"),
    ({"values": {"zero": [1]}}, "$.search.values.zero", "did you mean 'data.zero'"),
    ({"values": {"micro_batch_size": [0]}}, "$.search.values.micro_batch_size",
     "did you mean 'training.micro_batch_size'"),
    ({"values": {"sequence.degree": [2]}}, "$.search.values.sequence.degree",
     "no search dimension has this key"),
    ({"values": {"training.micro_batch_size": [0]}},
     "$.search.values.training.micro_batch_size[0]", "> 0"),
    ({"values": {"training.micro_batch_size": [16]}},
     "$.search.values.training.micro_batch_size", "micro_batch_sizes [1, 2]"),
    ({"values": {"training.recompute": ["al"]}}, "$.search.values.training.recompute[0]",
     "must be one of"),
    ({"values": {"tensor.degree": [0]}}, "$.search.values.tensor.degree[0]", "> 0"),
    ({"values": {"tensor.degree": [3, 5]}}, "$.search.values.tensor.degree",
     "divides hardware.num_gpus (8)"),
    ({"values": {"data.degree": [-1]}}, "$.search.values.data.degree[0]", ">= 1"),
    ({"values": {"sequence": [1]}}, "$.search.values.sequence[0]", "true or false"),
    ({"values": {"pipeline.schedule": ["1f1c"]}}, "$.search.values.pipeline.schedule[0]",
     "did you mean '1f1b'"),
    ({"values": {"context.kind": [2]}}, "$.search.values.context.kind[0]",
     "expected a string"),
    ({"micro_batch_sizes": "12"}, "$.search.micro_batch_sizes", "expected an array"),
    ({"max_degrees": {"sequence": 2}}, "$.search.max_degrees.sequence",
     "no searched degree has this name"),
    ({"max_degrees": {"tensr": 2}}, "$.search.max_degrees.tensr", "did you mean 'tensor'"),
])
def test_bad_values_are_spec_errors_at_their_key(search, path, says):
    found = {p.path: p.message for p in _problems(**search)}
    assert path in found, found
    assert says in found[path]


def test_every_problem_is_reported_at_once():
    paths = {p.path for p in _problems(values={"data.zero": [7], "zero": [1]},
                                       max_degrees={"tensr": 2})}
    assert paths == {"$.search.values.data.zero[0]", "$.search.values.zero",
                     "$.search.max_degrees.tensr"}


def test_a_list_that_leaves_out_a_pin_is_an_error():
    spec = small_spec(parallel={"tensor": {"degree": 2}})
    spec["search"] = {**spec["search"], "values": {"tensor.degree": [4]}}
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(spec)
    [problem] = error.value.problems
    assert problem.path == "$.search.values.tensor.degree"
    assert "tensor.degree = 2" in problem.message


def test_a_narrowing_that_leaves_no_layout_is_an_error_naming_it():
    spec = small_spec(1)  # one GPU: ZeRO has nothing to shard, only stage 0 is offered
    spec["search"] = {**spec["search"], "values": {"data.zero": [1]}}
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(spec)
    [problem] = error.value.problems
    assert problem.path == "$.search"
    assert "no layout is left" in problem.message and "data.zero" in problem.message


def test_array_values_are_compared_as_the_field_holds_them():
    # TOML arrays arrive as lists; the pipeline's field holds tuples.
    spec = small_spec(6, training={"sequence_length": 512, "global_batch_size": 24})
    spec["search"] = {**spec["search"], "values": {"pipeline.degree": [3],
                                                   "pipeline.layers_per_stage": [[1, 2, 1]]}}
    found = llmpar.search(spec, top=3)
    assert found.considered and found.results
    assert {r.choices["pipeline.layers_per_stage"] for r in found.results} == {(1, 2, 1)}


def test_good_values_narrow_the_space():
    spec = small_spec()
    spec["search"] = {**spec["search"], "values": {"data.zero": [1, 2], "sequence": [True]}}
    found = llmpar.search(spec, top=20)
    assert {r.choices["data.zero"] for r in found.results} <= {1, 2}
    assert all(r.choices["sequence"] for r in found.results)


def _write(tmp_path, spec) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(toml_text(spec))
    return str(path)


@pytest.mark.parametrize("search", [
    {"values": {"data.zero": [7]}},          # a value check
    {"max_layouts": 1},                      # a limit, found while laying out the space
    {"values": {"training.micro_batch_size": [4]}},
])
def test_search_errors_name_the_spec_file(tmp_path, search):
    path = _write(tmp_path, small_spec(search={"micro_batch_sizes": [1, 2], **search}))
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.search(path)
    assert error.value.source == path
    assert str(error.value).startswith(f"{path}: ")


def test_an_empty_space_names_the_spec_file_on_the_command_line(tmp_path, capsys):
    spec = small_spec(1)
    spec["search"] = {**spec["search"], "values": {"data.zero": [3]}}
    path = _write(tmp_path, spec)
    assert main(["search", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: 1 problem") and "no layout is left" in err


def test_dimensions_lists_every_key_and_the_values_of_this_space(tmp_path, capsys):
    path = _write(tmp_path, small_spec(parallel={"tensor": {"degree": 2}}))
    assert main(["search", path, "--dimensions"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert {"tensor.degree", "data.zero", "data.degree", "sequence", "pipeline.schedule",
            "training.micro_batch_size", "training.recompute"} <= set(lines)
    assert lines["tensor.degree"].split()[1] == "2"  # pinned
    assert "0, 1, 2, 3" in lines["data.zero"]
    assert "false, true" in lines["sequence"]


def test_dimensions_as_json_match_what_values_accepts(tmp_path, capsys):
    path = _write(tmp_path, small_spec())
    assert main(["search", path, "--dimensions", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["problem"] is None
    taken = {d["key"]: d["values"] for d in listing["dimensions"]}
    assert taken["training.micro_batch_size"] == [1, 2]
    assert taken["pipeline.degree"] == [1, 2, 4, 8]
    # Every listed key and value is one [search] values takes.
    spec = small_spec()
    spec["search"] = {**spec["search"], "values": {k: v for k, v in taken.items() if v}}
    assert llmpar.search(spec, top=1).considered == llmpar.search(small_spec(),
                                                                  top=1).considered


def test_dimensions_of_a_space_over_its_limits_still_lists_the_keys(tmp_path, capsys):
    path = _write(tmp_path, small_spec(search={"max_layouts": 1}))
    assert main(["search", path, "--dimensions"]) == 0
    out = capsys.readouterr().out
    assert "tensor.degree" in out and "$.search.max_layouts" in out
