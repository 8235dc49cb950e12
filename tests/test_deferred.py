"""A plan's derivations are built on first read (`llmpar.deferred`): the plan reads,
compares, hashes, pickles and serializes as one built with them at once."""

from __future__ import annotations

import json
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.deferred import deferred, deferring
from llmpar.plan import ServingPool

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
NAMES = ["gpt3-175b-1024-a100", "llama-3-70b-goodput-1024-h100", "llama-3-8b-lora-rtx-4090",
         "llama-3.2-3b-offload-a100", "inference-llama-2-70b-h100"]
SERVING = ["inference-llama-2-70b-h100", "inference-deepseek-v3-h200",
           "serve-deepseek-v3-mtp-h200", "serve-llama-3.1-70b-10-rps-h100",
           "serve-llama-3.1-70b-1p1d-h100", "inference-qwen3-4b-int4-l40s"]


def fresh(name: str) -> llmpar.Plan:
    return llmpar.Session(load_entry_points=False).evaluate(EXAMPLES / f"{name}.toml")


@pytest.mark.parametrize("name", sorted(set(NAMES + SERVING)))
def test_a_plan_equals_its_re_evaluation_and_reads_back(name):
    plan, again = fresh(name), fresh(name)
    assert plan == again and hash(plan) == hash(again)
    assert pickle.loads(pickle.dumps(fresh(name))) == plan
    assert llmpar.Plan.from_dict(json.loads(json.dumps(fresh(name).to_dict()))) == plan


@pytest.mark.parametrize("name", sorted(set(NAMES + SERVING)))
def test_the_deferred_derivations_are_those_stored_at_once(name):
    plan = fresh(name)
    eager = attrs.evolve(fresh(name), derivations=tuple(plan.derivations))
    assert eager == fresh(name)
    assert fresh(name).explain() == eager.explain() == plan.explain()
    assert json.dumps(fresh(name).to_dict()) == json.dumps(eager.to_dict())
    quantities = [d.quantity for d in plan.derivations]
    assert "total_bytes" in quantities and len(quantities) == len(set(quantities))


def test_a_training_plan_explains_its_step_and_run_as_before():
    plan = fresh("gpt3-175b-1024-a100")
    step = plan.derivation("step_seconds")
    assert step.value == plan.step_seconds and plan.training is not None
    assert plan.derivation("mfu").value == plan.mfu
    # train_seconds cites the step time's own source (its first derivation's)
    if plan.train_seconds is not None:
        assert plan.derivation("train_seconds").source == step.source


@attrs.frozen
class _Record:
    number: int
    built: tuple[int, ...] = ()


deferring(_Record, "built")


def test_a_deferred_field_is_built_once_per_instance_on_first_read():
    calls: list[int] = []

    def build() -> tuple[int, ...]:
        calls.append(1)
        return (1, 2)

    record = _Record(3, deferred(build))
    assert calls == []
    assert record.built == (1, 2) and record.built == (1, 2) and calls == [1]
    assert record == _Record(3, (1, 2)) and hash(record) == hash(_Record(3, (1, 2)))
    assert pickle.loads(pickle.dumps(_Record(3, deferred(build)))) == record
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.built = ()  # type: ignore[misc]


def test_a_deferred_field_read_from_threads_gives_one_value():
    gate = threading.Barrier(8)

    def build() -> tuple[int, ...]:
        return tuple(range(100))

    record = _Record(1, deferred(build))

    def read(_: int) -> tuple[int, ...]:
        gate.wait()
        return record.built

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(read, range(8))) == {tuple(range(100))}


def test_only_a_slot_can_defer():
    with pytest.raises(TypeError):
        deferring(_Record, "built")


def test_a_pipelined_plan_lists_every_stage_and_its_peak_stage_holds_its_numbers():
    plan = fresh("gpt3-175b-1024-a100")
    assert isinstance(plan.stages, tuple)
    assert len(plan.stages) == plan.layout["pipeline"] > 1
    assert [s.stage for s in plan.stages] == list(range(len(plan.stages)))
    peak = plan.stages[plan.peak_stage]
    assert (peak.weights_bytes, peak.total_bytes, peak.activations_bytes) == (
        plan.weights_bytes, plan.total_bytes, plan.activations_bytes)
    assert plan.host_bytes == max(s.host_bytes for s in plan.stages)
    assert sum(s.layers for s in plan.stages) >= 96  # GPT-3 175B: 96 layers


def test_stage_records_are_made_when_indexed_and_equal_in_any_order():
    from llmpar.evaluation.evaluate import evaluate_core, transforms_of
    from llmpar.evaluation.memory import stage_records

    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec(EXAMPLES / "gpt3-175b-1024-a100.toml")
    footprint = session.cache.footprint(spec)
    layout = session._layout_of(spec)
    transforms = transforms_of(spec, footprint, layout, session.strategies)
    core = evaluate_core(spec, footprint, layout, transforms)
    forward, _ = stage_records(core.memory, core.stages, core.kinds)
    backward, _ = stage_records(core.memory, core.stages, core.kinds)
    assert [backward[i] for i in reversed(range(len(backward)))][::-1] == list(forward)
    assert forward[2:5] == tuple(forward)[2:5] and forward[-1] == tuple(forward)[-1]


@pytest.mark.parametrize("name", NAMES[:-1])
def test_the_training_parts_deferred_records_are_those_stored_at_once(name):
    plan = fresh(name)
    part = plan.training
    assert part is not None
    eager = attrs.evolve(fresh(name).training, collectives=tuple(part.collectives),
                         notes=tuple(part.notes), step_time_trust=str(part.step_time_trust))
    assert eager == fresh(name).training == part
    # the step's communication is its collectives' seconds, summed in their order
    assert part.communication_seconds == float(sum(c.seconds for c in part.collectives))
    assert plan.collectives == part.collectives and plan.notes == part.notes


def _eager_pools(plan: llmpar.Plan) -> tuple[ServingPool, ...]:
    return tuple(attrs.evolve(pool, notes=tuple(pool.notes),
                              decode_compute_bound_batch_size=pool.decode_compute_bound_batch_size)
                 for pool in plan.serving)


@pytest.mark.parametrize("name", SERVING)
def test_the_serving_pools_deferred_records_are_those_stored_at_once(name):
    plan = fresh(name)
    assert plan.serving
    eager = attrs.evolve(fresh(name), serving=_eager_pools(fresh(name)),
                         derivations=tuple(fresh(name).derivations))
    assert eager == plan == fresh(name) and hash(eager) == hash(fresh(name))
    assert fresh(name).explain() == eager.explain()
    assert json.dumps(fresh(name).to_dict()) == json.dumps(eager.to_dict())
    assert pickle.loads(pickle.dumps(fresh(name))).to_dict() == eager.to_dict()
    assert plan.decode_compute_bound_batch_size == plan.serving[0].decode_compute_bound_batch_size


def test_the_compute_bound_batch_read_late_is_the_search_on_the_plans_serving():
    from llmpar.inference.evaluate import serving_of, timing_of
    from llmpar.inference.phases import compute_bound_batch

    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec(EXAMPLES / "inference-deepseek-v3-h200.toml")
    plan = session.evaluate(spec)
    serving = serving_of(spec, session._layout_of(spec), session.strategies)
    timing = timing_of(serving)
    assert timing.compute_bound_batch == compute_bound_batch(serving, timing.rates)
    assert plan.decode_compute_bound_batch_size == timing.compute_bound_batch
    derivation = plan.derivation("decode_compute_bound_batch_size")
    assert derivation.value == timing.compute_bound_batch
