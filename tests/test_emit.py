"""Emitted specs name their presets, so overrides compose with them: `evaluate --emit`
or `search --emit`, then `--set hardware.cluster=...`, gives the plan of the new
cluster, not the old GPU's numbers under the new name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.cli.main import main

SESSION = llmpar.default_session()
EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "specs" / "examples").glob("*.toml"))


def plan_json(capsys, *argv: str) -> dict[str, object]:
    assert main([*argv, "--format", "json"]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_emits_its_presets_by_name_and_loads_back_equal(path):
    spec = SESSION.load_spec(path)
    text = SESSION.emit_spec(spec)
    assert SESSION.load_spec(text=text) == spec
    table = tomllib.loads(text)
    model = table["model"]
    assert model == spec.model.name or model["preset"] == spec.model.name
    assert table["hardware"].get("cluster", spec.hardware.cluster) == spec.hardware.cluster
    given = tomllib.loads(path.read_text())["hardware"].get("gpu")
    own = set(given) if isinstance(given, dict) else set()
    written = table["hardware"].get("gpu", {})
    if isinstance(written, dict):  # else a preset's name
        assert set(written) - {"preset"} <= own  # the file's own keys, not the preset's


def test_evaluate_emit_then_set_cluster_is_the_cluster_given_directly(tmp_path, capsys):
    emitted = tmp_path / "emitted.toml"
    before = plan_json(capsys, "evaluate", "llama-3-8b-fsdp-8-h100", "--emit", str(emitted))
    after = plan_json(capsys, "evaluate", str(emitted), "--set", "hardware.cluster=dgx-b200")
    direct = plan_json(capsys, "evaluate", "llama-3-8b-fsdp-8-h100",
                       "--set", "hardware.cluster=dgx-b200")
    assert after == direct
    assert before["gpu"] == "h100-sxm" and after["gpu"] == "b200"
    assert after["capacity_bytes"] != before["capacity_bytes"]


def test_search_emit_then_set_cluster_is_that_layout_on_the_cluster(tmp_path, capsys):
    emitted = tmp_path / "best.toml"
    assert main(["search", "llama-3-8b-fsdp-8-h100", "--top", "1", "--format", "json",
                 "--emit", str(emitted)]) == 0
    capsys.readouterr()
    after = plan_json(capsys, "evaluate", str(emitted), "--set", "hardware.cluster=dgx-b200")
    table = tomllib.loads(emitted.read_text())
    layout = {f"parallel.{name}": config for name, config in table["parallel"].items()}
    layout.update({f"training.{key}": value for key, value in table["training"].items()})
    layout["hardware.cluster"] = "dgx-b200"
    direct = llmpar.evaluate(SESSION.presets.path("examples", "llama-3-8b-fsdp-8-h100"),
                             layout)
    assert after["gpu"] == "b200"
    assert after["step_seconds"] == direct.step_seconds
    assert after["total_bytes"] == direct.total_bytes
    assert after["layout"] == direct.layout


def test_own_overrides_survive_a_later_cluster(tmp_path, capsys):
    emitted = tmp_path / "emitted.toml"
    plan_json(capsys, "evaluate", "llama-3-8b-fsdp-8-h100", "--emit", str(emitted),
              "--set", "hardware.inter_node_bandwidth_bytes_per_s=1e11",
              "--set", "hardware.gpu.matmul_efficiency=0.5")
    text = emitted.read_text()
    assert tomllib.loads(text)["hardware"] == {
        "cluster": "dgx-h100", "num_gpus": 8, "inter_node_bandwidth_bytes_per_s": 1e11,
        "gpu": {"matmul_efficiency": 0.5}}
    spec = SESSION.load_spec(emitted, {"hardware.cluster": "dgx-b200"})
    assert spec.hardware.gpu.name == "b200"
    assert spec.hardware.inter_node_bandwidth_bytes_per_s == 1e11
    assert spec.hardware.gpu.matmul_efficiency == 0.5


def test_a_gpu_memory_of_its_own_drops_the_reported_total_as_the_loader_does():
    spec = SESSION.load_spec(SESSION.presets.path("examples", "llama-3-8b-fsdp-8-h100"),
                             {"hardware.gpu.memory_bytes": 40e9})
    text = SESSION.emit_spec(spec)
    assert tomllib.loads(text)["hardware"]["gpu"] == {"memory_bytes": 40_000_000_000}
    assert SESSION.load_spec(text=text) == spec


def test_a_model_that_is_no_preset_is_written_in_full():
    path = SESSION.presets.path("examples", "adam-memory-7b")
    table = llmpar.spec_to_dict(SESSION.load_spec(path))
    table["model"] = {**table["model"], "name": "my-own-7b"}
    spec = SESSION.load_spec(table)
    written = tomllib.loads(SESSION.emit_spec(spec))
    assert written["model"]["name"] == "my-own-7b"
    assert SESSION.load_spec(written) == spec


def test_a_fully_resolved_spec_takes_a_new_cluster_too(tmp_path):
    """A spec that spells out every field of its cluster and GPU (`llmpar.dump_spec`, or
    what `--emit` wrote before it named presets): setting `hardware.cluster` leaves out
    the keys that hold the old preset's numbers, and keeps the spec's own."""
    example = SESSION.presets.path("examples", "llama-3-8b-fsdp-8-h100")
    spec = SESSION.load_spec(example, {"hardware.inter_node_bandwidth_bytes_per_s": 1e11,
                                       "hardware.gpu.matmul_efficiency": 0.5})
    resolved = tmp_path / "resolved.toml"
    resolved.write_text(llmpar.dump_spec(spec))
    assert "peak_bf16_flops_per_s" in resolved.read_text()
    moved = SESSION.load_spec(resolved, {"hardware.cluster": "dgx-b200"})
    direct = SESSION.load_spec(example, {"hardware.cluster": "dgx-b200",
                                         "hardware.inter_node_bandwidth_bytes_per_s": 1e11,
                                         "hardware.gpu.matmul_efficiency": 0.5})
    assert moved == direct
    assert llmpar.evaluate(moved).to_dict() == llmpar.evaluate(direct).to_dict()
    assert SESSION.load_spec(resolved) == spec  # without the override, nothing is dropped


def test_a_gpu_of_its_own_stays_when_the_cluster_changes(tmp_path):
    example = SESSION.presets.path("examples", "llama-3-8b-fsdp-8-h100")
    resolved = tmp_path / "resolved.toml"
    resolved.write_text(llmpar.dump_spec(SESSION.load_spec(example,
                                                           {"hardware.gpu": "h200-sxm"})))
    moved = SESSION.load_spec(resolved, {"hardware.cluster": "dgx-b200"})
    assert moved.hardware.gpu == SESSION.load_spec(example, {"hardware.gpu": "h200"}).hardware.gpu
    assert moved.hardware.cluster == "dgx-b200"
    assert moved.hardware.host_memory_bytes == SESSION.load_spec(
        example, {"hardware.cluster": "dgx-b200"}).hardware.host_memory_bytes
