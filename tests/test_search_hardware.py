"""`[search] hardware`: one search per machine, each the search of the spec with its
`[hardware]` changed as documented (llmpar.spec.search.Search.hardware), ranked by the
objective of each machine's best layout, with the cost of each where it is priced."""

from __future__ import annotations

import json

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.search import search, search_hardware

SESSION = llmpar.Session(load_entry_points=False)
SPEC = {
    "model": "llama-3-8b",
    "hardware": {"cluster": "dgx-h100", "num_gpus": 16, "memory_headroom_bytes": "2 GB",
                 "gpu_hour_cost": 2.5},
    "training": {"sequence_length": 4096, "micro_batch_size": 1, "global_batch_size": 64,
                 "tokens": 1e12},
    # A narrow space, so that each machine's search is quick.
    "search": {"micro_batch_sizes": [1], "recompute": ["selective"],
               "values": {"context.degree": [1], "pipeline.degree": [1, 2]}},
}
MACHINES = ["dgx-a100", "h200-sxm", "dgx-h100"]
PRICES = {"dgx-a100": 1.5, "h200-sxm": 3.5}


@pytest.fixture(scope="module")
def compared():
    return search_hardware(SPEC, session=SESSION, top=3, constraints={
        "hardware": MACHINES, "gpu_hour_costs": PRICES})


def _alone(hardware: dict) -> llmpar.search.SearchResult:
    return search({**SPEC, "hardware": hardware}, session=SESSION, top=3)


def test_each_machine_is_searched_as_the_spec_on_it(compared):
    by_name = {entry.name: entry for entry in compared.entries}
    # A cluster replaces the machine and keeps the job's size and headroom.
    cluster = _alone({"cluster": "dgx-a100", "num_gpus": 16,
                      "memory_headroom_bytes": "2 GB", "gpu_hour_cost": 1.5})
    # A GPU replaces the GPU alone, in the spec's nodes and network (a DGX H100's).
    gpu = _alone({**SPEC["hardware"], "gpu": "h200-sxm", "gpu_hour_cost": 3.5})
    own = _alone(SPEC["hardware"])
    for name, alone in (("dgx-a100", cluster), ("h200-sxm", gpu), ("dgx-h100", own)):
        entry = by_name[name]
        assert [r.choices for r in entry.result.results] == [r.choices for r in alone.results]
        assert entry.best.plan.step_seconds == alone.best.plan.step_seconds
        assert entry.result.considered == alone.considered
    assert by_name["dgx-a100"].kind == "cluster" and by_name["h200-sxm"].kind == "gpu"
    assert by_name["h200-sxm"].best.spec.hardware.gpu.name == "h200-sxm"
    assert by_name["h200-sxm"].best.spec.hardware.cluster == "dgx-h100"
    assert by_name["dgx-a100"].best.spec.hardware.gpu.name == "a100-sxm-80gb"
    assert by_name["dgx-a100"].best.spec.hardware.memory_headroom_bytes == 2e9


def test_machines_rank_by_their_best_layout(compared):
    seconds = [entry.best.plan.step_seconds for entry in compared.entries]
    assert seconds == sorted(seconds)
    assert compared.best is compared.entries[0]
    assert compared.to_dict()["best_hardware"] == compared.best.name
    faster = search_hardware(SPEC, session=SESSION, top=1,
                             objective="tokens_per_second_per_gpu",
                             constraints={"hardware": MACHINES})
    assert [e.name for e in faster.entries] == [e.name for e in compared.entries]


def test_cost_where_priced(compared):
    by_name = {entry.name: entry for entry in compared.entries}
    # The spec's own price goes with the entry that names its own cluster.
    assert {n: e.gpu_hour_cost for n, e in by_name.items()} == {**PRICES, "dgx-h100": 2.5}
    entry = by_name["dgx-a100"]
    step = entry.best.plan.step_seconds
    tokens = 64 * 4096
    # Dollars per million tokens: price x GPUs x hours per step / tokens per step x 1e6.
    assert entry.cost_per_million_tokens == pytest.approx(1.5 * 16 * step / 3600 / tokens * 1e6)
    unpriced = search_hardware(SPEC, session=SESSION, top=1,
                               constraints={"hardware": ["dgx-a100", "dgx-b200"]})
    assert {e.name: e.gpu_hour_cost for e in unpriced.entries} == {"dgx-a100": None,
                                                                  "dgx-b200": None}
    assert all(e.cost_per_million_tokens is None for e in unpriced.entries)


def test_the_cost_objective_ranks_by_price():
    cheapest = search_hardware(SPEC, session=SESSION, top=1, objective="cost",
                               constraints={"hardware": MACHINES, "gpu_hour_costs": PRICES})
    costs = [entry.cost_per_million_tokens for entry in cheapest.entries]
    assert costs == sorted(costs)
    assert [e.best.objective for e in cheapest.entries] == pytest.approx(costs)


