"""The pipeline runs at the pace of its slowest stage (llmpar.evaluation.balance)."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.evaluation.balance import slowest_stage_factor, stage_flops
from llmpar.evaluation.evaluate import transforms_of
from llmpar.evaluation.stages import stages_of
from llmpar.footprint.baseline import baseline_footprint
from llmpar.loading.checks import resolve_layout

SESSION = llmpar.Session(load_entry_points=False)


def stages(spec):
    layout, problems = resolve_layout(spec, SESSION.strategies)
    assert not problems
    return stages_of(spec, transforms_of(spec, baseline_footprint(spec), layout,
                                         SESSION.strategies))


def llama(pipeline: dict, recompute: str = "none"):
    return SESSION.load_spec({
        "model": "llama-3-8b", "hardware": {"cluster": "dgx-a100", "num_gpus": 8},
        "training": {"sequence_length": 8192, "global_batch_size": 64,
                     "recompute": recompute, "attention_flops": "full"},
        "parallel": {"pipeline": pipeline}})


def test_the_output_layer_weighs_on_the_last_stage():
    """Llama-3-8B in 8 stages of 4 layers: per token a layer multiplies 218.1M weights
    (Q 4096^2, K and V 4096 x 1024, output 4096^2, MLP 3 x 4096 x 14336) and attends over
    8192 positions (2 x 8192 x 4096 x 2 FLOPs), the output layer multiplies 4096 x
    128,256; the last stage does the most."""
    spec = llama({"degree": 8})
    work = stage_flops(spec, stages(spec), 0.0)
    layer = 3 * (218_103_808 + 8192 * 2 * 4096)
    head = 3 * 4096 * 128_256
    assert work[:-1] == [pytest.approx(4 * layer)] * 7
    assert work[-1] == pytest.approx(4 * layer + head)
    assert slowest_stage_factor(spec, stages(spec), 0.0) == pytest.approx(
        8 * (4 * layer + head) / (32 * layer + head))


def test_one_stage_and_even_work_cost_nothing():
    spec = llama({"degree": 1})
    assert slowest_stage_factor(spec, stages(spec), 0.0) == 1.0


def test_moving_layers_off_the_last_stage_evens_the_pace():
    even = llama({"degree": 8})
    shifted = llama({"degree": 8, "layers_per_stage": [5, 5, 4, 4, 4, 4, 4, 2]})
    assert slowest_stage_factor(shifted, stages(shifted), 0.0) < slowest_stage_factor(
        even, stages(even), 0.0)


def test_the_plan_step_follows_the_slowest_stage():
    even = SESSION.evaluate(llama({"degree": 8}))
    shifted = SESSION.evaluate(llama({"degree": 8, "layers_per_stage": [5, 5, 4, 4, 4, 4, 4, 2]}))
    assert shifted.step_seconds < even.step_seconds
    assert shifted.hardware_flops_per_step == even.hardware_flops_per_step
