"""Hybrid context parallelism (`[parallel.context] kind = "hybrid"`: USP, Megatron-Core's
a2a+p2p): an all-to-all inside groups of `all_to_all_degree` ranks, a ring across them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLE = Path(__file__).resolve().parent.parent / "specs" / "examples" / (
    "llama-3-8b-cp8-a100.toml")  # CP8 ring on one DGX A100, s = 8192


def plan_of(**context: Any) -> llmpar.Plan:
    return SESSION.evaluate(EXAMPLE, {f"parallel.context.{k}": v for k, v in context.items()})


def by_name(plan: llmpar.Plan) -> dict[str, Any]:
    return {c.name: c for c in plan.collectives if c.strategy == "context"}


@pytest.mark.parametrize("a", [2, 4])
def test_all_to_all_inside_groups_and_a_ring_across_them(a):
    ring, swap = plan_of(), plan_of(kind="all-to-all")
    hybrid = by_name(plan_of(kind="hybrid", all_to_all_degree=a))
    r = 8 // a
    kv, a2a = hybrid["context.kv-ring"], hybrid["context.all-to-all"]
    plain_kv, plain_a2a = by_name(ring)["context.kv-ring"], by_name(swap)["context.all-to-all"]
    # The ring's chunk is s/c tokens' worth either way; r - 1 steps instead of c - 1.
    assert kv.group_size == r and kv.buffer_bytes == plain_kv.buffer_bytes
    assert kv.calls_per_step == pytest.approx(plain_kv.calls_per_step * (r - 1) / 7)
    assert a2a.group_size == a and a2a.buffer_bytes == plain_a2a.buffer_bytes
    assert a2a.calls_per_step == plain_a2a.calls_per_step


def test_the_same_activations_as_any_context_split():
    assert plan_of(kind="hybrid", all_to_all_degree=2).activations_bytes == (
        plan_of().activations_bytes)


def test_attention_runs_one_kernel_per_ring_step():
    # Between the ring's 8 attention kernels per layer and pass and Ulysses' 1.
    ring = plan_of().compute_seconds
    swap = plan_of(kind="all-to-all").compute_seconds
    assert swap < plan_of(kind="hybrid", all_to_all_degree=4).compute_seconds < (
        plan_of(kind="hybrid", all_to_all_degree=2).compute_seconds) < ring


def test_across_two_nodes_the_all_to_all_stays_inside_a_node():
    spec = {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "training": {"sequence_length": 65536, "global_batch_size": 1,
                         "recompute": "full", "activation_model": "fused"},
            "parallel": {"context": {"degree": 16, "kind": "hybrid",
                                     "all_to_all_degree": 8}, "data": {"zero": 3}}}
    found = by_name(SESSION.evaluate(spec))
    assert found["context.all-to-all"].tier == "intra-node"
    assert found["context.kv-ring"].tier == "inter-node"
    assert found["context.kv-ring"].group_size == 2


@pytest.mark.parametrize("settings, path", [
    ({"kind": "hybrid"}, "all_to_all_degree"),
    ({"kind": "hybrid", "all_to_all_degree": 3}, "all_to_all_degree"),
    ({"kind": "hybrid", "all_to_all_degree": 8}, "all_to_all_degree"),
    ({"kind": "hybrid", "all_to_all_degree": 1}, "all_to_all_degree"),
    ({"all_to_all_degree": 2}, "all_to_all_degree"),
])
def test_bad_hybrid_settings_are_named(settings, path):
    with pytest.raises(llmpar.SpecError) as error:
        plan_of(**settings)
    assert [p.path for p in error.value.problems] == [f"$.parallel.context.{path}"]


def test_the_all_to_all_needs_the_heads_to_split():
    # Llama-3-8B has 32 heads: TP8 x all-to-all over 8 ranks would need 64.
    spec = {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 128},
            "training": {"sequence_length": 65536, "global_batch_size": 1},
            "parallel": {"tensor": {"degree": 8},
                         "context": {"degree": 16, "kind": "hybrid", "all_to_all_degree": 8}}}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec)
    assert "divisible by all_to_all_degree x tensor degree" in str(error.value)
