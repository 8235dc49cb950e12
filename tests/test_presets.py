"""Every shipped preset loads, names its source, and resolves from the installed package."""

from __future__ import annotations

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
