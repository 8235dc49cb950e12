"""Every shipped preset loads, names its source, and resolves from the installed package."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
BASE = {"model": "7b", "hardware": {"gpu": "h100-sxm"}}


@pytest.mark.parametrize("name", SESSION.presets.names("models"))
def test_model_presets_load_and_cite(name):
    spec = SESSION.load_spec({**BASE, "model": name, "training": {"sequence_length": 512}})
    assert spec.model.source, name
    assert SESSION.evaluate(spec).parameters > 0


@pytest.mark.parametrize("name", SESSION.presets.names("gpus"))
def test_gpu_presets_load_and_cite(name):
    gpu = SESSION.load_spec({**BASE, "hardware": {"gpu": name}}).hardware.gpu
    assert gpu.source and gpu.memory_bytes > 0
    if gpu.achievable_mfu is not None:
        assert gpu.achievable_mfu_source


@pytest.mark.parametrize("name", SESSION.presets.names("optimizers"))
def test_optimizer_presets_load_and_cite(name):
    assert SESSION.load_spec({**BASE, "optimizer": name}).optimizer.source


@pytest.mark.parametrize("name", SESSION.presets.names("examples"))
def test_examples_evaluate(name):
    plan = SESSION.evaluate(SESSION.presets.path("examples", name))
    assert plan.total_bytes > 0


def test_first_set_of_presets_ships():
    assert {"bert-large", "gpt-3-175b", "qwen3-4b", "llama-2-7b", "llama-2-70b", "1b", "7b",
            "70b"} <= set(SESSION.presets.names("models"))
    assert {"v100-sxm2-16gb", "a100-sxm-80gb", "h100-sxm", "b300"} <= set(
        SESSION.presets.names("gpus"))
    assert {"adam", "adam-fp32", "sgd-momentum"} <= set(SESSION.presets.names("optimizers"))


@pytest.mark.parametrize(
    ("optimizer", "precision", "bytes_per_parameter"),
    [("adam", "bf16", 16), ("adam", "fp32", 16), ("adam-fp32", "fp32", 16),
     ("sgd-momentum", "bf16", 12), ("sgd-momentum", "fp32", 12)],
)
def test_optimizer_bytes_per_parameter(optimizer, precision, bytes_per_parameter):
    # With fp32 weights no separate master copy is kept.
    plan = SESSION.evaluate({**BASE, "optimizer": optimizer,
                             "precision": {"weights": precision, "gradients": precision}})
    states = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
    assert states == bytes_per_parameter * plan.parameters


# --- usable memory: what the device reports, not the datasheet's rounded figure ---------

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "specs" / "examples"
GPU_PRESETS = sorted((EXAMPLES_DIR.parent / "gpus").glob("*.toml"))


@pytest.mark.parametrize("path", GPU_PRESETS, ids=lambda p: p.stem)
def test_a_reported_memory_names_its_log_and_lies_near_the_datasheet(path):
    gpu = llmpar.load_spec({"model": "llama-3-8b", "hardware": {"gpu": path.stem}}).hardware.gpu
    if gpu.usable_memory_bytes is None:
        assert not gpu.usable_memory_source
        return
    assert "nvidia-smi" in gpu.usable_memory_source or "rocminfo" in gpu.usable_memory_source
    assert 0.99 <= gpu.usable_memory_bytes / gpu.memory_bytes <= 1.08


H100 = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
        "training": {"sequence_length": 1024, "global_batch_size": 8},
        "parallel": {"data": {"fsdp": True}}}


def test_a_plan_fits_in_what_the_device_reports_less_the_headroom():
    plan = llmpar.evaluate(H100)
    assert plan.capacity_bytes == 81_559 * 2**20  # nvidia-smi's total, not 80 GB
    held = llmpar.evaluate(H100, {"hardware.memory_headroom_bytes": "4 GiB"})
    assert held.capacity_bytes == 81_559 * 2**20 - 4 * 2**30
    assert "memory_headroom_bytes" in held.explain("capacity_bytes")


def test_a_run_between_the_datasheet_and_the_reported_memory_fits():
    # 14K tokens of Llama-3-8B on 8 H100 with FSDP and selective recomputation: 84.8 GB
    # per GPU, more than the datasheet's 80 GB and less than the 85.5 GB the device reports.
    spec = {**H100, "training": {"sequence_length": 14_336, "global_batch_size": 8,
                                 "recompute": "selective"}}
    plan = llmpar.evaluate(spec)
    assert 80e9 < plan.total_bytes <= plan.capacity_bytes and plan.steady_state_fits
    datasheet = llmpar.evaluate(spec, {"hardware.gpu.usable_memory_bytes": "80 GB"})
    assert not datasheet.steady_state_fits and not datasheet.fits


def test_changing_a_presets_memory_drops_its_reported_total():
    plan = llmpar.evaluate(H100, {"hardware.gpu.memory_bytes": "40 GB"})
    assert plan.capacity_bytes == 40 * 10**9


@pytest.mark.parametrize(("overrides", "path", "fragment"), [
    ({"hardware.gpu.memory_bytes": 80}, "$.hardware.gpu.memory_bytes", '"80 GB"'),
    ({"hardware.inter_node_bandwidth_bytes_per_s": 400},
     "$.hardware.inter_node_bandwidth_bytes_per_s", '"400 GB/s"'),
    ({"hardware.gpu.peak_bf16_flops_per_s": 989}, "$.hardware.gpu.peak_bf16_flops_per_s",
     '"989 TFLOP/s"'),
    ({"hardware.gpu.usable_memory_bytes": "40 GB"}, "$.hardware.gpu.usable_memory_bytes",
     "far from memory_bytes"),
    ({"hardware.memory_headroom_bytes": "90 GB"}, "$.hardware.memory_headroom_bytes",
     "leaves nothing"),
])
def test_memory_settings_that_cannot_be_meant(overrides, path, fragment):
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.evaluate(H100, overrides)
    [problem] = caught.value.problems
    assert problem.path == path and fragment in problem.message


def test_a_field_of_a_clusters_gpu_can_be_set_inline():
    spec = EXAMPLES_DIR / "llama-3-8b-fsdp-8-h100.toml"  # [hardware] cluster = "dgx-h100"
    base = llmpar.evaluate(spec)
    slower = llmpar.evaluate(spec, {"hardware.gpu.matmul_efficiency": 0.32})
    assert slower.gpu == base.gpu == "h100-sxm"
    assert slower.capacity_bytes == base.capacity_bytes  # the rest of the preset kept
    # halving the matrix products' rate: they take twice as long, the memory-bound rest not
    assert 1.3 * base.compute_seconds < slower.compute_seconds < 2 * base.compute_seconds


def test_a_small_quantity_with_its_unit_is_taken_as_written():
    plan = llmpar.evaluate(H100, {"hardware.gpu.memory_bytes": "900 MB",
                                  "hardware.inter_node_bandwidth_bytes_per_s": "400 MB/s"})
    assert plan.capacity_bytes == 900 * 10**6 and not plan.fits


def test_a_preset_is_parsed_once_and_read_again_when_it_changes(tmp_path):
    from llmpar.loading.presets import catalog_of

    (tmp_path / "models").mkdir()
    preset = tmp_path / "models" / "tiny.toml"
    preset.write_text("parameters = 1e9\n", encoding="utf-8")
    catalog = catalog_of([tmp_path])
    first = catalog.read("models", "tiny")
    first["parameters"] = 0  # a caller's change does not reach the next reader
    assert catalog.read("models", "tiny")["parameters"] == 1e9
    preset.write_text("parameters = 7e9  # edited\n", encoding="utf-8")
    assert catalog.read("models", "tiny")["parameters"] == 7e9
