"""DeepSpeed ZeRO-3's prefetch bucket and persistence threshold (`[parallel.data]
prefetch_bucket_parameters`, `persistence_threshold_parameters`; deepspeed/runtime/zero/
config.py `stage3_prefetch_bucket_size`, `stage3_param_persistence_threshold`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import llmpar
from llmpar.strategies.data import largest_tensor_elements

SESSION = llmpar.Session(load_entry_points=False)


def plan_of(**data: Any) -> llmpar.Plan:
    return SESSION.evaluate({
        "model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
        "training": {"sequence_length": 4096, "micro_batch_size": 1, "global_batch_size": 32},
        "parallel": {"data": {"zero": 3, **data}}})


def gather(plan: llmpar.Plan) -> Any:
    (found,) = [c for c in plan.collectives if c.name == "data.dense-param-all-gather"]
    return found


def test_the_defaults_are_the_plan_without_the_settings():
    assert plan_of(prefetch_bucket_parameters=None,
                   persistence_threshold_parameters=None).to_dict() == plan_of().to_dict()


def test_norms_persist_below_deepspeeds_default_threshold_and_matrices_do_not():
    model = SESSION.load_spec({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}}).model
    assert largest_tensor_elements(model, "norms") == 4096 < 100_000  # RMSNorm weights
    assert largest_tensor_elements(model, "attention") == 4096 * 4096
    assert largest_tensor_elements(model, "embedding") == 4096 * 128_256


def test_persistent_weights_are_neither_sharded_nor_gathered():
    plain, whole = plan_of(), plan_of(persistence_threshold_parameters=100_000)
    norms = 32 * 2 * 4096 + 4096  # Llama-3-8B: two RMSNorms a layer and the final one
    bf16, ranks = 2, 16
    # each GPU holds the norms' weights whole instead of 1/16 of them
    assert whole.stages[0].weights_bytes - plain.stages[0].weights_bytes == pytest.approx(
        norms * bf16 * (1 - 1 / ranks), abs=2)
    assert whole.stages[0].gradients_bytes == plain.stages[0].gradients_bytes
    assert whole.stages[0].optimizer_bytes == plain.stages[0].optimizer_bytes
    # the gathers carry everything but the norms
    assert gather(plain).buffer_bytes - gather(whole).buffer_bytes == pytest.approx(
        norms * bf16, rel=1e-6)


def test_a_bucket_below_a_layer_prefetches_only_its_share():
    plain = plan_of()
    # Llama-3-8B's 8,030,261,248 weights less the embeddings' and the output layer's
    # (128,256 x 4,096 each, gathered as modules of their own) over its 32 layers
    layer = (8_030_261_248 - 2 * 128_256 * 4_096) / 32
    assert layer == 218_112_128
    half = plan_of(prefetch_bucket_parameters=int(layer // 2))
    assert gather(half).exposed_seconds > gather(plain).exposed_seconds
    # memory: the running layer and the bucket, instead of two layers
    assert plain.stages[0].buffers_bytes - half.stages[0].buffers_bytes == pytest.approx(
        (layer - layer // 2) * 2, rel=1e-6)
    # half of each gather runs ahead: the other half waits
    assert gather(half).exposed_seconds >= gather(half).seconds * 0.5


def test_a_larger_bucket_holds_more_and_hides_no_less():
    small, large = (plan_of(prefetch_bucket_parameters=n) for n in (50_000_000, 500_000_000))
    assert large.stages[0].buffers_bytes > small.stages[0].buffers_bytes
    assert gather(large).exposed_seconds <= gather(small).exposed_seconds


@pytest.mark.parametrize("key", ["prefetch_bucket_parameters",
                                 "persistence_threshold_parameters"])
def test_the_settings_need_zero_3(key):
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate({"model": "llama-3-8b",
                          "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
                          "training": {"sequence_length": 4096, "global_batch_size": 32},
                          "parallel": {"data": {"zero": 2, key: 1000}}})
    (problem,) = error.value.problems
    assert problem.path == f"$.parallel.data.{key}" and "zero = 3" in problem.message


def test_deepspeed_config_carries_the_settings_both_ways():
    spec = {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "training": {"sequence_length": 4096, "global_batch_size": 32},
            "parallel": {"data": {"zero": 3, "prefetch_bucket_parameters": 50_000_000,
                                  "persistence_threshold_parameters": 100_000}}}
    text = SESSION.launch(SESSION.load_spec(spec), "deepspeed").files[0].text
    zero = json.loads(text)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 50_000_000
    assert zero["stage3_param_persistence_threshold"] == 100_000
    read = SESSION.launch_targets.find("deepspeed").read(text, "ds_config.json")
    assert read.settings["parallel.data.prefetch_bucket_parameters"] == 50_000_000
    assert read.settings["parallel.data.persistence_threshold_parameters"] == 100_000
