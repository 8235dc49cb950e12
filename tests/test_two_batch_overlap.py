"""Two-batch overlap (`[inference] two_batch_overlap`, llmpar.inference.overlap): the
expert all-to-all of one micro-batch hidden behind the other's computation, at the price
of reading every weight once per micro-batch."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import llmpar

SESSION = llmpar.Session(load_entry_points=False)


def spec(batch: int = 256, overlap: bool = True, **inference: Any) -> dict[str, Any]:
    """DeepSeek-V3 decoding on 64 H100 under EP64, as SGLang's large-scale EP run."""
    return {"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100", "num_gpus": 64},
            "inference": {"batch_size": batch, "prompt_tokens": 2000, "generated_tokens": 2,
                          "prefill_chunk_tokens": batch, "weights": "fp8",
                          "weights_group_size": 16384, "two_batch_overlap": overlap,
                          **inference},
            "parallel": {"data": {"degree": 64}, "expert": {"degree": 64}}}


def decode(plan: llmpar.Plan) -> dict[str, Any]:
    [phase] = [p for p in plan.to_dict()["serving"][0]["phases"] if p["name"] == "decode"]
    return phase


def test_off_by_default_changes_nothing():
    unset = copy.deepcopy(spec())
    del unset["inference"]["two_batch_overlap"]
    assert SESSION.evaluate(unset).to_dict() == SESSION.evaluate(spec(overlap=False)).to_dict()


def test_the_all_to_all_is_exposed_at_least_beyond_the_computation():
    """Decode hides each transfer behind its own stages only (SGLang's staged schedule,
    tests/test_decode_first_principles.py): never less exposed than max(0, M - W)."""
    phase = decode(SESSION.evaluate(spec()))
    work = phase["compute_seconds"] + phase["memory_seconds"]
    plan = SESSION.evaluate(spec())
    collectives = plan.to_dict()["serving"][0]["collectives"]
    overlapped = [c for c in collectives if c["hides_behind"] == "other-micro-batch"]
    assert overlapped and all(c["strategy"] == "expert" for c in overlapped)
    total = sum(c["seconds"] for c in overlapped)
    exposed = sum(c["exposed_seconds"] for c in overlapped)
    assert max(0.0, total - work) <= exposed <= total
    assert phase["communication_seconds"] == pytest.approx(exposed)


def test_two_micro_batches_keep_the_flops_and_read_the_weights_twice():
    whole, split = decode(SESSION.evaluate(spec(overlap=False))), decode(SESSION.evaluate(spec()))
    assert split["flops"] == pytest.approx(whole["flops"], rel=1e-12)
    assert split["bytes"] > whole["bytes"]
    # Each decode collective runs once per micro-batch, on half the tokens (the prefill,
    # in chunks of less than two sequences, runs whole: its collectives stay as they were).
    plain = SESSION.evaluate(spec(overlap=False)).to_dict()["serving"][0]["collectives"]
    halves = SESSION.evaluate(spec()).to_dict()["serving"][0]["collectives"]
    pairs = [(b, a) for b, a in zip(plain, halves) if a["hides_behind"] == "other-micro-batch"]
    assert len(pairs) == 1
    for before, after in pairs:
        assert after["calls_per_step"] == 2 * before["calls_per_step"]
        assert after["buffer_bytes"] == pytest.approx(before["buffer_bytes"] / 2, abs=1)


def test_a_dense_model_only_pays():
    dense = {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 2},
             "inference": {"batch_size": 32, "prompt_tokens": 1024, "generated_tokens": 128},
             "parallel": {"tensor": {"degree": 2}}}
    overlapped = copy.deepcopy(dense)
    overlapped["inference"]["two_batch_overlap"] = True
    assert (SESSION.evaluate(overlapped).serving[0].tpot_seconds
            >= SESSION.evaluate(dense).serving[0].tpot_seconds)


def test_one_sequence_cannot_be_split():
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec(batch=1))
    assert [p.path for p in error.value.problems] == ["$.inference.two_batch_overlap"]
    assert "batch_size >= 2" in error.value.problems[0].message


def test_what_hides_is_what_the_collective_states_not_its_strategy_name():
    """Any strategy's collective that states `overlaps_micro_batch` hides behind the other
    micro-batch; one that does not stays as it was, whatever its strategy is called."""
    from llmpar.inference.overlap import behind_other_micro_batch
    from llmpar.plan import CollectiveCost

    def cost(strategy: str, seconds: float) -> CollectiveCost:
        return CollectiveCost(strategy=strategy, operation="all-to-all", name=f"{strategy}.a2a",
                              buffer_bytes=1, group_size=8, tier="inter-node",
                              calls_per_step=1.0, seconds=seconds, exposed_seconds=seconds,
                              hides_behind="compute", reason="")

    costs = [cost("my-experts", 3.0), cost("expert", 1.0)]
    after = behind_other_micro_batch(costs, [True, False], work_seconds=2.0)
    assert after[0].exposed_seconds == pytest.approx(1.0)  # 3 s behind 2 s of work
    assert after[0].hides_behind == "other-micro-batch"
    assert after[1] == costs[1]
