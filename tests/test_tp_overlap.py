"""Tensor-parallel communication overlapped with the products (`[parallel.sequence]
comm_overlap = "pipelined"`: Transformer Engine's userbuffers, torchtitan's AsyncTP), and
what its kernels take from the products they hide behind (`Collective.compute_share`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLE = Path(__file__).resolve().parent.parent / "specs" / "examples" / (
    "gpt3-175b-1024-a100.toml")  # TP8 with sequence parallelism, PP16
SPEC = SESSION.load_spec(EXAMPLE)


def plan_of(**sequence: Any) -> llmpar.Plan:
    overrides = {f"parallel.sequence.{key}": value for key, value in sequence.items()}
    return SESSION.evaluate(EXAMPLE if overrides else SPEC, overrides)


def by_name(plan: llmpar.Plan, name: str) -> list[Any]:
    return [c for c in plan.collectives if c.name == name]


def test_none_is_the_plan_without_the_setting():
    assert plan_of(comm_overlap="none").to_dict() == plan_of().to_dict()


def test_a_pipelined_all_gather_leaves_one_chunk_per_tensor_rank_exposed():
    (gather,) = by_name(plan_of(comm_overlap="pipelined"), "sequence.all-gather")
    assert gather.hides_behind == "projections" and gather.pieces == 8
    assert gather.exposed_seconds == pytest.approx(gather.seconds / 8)


def test_a_pipelined_reduce_scatter_pays_one_split_and_its_share_of_the_gpu():
    (scatter,) = by_name(plan_of(comm_overlap="pipelined"), "sequence.reduce-scatter")
    share = 20 / 132  # NeMo's H100 userbuffers: 24 and 16 of 132 SMs
    unhidden = scatter.seconds / 4
    assert scatter.exposed_seconds == pytest.approx(
        unhidden + share * (scatter.seconds - unhidden))


def test_pipelining_hides_what_was_on_the_critical_path():
    before, after = plan_of(), plan_of(comm_overlap="pipelined")
    assert after.exposed_communication_seconds < before.exposed_communication_seconds
    assert after.step_seconds < before.step_seconds
    assert after.compute_seconds == before.compute_seconds


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3, 0.6])
def test_a_larger_share_of_the_gpu_exposes_more(share):
    lower = plan_of(comm_overlap="pipelined", overlap_compute_share=share)
    higher = plan_of(comm_overlap="pipelined", overlap_compute_share=share + 0.2)
    assert higher.step_seconds > lower.step_seconds


def test_more_splits_expose_less():
    assert plan_of(comm_overlap="pipelined", overlap_splits=8).step_seconds < plan_of(
        comm_overlap="pipelined", overlap_splits=2).step_seconds


@pytest.mark.parametrize("key, value, expected", [
    ("overlap_compute_share", 1.0, "[0, 1)"),
    ("overlap_compute_share", -0.1, "[0, 1)"),
    ("comm_overlap", "bulk", "one of"),
    ("overlap_splits", 0, "> 0"),
])
def test_bad_settings_are_named(key, value, expected):
    with pytest.raises(llmpar.SpecError) as error:
        plan_of(**{"comm_overlap": "pipelined", key: value})
    (problem,) = error.value.problems
    assert problem.path == f"$.parallel.sequence.{key}" and expected in problem.message


def test_a_collective_cannot_take_the_whole_gpu():
    from llmpar.strategy import Collective
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Collective(strategy="x", name="x.y", operation="all-reduce", group_size=2,
                   compute_share=1.0)


# PyTorch's SymmetricMemory kernels (torchtitan's AsyncTP): `overlap_kernels`.
A100_FIXED_SECONDS = 6e-6  # specs/gpus/a100-sxm-80gb.toml matmul_fixed_seconds
A100_HBM_BYTES_PER_S = 2039e9 * 0.8  # its HBM bandwidth x memory_efficiency


def symmetric(**sequence: Any) -> llmpar.Plan:
    return plan_of(comm_overlap="pipelined", overlap_kernels="symmetric-memory", **sequence)


def test_transformer_engine_kernels_are_the_default_without_a_profile():
    assert plan_of(comm_overlap="pipelined", overlap_kernels="userbuffers").to_dict() == (
        plan_of(comm_overlap="pipelined").to_dict())


def test_the_torchtitan_profile_runs_pytorch_symmetric_memory():
    overrides = {"training.framework": "torchtitan", "parallel.sequence.comm_overlap": "pipelined"}
    stated = dict(overrides, **{"parallel.sequence.overlap_kernels": "symmetric-memory"})
    assert SESSION.evaluate(EXAMPLE, overrides).to_dict() == (
        SESSION.evaluate(EXAMPLE, stated).to_dict())


def test_a_symmetric_memory_all_gather_pays_only_its_chunks_launches():
    # t = 8 chunks of each product, 7 more launches than one product, nothing of the
    # transfer exposed (the copy engines move each chunk while the previous one computes)
    (gather,) = by_name(symmetric(), "sequence.all-gather")
    (inline,) = by_name(plan_of(), "sequence.all-gather")
    launches = gather.calls_per_step * 7 * A100_FIXED_SECONDS
    assert gather.pieces is None and gather.hides_behind == "projections"
    assert gather.exposed_seconds == pytest.approx(launches)
    assert gather.seconds == pytest.approx(inline.seconds + launches)


def test_a_symmetric_memory_reduce_scatter_pays_its_reduction_kernel():
    # the reduction reads the t stacked partial sums (the whole buffer) and writes 1/t
    (scatter,) = by_name(symmetric(), "sequence.reduce-scatter")
    per_call = 7 * A100_FIXED_SECONDS + (1 + 1 / 8) * scatter.buffer_bytes / A100_HBM_BYTES_PER_S
    assert scatter.exposed_seconds == pytest.approx(scatter.calls_per_step * per_call, rel=1e-6)


@pytest.mark.parametrize("key, value", [("overlap_compute_share", 0.5), ("overlap_splits", 2)])
def test_copy_engines_take_no_share_and_make_no_splits(key, value):
    assert symmetric(**{key: value}).step_seconds == symmetric().step_seconds


def test_symmetric_memory_changes_nothing_without_the_pipelined_overlap():
    assert plan_of(overlap_kernels="symmetric-memory").to_dict() == plan_of().to_dict()


def test_an_unknown_kernel_is_named():
    with pytest.raises(llmpar.SpecError) as error:
        plan_of(comm_overlap="pipelined", overlap_kernels="nccl")
    (problem,) = error.value.problems
    assert problem.path == "$.parallel.sequence.overlap_kernels" and "one of" in problem.message


def test_a_collective_cannot_add_negative_serial_seconds():
    from llmpar.strategy import Collective
    with pytest.raises(ValueError, match=">= 0"):
        Collective(strategy="x", name="x.y", operation="all-reduce", group_size=2,
                   serial_seconds_per_call=-1.0)
