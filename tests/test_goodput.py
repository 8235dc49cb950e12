"""Goodput of a whole run (`[training.goodput]`): checkpoints and interruptions, after
Young (1974); hand-checks against the Llama 3 paper's interruption rate."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar
from llmpar.report import text_report
from llmpar.spec.workload import LLAMA3_INTERRUPTIONS_PER_GPU_DAY

SESSION = llmpar.Session(load_entry_points=False)


def spec_8b(num_gpus: int = 64, **goodput: Any) -> dict[str, Any]:
    """Llama-3-8B with FSDP, 1T tokens, checkpoints to storage at 100 GB/s."""
    table = {"storage_bandwidth_bytes_per_s": "100 GB/s", **goodput}
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": num_gpus},
            "training": {"sequence_length": 4096, "global_batch_size": 4 * num_gpus,
                         "micro_batch_size": 4, "recompute": "full", "tokens": 1e12,
                         "activation_model": "fused", "goodput": table},
            "parallel": {"data": {"fsdp": True}}}


def goodput_of(spec: dict[str, Any]) -> Any:
    plan = SESSION.evaluate(spec)
    assert plan.training is not None and plan.training.goodput is not None
    return plan.training.goodput


def test_without_the_table_the_run_counts_its_steps_only():
    spec = spec_8b()
    del spec["training"]["goodput"]
    plan = SESSION.evaluate(spec)
    assert plan.training is not None and plan.training.goodput is None
    assert "goodput_fraction" not in {d.quantity for d in plan.derivations}


def test_llama_3_rate_is_one_interruption_about_every_three_hours_on_16k_gpus():
    # Llama 3 paper, Sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs.
    rate_per_job_day = LLAMA3_INTERRUPTIONS_PER_GPU_DAY * 16_384
    assert rate_per_job_day == pytest.approx(419 / 54)
    assert 86_400 / rate_per_job_day / 3600 == pytest.approx(3.09, abs=0.01)


def test_checkpoint_holds_weights_and_optimizer_states_of_every_parameter():
    plan = SESSION.evaluate(spec_8b())
    goodput = goodput_of(spec_8b())
    # bf16 weights (2 B) + mixed-precision Adam's fp32 master, m and v (12 B), no gradients.
    assert goodput.checkpoint_bytes == pytest.approx(14 * plan.parameters)
    assert goodput.checkpoint_write_seconds == pytest.approx(goodput.checkpoint_bytes / 100e9)
    assert goodput.checkpoint_blocking_seconds == goodput.checkpoint_write_seconds


def test_young_interval_and_the_goodput_it_gives():
    goodput = goodput_of(spec_8b(restart_seconds="5 min"))
    d, between = goodput.checkpoint_blocking_seconds, goodput.seconds_between_interruptions
    assert between == pytest.approx(86_400 / (LLAMA3_INTERRUPTIONS_PER_GPU_DAY * 64))
    tau = math.sqrt(2 * d * between)
    assert goodput.checkpoint_interval_seconds == pytest.approx(tau)
    lost = 300 + d + (tau + d) / 2
    assert goodput.lost_seconds_per_interruption == pytest.approx(lost)
    assert goodput.goodput_fraction == pytest.approx(tau / (tau + d) * (1 - lost / between))


def test_wall_time_is_train_time_over_goodput():
    plan = SESSION.evaluate(spec_8b(restart_seconds=600))
    goodput = plan.training.goodput
    assert plan.train_seconds is not None
    assert goodput.wall_seconds == pytest.approx(plan.train_seconds / goodput.goodput_fraction)
    assert goodput.interruptions == pytest.approx(
        goodput.wall_seconds / goodput.seconds_between_interruptions)
    assert {"checkpoint_bytes", "goodput_fraction", "wall_seconds"} <= {
        d.quantity for d in plan.derivations}


@pytest.mark.parametrize("factor", [0.25, 0.5, 2.0, 4.0])
def test_young_interval_beats_other_intervals(factor):
    best = goodput_of(spec_8b(restart_seconds=60))
    other = goodput_of(spec_8b(restart_seconds=60, checkpoint_interval_seconds=(
        best.checkpoint_interval_seconds * factor)))
    assert other.goodput_fraction < best.goodput_fraction


def test_no_interruptions_and_no_interval_lose_nothing():
    goodput = goodput_of(spec_8b(interruptions_per_gpu_day=0))
    assert goodput.checkpoint_interval_seconds is None
    assert goodput.seconds_between_interruptions is None
    assert goodput.goodput_fraction == 1.0


def test_a_stated_interval_without_interruptions_costs_only_the_checkpoints():
    goodput = goodput_of(spec_8b(interruptions_per_gpu_day=0, checkpoint_interval_seconds="30 min"))
    d = goodput.checkpoint_blocking_seconds
    assert goodput.goodput_fraction == pytest.approx(1800 / (1800 + d))


def test_asynchronous_checkpoints_stop_training_only_for_the_copy_to_host():
    spec = spec_8b(asynchronous=True)
    plan = SESSION.evaluate(spec)
    goodput = plan.training.goodput
    peak = next(s for s in plan.stages if s.stage == plan.peak_stage)
    host = 63e9  # dgx-h100 preset: PCIe Gen5 x16, 63 GB/s each way
    assert SESSION.load_spec(spec).hardware.host_bandwidth_bytes_per_s == host
    assert goodput.checkpoint_blocking_seconds == pytest.approx(
        (peak.weights_bytes + peak.optimizer_bytes) / host)
    assert goodput.goodput_fraction > goodput_of(spec_8b()).goodput_fraction


def test_asynchronous_checkpoints_need_the_host_bandwidth():
    spec = spec_8b(asynchronous=True)
    spec["hardware"] = {"gpu": "h100-sxm", "num_gpus": 64, "gpus_per_node": 8}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec)
    assert [p.path for p in error.value.problems] == ["$.training.goodput.asynchronous"]


def test_storage_bandwidth_is_required_and_positive():
    spec = spec_8b()
    spec["training"]["goodput"] = {"storage_bandwidth_bytes_per_s": 0}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec)
    assert error.value.problems[0].path == "$.training.goodput.storage_bandwidth_bytes_per_s"
    spec["training"]["goodput"] = {}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec)
    assert error.value.problems[0].path == "$.training.goodput.storage_bandwidth_bytes_per_s"


@given(small=st.sampled_from([8, 16, 32]), factor=st.sampled_from([2, 4, 8]))
def test_goodput_falls_as_the_job_grows(small, factor):
    # More GPUs: interruptions come more often, and every one stops the whole job.
    assert goodput_of(spec_8b(small * factor, restart_seconds=600)).goodput_fraction < (
        goodput_of(spec_8b(small, restart_seconds=600)).goodput_fraction)


def test_the_report_shows_the_run_with_its_checkpoints():
    text = text_report(SESSION.evaluate(spec_8b(restart_seconds=600)))
    assert "goodput" in text and "wall time" in text and "(steps only)" in text
