"""Every field of a search result's JSON has an answer (`llmpar.search.explain`)."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.output_schema import output_schema
from llmpar.plan_explain import format_path, leaf_paths
from llmpar.search.explain import explain_search

SPEC = "llama-3-8b-fsdp-8-h100"


@pytest.fixture(scope="module")
def result():
    path = llmpar.default_session().presets.path("examples", SPEC)
    return llmpar.search(path, {"search.num_gpus": [8, 16]}, top=2)


def test_every_leaf_outside_the_plans_has_its_meaning(result):
    data = result.to_dict()
    schema = output_schema("search")
    for path in leaf_paths(data):
        if "plan" in path:
            continue  # a plan's fields: tests/test_explain.py
        if isinstance(path[-1], str) and ("." in path[-1] or "$" in path[-1]):
            # a key that is itself a key path (a rejection's reason, a dimension's name)
            # is answered with its table's meaning
            assert path[-2] in ("rejected", "rejection_examples", "choices"), path
            path = path[:-1]
        text = explain_search(result, format_path(path), data=data, schema=schema)
        assert "meaning: (no meaning recorded)" not in text, text
    assert "Layouts left out, by reason" in explain_search(result, "rejected")


def test_a_plans_field_is_the_plans_own_explanation(result):
    text = explain_search(result, "results[0].plan.training.mfu")
    assert text == result.results[0].plan.explain("training.mfu")
    assert "Chowdhery" in text


def test_a_documented_meaning_and_a_bad_path(result):
    assert "Layouts enumerated" in explain_search(result, "considered")
    assert "from the choices" in explain_search(result, "pareto[0].layout.data")
    assert "GPUs of the layout" in explain_search(result, "pareto[0].num_gpus")
    with pytest.raises(KeyError):
        explain_search(result, "results[99].objective")
    with pytest.raises(KeyError):
        explain_search(result, "no_such_key")


def test_the_cli_explains_a_field_of_the_search_result(capsys):
    from llmpar.cli.main import main

    spec = str(llmpar.default_session().presets.path("examples", "gpt3-175b-1024-a100"))
    assert main(["search", spec, "--explain", "results[0].plan.training.mfu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mfu = ") and "Chowdhery et al. 2022" in out
    assert main(["search", spec, "--explain", "results[0].objectiv"]) == 2
    assert "did you mean 'results[0].objective'" in capsys.readouterr().err
