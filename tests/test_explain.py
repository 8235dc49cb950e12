"""`Plan.explain(field)` answers for every field of `plan.to_dict()`."""

from __future__ import annotations

import math

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.plan_explain import explain_field, format_path, leaf_paths, parse_path

EXAMPLES = ("gpt3-175b-1024-a100", "mixtral-8x7b-ep8-a100", "llama-3-70b-goodput-1024-h100",
            "llama-3-70b-qlora-2x-l40s", "inference-llama-2-70b-h100",
            "serve-llama-3.1-70b-fp8-vllm-4-h100")
"""Training (dense, pipelined, MoE, goodput, QLoRA) and serving (static, continuous)."""


def _plan(name: str) -> llmpar.Plan:
    return llmpar.evaluate(llmpar.default_session().presets.path("examples", name))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_leaf_of_the_plan_is_explained(name):
    plan = _plan(name)
    data = plan.to_dict()
    recorded = {d.quantity: d for d in plan.derivations}
    for path in leaf_paths(data):
        field = format_path(path)
        # Plan.explain(field) is the recorded derivation of that name, else this:
        derivation = recorded.get(field) or explain_field(plan, field, data)
        text = derivation.render()
        assert "no derivation recorded" not in text
        assert derivation.rule.strip() and derivation.source.strip(), field
        assert text.startswith(f"{derivation.quantity} = ")
    assert plan.explain("layout.data") == explain_field(plan, "layout.data").render()


def test_paths_round_trip_and_bad_paths_are_key_errors():
    assert parse_path("stages[0].total_bytes") == ("stages", 0, "total_bytes")
    assert format_path(("serving", 0, "phases", 1, "seconds")) == "serving[0].phases[1].seconds"
    plan = _plan("gpt3-175b-1024-a100")
    for bad in ("nope", "stages[99].total_bytes", "stages.total_bytes", "[0]",
                "training..mfu", "mfu.x"):
        with pytest.raises(KeyError):
            plan.explain(bad)


def test_recorded_derivations_are_the_numbers_they_explain():
    """mfu, hfu, tokens_per_second, gpu_hours and train_steps are recorded by the code that
    computes them, with inputs that give the number back."""
    plan = _plan("gpt3-175b-1024-a100")
    training = plan.training
    assert training is not None
    mfu = plan.explanation("training.mfu")
    assert mfu.value == training.mfu
    inputs = mfu.inputs
    assert math.isclose(float(inputs["flops_per_step"]) / (
        float(inputs["num_gpus"]) * float(inputs["peak_flops_per_s"])
        * float(inputs["step_seconds"])), training.mfu)
    hfu = plan.explanation("hfu")
    assert hfu.value == training.hfu and hfu.inputs["hardware_flops_per_step"] == \
        training.hardware_flops_per_step
    assert plan.explanation("tokens_per_second").value == training.tokens_per_second
    hours = plan.explanation("training.gpu_hours")
    assert hours.value == training.gpu_hours
    assert math.isclose(float(hours.inputs["train_seconds"]) * plan.num_gpus / 3600,
                        training.gpu_hours)
    assert plan.explanation("train_steps").value == training.train_steps


def test_generated_relations_hold_on_the_records():
    plan = _plan("gpt3-175b-1024-a100")
    stage = plan.explanation("stages[0].total_bytes")
    assert sum(int(v) for v in stage.inputs.values()) == plan.stages[0].total_bytes
    total = plan.explanation("communication_seconds")
    assert math.isclose(sum(float(v) for v in total.inputs.values()),
                        plan.communication_seconds)
    collective = plan.explanation("collectives[2].seconds")
    assert collective.inputs["buffer_bytes"] == plan.collectives[2].buffer_bytes
    assert "spec" in plan.explanation("layout.tensor").source
    assert "hardware.num_gpus" in plan.explanation("num_gpus").rule
    serving = _plan("inference-llama-2-70b-h100")
    assert serving.explanation("serving[0].tpot_seconds").quantity == "tpot_seconds"
    assert "latency_seconds" in serving.explanation("step_seconds").quantity
    assert "no value in an inference plan" in serving.explanation("train_tokens").rule


def test_explain_cli_takes_a_path_and_suggests_one(capsys):
    assert main(["explain", "gpt3-175b-1024-a100", "collectives[2].exposed_seconds"]) == 0
    assert "window_seconds" in capsys.readouterr().out
    assert main(["explain", "gpt3-175b-1024-a100", "training.mfx"]) == 2
    assert "did you mean 'training.mfu'" in capsys.readouterr().err
