"""What a session keeps between evaluations, and reuses within one, never changes a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.evaluation.cache import EvaluationCache, layers_of
from llmpar.strategy import Stage

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


@pytest.mark.parametrize("name", ["gpt3-175b-1024-a100.toml", "inference-deepseek-v3-h200.toml",
                                  "serve-deepseek-v3-mtp-h200.toml"])
def test_a_session_that_keeps_nothing_plans_the_same(name):
    keeping = llmpar.Session(load_entry_points=False)
    forgetting = llmpar.Session(load_entry_points=False)
    forgetting.cache = EvaluationCache(size=0)
    spec = keeping.load_spec(EXAMPLES / name)
    first = json.dumps(keeping.evaluate(spec).to_dict(), sort_keys=True)
    again = json.dumps(keeping.evaluate(spec).to_dict(), sort_keys=True)
    cold = json.dumps(forgetting.evaluate(spec).to_dict(), sort_keys=True)
    assert first == again == cold


def stages(p: int, layers: int = 8) -> tuple[Stage, ...]:
    per = layers // p
    return tuple(Stage(index=i, first_layer=i * per, num_layers=per, has_embedding=i == 0,
                       has_head=i == p - 1, micro_batches_in_flight=float(p - i))
                 for i in range(p))


def test_the_layers_key_is_the_stages_layers_whichever_object_asks():
    cache = EvaluationCache()
    two, four = stages(2), stages(4)
    assert cache.layers_key(two) == layers_of(two)
    assert cache.layers_key(four) == layers_of(four) != layers_of(two)
    assert cache.layers_key(stages(2)) == layers_of(two)  # an equal tuple, another object
    assert cache.layers_key(two) == layers_of(two)
