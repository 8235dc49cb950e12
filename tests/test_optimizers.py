"""Optimizer presets: bytes per parameter of each, with the arithmetic spelled out."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.spec.optimizer import (
    FACTORED_NEGLIGIBLE_WIDTH,
    Optimizer,
    OptimizerState,
    WeightShapes,
)

SESSION = llmpar.Session(load_entry_points=False)
BASE = {"model": "7b", "hardware": {"gpu": "h100-sxm"}}

MASTER = 4  # fp32 master copy of 16-bit weights
FP32 = 4
INT8_BLOCKED = 1 + 4 / 2048  # int8 element + one fp32 absmax per 2048-element block


def optimizer(name: str) -> Optimizer:
    return SESSION.load_spec({**BASE, "optimizer": name}).optimizer


@pytest.mark.parametrize(
    ("name", "bf16_weights", "fp32_weights"),
    [
        ("adam", MASTER + FP32 + FP32, FP32 + FP32),  # master, momentum, variance: 12, 8
        ("adamw", MASTER + FP32 + FP32, FP32 + FP32),  # AdamW keeps Adam's states
        ("adam-fp32", FP32 + FP32, FP32 + FP32),  # momentum, variance; no master listed
        ("adam-fp32-grads", MASTER + FP32 + FP32, FP32 + FP32),  # grads counted apart
        ("sgd-momentum", MASTER + FP32, FP32),  # master, momentum: 8, 4
        ("adafactor", MASTER + 0, 0),  # factored second moment ~ 0 without shapes
        ("adam-8bit", MASTER + 2 * INT8_BLOCKED, 2 * INT8_BLOCKED),  # 6.0039, 2.0039
        ("lion", MASTER + FP32, FP32),  # one momentum: 8, 4
        ("muon", MASTER + FP32, FP32),  # one momentum (all parameters as Muon's): 8, 4
    ],
)
def test_state_bytes_per_parameter(name, bf16_weights, fp32_weights):
    assert optimizer(name).bytes_per_parameter("bf16") == pytest.approx(bf16_weights)
    assert optimizer(name).bytes_per_parameter("fp32") == pytest.approx(fp32_weights)


def test_adam_8bit_is_6_0039_bytes_with_bf16_weights():
    # 4 (fp32 master) + 2 states * (1 byte + 4 bytes / 2048) = 4 + 2.00390625
    assert optimizer("adam-8bit").bytes_per_parameter("bf16") == 6.00390625


@pytest.mark.parametrize(
    ("name", "total"),
    [("adam", 2 + 2 + 12), ("adamw", 2 + 2 + 12), ("adam-fp32-grads", 2 + 4 + 12),
     ("lion", 2 + 2 + 8), ("muon", 2 + 2 + 8), ("adafactor", 2 + 2 + 4),
     ("adam-8bit", 2 + 2 + 6.00390625)],
)
def test_model_state_bytes_per_parameter_with_bf16_weights_and_gradients(name, total):
    assert optimizer(name).model_state_bytes_per_parameter("bf16", "bf16") == total


def test_fp32_main_gradients_replace_the_precision_gradients():
    adam = optimizer("adam-fp32-grads")
    assert adam.gradients == "fp32"
    assert adam.gradients_dtype("bf16") == "fp32"
    assert optimizer("adam").gradients_dtype("bf16") == "bf16"
    # Megatron's table: bf16 param, fp32 grads = 18 bytes = 2 + 4 + 12.
    assert adam.model_state_bytes_per_parameter("bf16", "bf16") == 18


def test_fp32_main_gradients_plan_is_18_bytes_per_parameter():
    plan = SESSION.evaluate({**BASE, "optimizer": "adam-fp32-grads",
                             "precision": {"weights": "bf16", "gradients": "fp32"}})
    states = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
    assert states == (2 + 4 + 12) * plan.parameters


@pytest.mark.parametrize("name", ["adamw", "adam-8bit", "lion", "muon", "adafactor"])
def test_plan_optimizer_bytes_follow_the_preset(name):
    plan = SESSION.evaluate({**BASE, "optimizer": name})
    per_parameter = optimizer(name).bytes_per_parameter("bf16")
    assert plan.optimizer_bytes == round(plan.parameters * per_parameter)


def test_factored_state_is_exact_with_shapes():
    # Two 4096 x 4096 matrices and one 4096 x 11008, plus 8192 vector elements:
    # factored elements = 2 * (4096 + 4096) + (4096 + 11008) + 8192 = 39,680
    shapes = WeightShapes(matrices=((4096, 4096, 2), (4096, 11008, 1)), vector_elements=8192)
    assert shapes.parameters == 2 * 4096 * 4096 + 4096 * 11008 + 8192
    assert shapes.factored_elements == 39_680
    adafactor = optimizer("adafactor")
    expected = 4 + 4 * 39_680 / shapes.parameters  # master + fp32 factored statistics
    assert adafactor.bytes_per_parameter("bf16", shapes) == pytest.approx(expected)


def test_factored_approximation_is_under_a_thousandth_of_a_full_state():
    width = FACTORED_NEGLIGIBLE_WIDTH
    shapes = WeightShapes(matrices=((width, width, 1),))
    assert shapes.factored_fraction() == 2 / width
    assert shapes.factored_fraction() < 1e-3


def test_block_scales_add_their_share():
    state = OptimizerState(name="m", dtype="int8", block_size=256, scale_dtype="fp16")
    assert state.bytes_per_element() == 1 + 2 / 256


def test_optimizer_table_keys_load(tmp_path):
    table = {"name": "mine", "gradients": "fp32", "states": [
        {"name": "master", "dtype": "fp32", "master": True},
        {"name": "m", "dtype": "int8", "block_size": 64},
        {"name": "v", "factored": True}]}
    loaded = SESSION.load_spec({**BASE, "optimizer": table}).optimizer
    assert loaded.gradients == "fp32"
    assert [s.block_size for s in loaded.states] == [None, 64, None]
    assert loaded.bytes_per_parameter("bf16") == 4 + (1 + 4 / 64) + 0


def test_bad_block_size_names_its_key():
    table = {"states": [{"name": "m", "dtype": "int8", "block_size": 0}]}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.load_spec({**BASE, "optimizer": table})
    assert "$.optimizer.states[0].block_size" in str(error.value)


def test_new_presets_ship():
    assert {"adamw", "adam-fp32-grads", "adafactor", "adam-8bit", "lion", "muon"} <= set(
        SESSION.presets.names("optimizers"))