@pytest.mark.parametrize(("constraints", "path", "words"), [
    ({"hardware": ["dgx-h10"]}, "$.search.hardware[0]", "did you mean 'dgx-h100'"),
    ({"hardware": ["dgx-h100", "dgx-h100"]}, "$.search.hardware", "more than once"),
    ({"hardware": ["dgx-h100"], "gpu_hour_costs": {"dgx-h200": 3.0}},
     "$.search.gpu_hour_costs.dgx-h200", "does not list"),
    ({"hardware": ["dgx-h100"], "gpu_hour_costs": {"dgx-h100": 0}},
     "$.search.gpu_hour_costs.dgx-h100", "> 0"),
])
def test_bad_lists_are_spec_errors(constraints, path, words):
    with pytest.raises(SpecError) as error:
        search_hardware(SPEC, session=SESSION, constraints=constraints)
    assert any(p.path == path and words in p.message for p in error.value.problems), \
        error.value.problems


def test_the_cost_objective_needs_every_price():
    with pytest.raises(SpecError) as error:
        search_hardware(SPEC, session=SESSION, objective="cost",
                        constraints={"hardware": ["dgx-h100", "dgx-b200"]})
    assert "missing: dgx-b200" in str(error.value)


def test_one_search_does_not_ignore_a_list():
    with pytest.raises(SpecError, match="search.hardware"):
        search({**SPEC, "search": {**SPEC["search"], "hardware": MACHINES}}, session=SESSION)


def test_cli_compares_machines(tmp_path, capsys):
    spec = tmp_path / "job.toml"
    spec.write_text(llmpar.dump_spec(SESSION.load_spec(SPEC)), encoding="utf-8")
    emitted = tmp_path / "best.toml"
    assert main(["search", str(spec), "--hardware", "dgx-a100,dgx-h100", "--top", "1",
                 "--emit", str(emitted), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == 1 and data["best_hardware"] == "dgx-h100"
    assert [h["hardware"] for h in data["hardware"]] == ["dgx-h100", "dgx-a100"]
    assert SESSION.load_spec(emitted).hardware.gpu.name == "h100-sxm"
    assert main(["search", str(spec), "--hardware", "dgx-a100,dgx-h100", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "Best layout on each machine by step_time" in text
    assert "Best machine: dgx-h100" in text


SERVING = {"model": "llama-2-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
           "inference": {"concurrency": 16, "prompt_tokens": 2048, "generated_tokens": 256},
           "search": {"tpot_seconds_max": 0.05}}


def test_serving_specs_compare_machines(capsys):
    from llmpar.search.serving import search_serving

    compared = search_hardware(SERVING, session=SESSION, top=2,
                               objective="tokens_per_second_per_gpu",
                               constraints={"hardware": ["dgx-h100", "dgx-h200"],
                                            "gpu_hour_costs": {"dgx-h200": 3.5}})
    assert compared.serving
    for entry in compared.entries:
        alone = search_serving(SESSION, SESSION.load_spec(
            {**SERVING, "hardware": {"cluster": entry.name, "num_gpus": 8}}),
            objective="tokens_per_second_per_gpu", top=2)
        assert [c.layout for c in entry.result.results] == [c.layout for c in alone.results]
        assert entry.objective == alone.best.score
    per_gpu = [entry.objective for entry in compared.entries]
    assert per_gpu == sorted(per_gpu, reverse=True)  # higher is better
    h200 = next(e for e in compared.entries if e.name == "dgx-h200")
    assert h200.gpu == "h200-sxm"
    # Dollars per million output tokens: the GPU-hour's price over a GPU's tokens in it.
    assert h200.cost_per_million_tokens == pytest.approx(
        3.5 / (h200.best.tokens_per_second_per_gpu * 3600) * 1e6)
    assert main(["search", "--spec-text", llmpar.dump_spec(SESSION.load_spec(SERVING)),
                 "--hardware", "dgx-h100,dgx-h200", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "TPOT s" in text and "Serving layouts by" in text


def test_one_serving_search_does_not_ignore_a_list():
    from llmpar.search.serving import search_serving

    with pytest.raises(SpecError, match="search_hardware"):
        search_serving(SESSION, SESSION.load_spec(
            {**SERVING, "search": {"hardware": ["dgx-h100"]}}))



def test_files_a_spec_names_are_found_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    model = SESSION.presets.path("models", "llama-3-8b").read_text(encoding="utf-8")
    (folder / "model.toml").write_text(model, encoding="utf-8")
    (folder / "job.toml").write_text(
        'model = { file = "model.toml" }\n'
        '[hardware]\ncluster = "dgx-h100"\nnum_gpus = 16\n'
        '[training]\nsequence_length = 4096\nglobal_batch_size = 64\n'
        '[search]\nhardware = ["dgx-a100", "dgx-h100"]\nmicro_batch_sizes = [1]\n'
        'recompute = ["selective"]\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    result = search_hardware(str(folder / "job.toml"), session=SESSION, top=1)
    assert [e.name for e in result.entries] == ["dgx-h100", "dgx-a100"]
    assert result.best.best.spec.model.num_layers == 32
