"""Expert parallelism as it runs: uneven routing (`[parallel.expert] imbalance`) and the
all-to-all behind another micro-batch's compute (`overlap_a2a`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import llmpar
from llmpar.footprint.baseline import baseline_footprint
from llmpar.strategies.expert import routed_share

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLE = Path(__file__).resolve().parent.parent / "specs" / "examples" / (
    "mixtral-8x7b-ep8-tp2.toml")


def plan_of(**expert: Any) -> llmpar.Plan:
    return SESSION.evaluate(EXAMPLE, {f"parallel.expert.{k}": v for k, v in expert.items()})


def a2a(plan: llmpar.Plan) -> Any:
    (found,) = [c for c in plan.collectives if c.name == "expert.all-to-all"]
    return found


def test_the_defaults_are_the_plan_without_the_settings():
    assert plan_of(imbalance=1.0, overlap_a2a=False).to_dict() == plan_of().to_dict()


def test_routed_share_of_mixtral_counts_two_of_eight_experts_per_token():
    spec = SESSION.load_spec(EXAMPLE)
    model, forward = spec.model, baseline_footprint(spec).forward_flops_per_sequence
    assert forward is not None and model.moe is not None and model.hidden_size is not None
    # SwiGLU experts: three h x ffn matrices, 2 FLOPs per multiply-accumulate, k = 2.
    routed = (2 * spec.training.sequence_length * model.num_layers * 2
              * 3 * model.hidden_size * model.moe.expert_ffn_hidden_size)
    assert routed_share(spec, forward) == pytest.approx(routed / forward.executed_total)
    assert 0.7 < routed_share(spec, forward) < 0.9  # most of what Mixtral multiplies


def test_a_dense_model_has_no_routed_share():
    spec = SESSION.load_spec(EXAMPLE.parent / "llama-3-8b-fsdp-8-h100.toml")
    assert routed_share(spec, baseline_footprint(spec).forward_flops_per_sequence) == 0.0


def test_the_busiest_rank_paces_the_experts_and_the_all_to_all():
    even, uneven = plan_of(), plan_of(imbalance=1.5)
    assert a2a(uneven).buffer_bytes == pytest.approx(1.5 * a2a(even).buffer_bytes, rel=1e-6)
    assert uneven.flops_per_step == even.flops_per_step
    assert uneven.hardware_flops_per_step == even.hardware_flops_per_step
    assert uneven.compute_seconds > even.compute_seconds
    assert uneven.mfu < even.mfu


@pytest.mark.parametrize("low, high", [(1.0, 1.1), (1.1, 1.5), (1.5, 3.0)])
def test_more_imbalance_is_slower(low, high):
    assert plan_of(imbalance=high).step_seconds > plan_of(imbalance=low).step_seconds


def test_overlapped_all_to_all_leaves_one_micro_batch_exposed():
    plain, overlapped = a2a(plan_of()), a2a(plan_of(overlap_a2a=True))
    m = plan_of().training.micro_batches_per_step
    assert plain.exposed_seconds == plain.seconds
    assert overlapped.exposed_seconds == pytest.approx(plain.seconds / m)


def test_one_micro_batch_has_nothing_to_overlap_with():
    spec = {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": {"sequence_length": 4096, "global_batch_size": 8, "recompute": "full"},
            "parallel": {"data": {"zero": 1}, "expert": {"degree": 8, "overlap_a2a": True}}}
    plan = SESSION.evaluate(spec)
    assert plan.training.micro_batches_per_step == 1
    assert a2a(plan).exposed_seconds == pytest.approx(a2a(plan).seconds)


@pytest.mark.parametrize("value", [0.5, 0, float("inf")])
def test_an_imbalance_below_one_is_refused(value):
    with pytest.raises(llmpar.SpecError) as error:
        plan_of(imbalance=value)
    assert error.value.problems[0].path == "$.parallel.expert.imbalance"
