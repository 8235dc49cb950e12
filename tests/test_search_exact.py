"""The search's one-by-one scorer gives `llmpar.evaluate`'s numbers, computing each kind
of stage once."""

from __future__ import annotations

import pytest
from search_specs import MOE_MODEL, SMALL_MODEL

import llmpar
from llmpar.evaluation.cache import EvaluationCache
from llmpar.evaluation.evaluate import score
from llmpar.evaluation.facts import stage_kinds
from llmpar.loading.checks import resolve_layout
from llmpar.strategies.pipeline import PipelineConfig, in_flight
from llmpar.strategy import Stage

LAYOUTS = [
    {"pipeline": {"degree": 4, "schedule": "1f1b"}, "tensor": {"degree": 2}},
    {"pipeline": {"degree": 2, "schedule": "interleaved", "virtual_stages": 2}},
    {"pipeline": {"degree": 3, "layers_per_stage": [1, 2, 1], "schedule": "gpipe"},
     "data": {"zero": 3}},
    {"pipeline": {"degree": 2, "schedule": "zero-bubble"}, "context": {"degree": 2},
     "sequence": {}, "tensor": {"degree": 2}},
]


@pytest.mark.parametrize("model", [SMALL_MODEL, MOE_MODEL, {**SMALL_MODEL,
                                                            "tie_embeddings": True}])
@pytest.mark.parametrize("parallel", LAYOUTS)
@pytest.mark.parametrize("recompute", [("none", None), ("full", 1)])
def test_scores_equal_evaluate(model, parallel, recompute):
    mode, layers = recompute
    degrees = [table.get("degree", 1) for table in parallel.values()]
    num_gpus = 1
    for degree in degrees:
        num_gpus *= degree
    spec = llmpar.load_spec({
        "model": {**model, "num_layers": 4},
        "hardware": {"cluster": "dgx-a100", "num_gpus": num_gpus * 2, "gpus_per_node": 4},
        "training": {"sequence_length": 512, "global_batch_size": 32, "recompute": mode,
                     "recompute_layers": layers},
        "parallel": {**parallel, "data": {**parallel.get("data", {}), "degree": 2}}})
    session = llmpar.default_session()
    layout, _ = resolve_layout(spec, session.strategies)
    total, device, seconds, _ = score(spec, layout, session.strategies, EvaluationCache())
    plan = llmpar.evaluate(spec)
    assert (total, seconds) == (plan.total_bytes, plan.step_seconds)
    assert device == plan.derivation("device_bytes").value


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "gpipe", "zero-bubble"])
def test_earlier_stages_hold_no_fewer_micro_batches(schedule):
    """What keeping one stage per kind relies on: in flight never grows with the index."""
    config = PipelineConfig(degree=8, schedule=schedule,
                            virtual_stages=2 if schedule == "interleaved" else 1)
    for m in (1, 4, 8, 64):
        held = [in_flight(config, stage, m) for stage in range(8)]
        assert held == sorted(held, reverse=True)


def test_stages_are_grouped_by_kind():
    spec = llmpar.load_spec({"model": SMALL_MODEL, "hardware": {"gpu": "a100-sxm-80gb"}})
    stages = tuple(Stage(index=i, first_layer=i, num_layers=1, has_embedding=i == 0,
                         has_head=i == 3, micro_batches_in_flight=4 - i) for i in range(4))
    kinds = stage_kinds(spec, stages)
    assert [s.index for s in kinds.representatives] == [0, 1, 3]
    assert kinds.members == ((0,), (1, 2), (3,)) and kinds.kind_of == (0, 1, 1, 2)
