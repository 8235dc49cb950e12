"""A Plan has a training part or serving pools; schema 1's flat fields stay readable,
and its JSON reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.plan_json import V1_KEYS

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
SESSION = llmpar.Session(load_entry_points=False)


@pytest.fixture(scope="module", params=["gpt3-175b-1024-a100", "inference-llama-2-70b-h100",
                                        "inference-qwen3-4b-int4-l40s"])
def plan(request):
    return SESSION.evaluate(EXAMPLES / f"{request.param}.toml")


def test_a_plan_has_one_part(plan):
    if plan.workload == "training":
        assert plan.training is not None and plan.serving == ()
        assert plan.step_seconds == plan.training.step_seconds and plan.kv_cache_bytes is None
    else:
        assert plan.training is None and len(plan.serving) == 1
        pool = plan.serving[0]
        assert plan.step_seconds == pool.latency_seconds
        assert plan.sequence_length == pool.context_tokens
        assert plan.activations_bytes == pool.workspace_bytes
        assert plan.train_tokens is None and plan.micro_batches_per_step == 1


def test_json_keeps_every_schema_1_key_in_order_then_the_parts(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    assert list(data)[:len(V1_KEYS)] == list(V1_KEYS)
    assert list(data)[len(V1_KEYS):] == ["training", "serving"]
    assert (data["training"] is None) == (plan.workload == "inference")


def test_json_reads_back_to_the_same_plan(plan):
    text = json.dumps(plan.to_dict())
    assert llmpar.Plan.from_dict(json.loads(text)) == plan


def test_a_schema_1_dict_without_parts_reads_back(plan):
    old = {key: value for key, value in plan.to_dict().items()
           if key not in ("training", "serving")}
    found = llmpar.Plan.from_dict(json.loads(json.dumps(old)))
    for key in V1_KEYS:
        assert getattr(found, key) == getattr(plan, key), key


def test_a_serving_pool_written_before_max_prompt_tokens_reads_back():
    plan = SESSION.evaluate(EXAMPLES / "inference-qwen3-4b-int4-l40s.toml")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["serving"][0]["max_prompt_tokens"] == 22_627
    for key in ("max_prompt_tokens", "max_prompt_tokens_limited_by"):
        del data["serving"][0][key]
    pool = llmpar.Plan.from_dict(data).serving[0]
    assert pool.max_prompt_tokens is None and pool.max_prompt_tokens_limited_by is None
    assert pool.max_context_tokens == plan.max_context_tokens


def test_strategies_notes_reach_the_report_json_and_explain():
    plan = SESSION.evaluate(EXAMPLES / "gpt3-175b-1024-a100.toml")
    assert [(n.strategy, n.text) for n in plan.notes] == [("data", "8 replicas, ZeRO stage 1")]
    assert plan.to_dict()["training"]["notes"] == [
        {"strategy": "data", "text": "8 replicas, ZeRO stage 1"}]
    assert "data: 8 replicas, ZeRO stage 1" in plan.explain()
    from llmpar.report import text_report

    assert "data: 8 replicas, ZeRO stage 1" in text_report(plan)


def test_evolve_changes_a_flat_field_in_its_part(plan):
    changed = plan.evolve(flops_per_step=1.0, fits=False)
    assert changed.flops_per_step == 1.0 and not changed.fits
    with pytest.raises(AttributeError, match="placeholder"):
        plan.evolve(train_tokens=1.0) if plan.workload == "inference" else plan.evolve(
            phases=())


def test_a_sequence_past_the_position_limit_warns_in_training_as_in_serving():
    """RoPE runs past max_position_embeddings (long-context extension): legitimate, but
    the plan says so, for a training sequence as for a served one."""
    spec = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "training": {"sequence_length": 16384}}
    trained = [w for w in SESSION.evaluate(spec).warnings if "max_position_embeddings" in w]
    assert trained == ["training.sequence_length (16,384) exceeds "
                       "model.max_position_embeddings (8,192): positions the model was not "
                       "trained on (long-context extension)"]
    served = [w for w in SESSION.evaluate(EXAMPLES / "inference-llama-2-70b-h100.toml",
                                          {"inference.prompt_tokens": 8192}).warnings
              if "max_position_embeddings" in w]
    assert len(served) == 1 and served[0].startswith("inference.prompt_tokens + "
                                                     "generated_tokens (")
    assert served[0].split(")", 1)[1].replace("4,096", "8,192") == trained[0].split(")", 1)[1]
    within = {**spec, "training": {"sequence_length": 8192}}
    assert not [w for w in SESSION.evaluate(within).warnings if "max_position" in w]
