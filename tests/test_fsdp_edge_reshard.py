"""FSDP2's per-unit reshard of the embeddings and the output layer
(`[parallel.data] edge_reshard_after_forward`): how many times a step gathers them, apart
from the transformer blocks."""

from __future__ import annotations

from typing import Any

import pytest
from search_specs import MOE_MODEL, agreeing_pairs, small_spec

import llmpar
from llmpar.testing.fast_form import disagreements

SESSION = llmpar.Session(load_entry_points=False)
EMBEDDING_PARAMETERS = 128_256 * 4_096
"""Llama-3-8B's token embeddings and its (untied) output layer, each vocabulary x hidden
(meta-llama/Meta-Llama-3-8B config.json: vocab_size 128256, hidden_size 4096)."""


def spec_8b(**data: Any) -> dict[str, Any]:
    """Llama-3-8B on 8 H100s, FSDP, 32 sequences per step: 4 micro-batches of 1 per GPU."""
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": {"sequence_length": 4096, "micro_batch_size": 1,
                         "global_batch_size": 32, "recompute": "full", "tokens": 1e12},
            "parallel": {"data": {"fsdp": True, **data}}}


def _gathered_bytes(plan: llmpar.Plan) -> dict[str, float]:
    """Bytes each weight all-gather collects per step on one GPU: calls x gathered buffer."""
    return {c.name: c.calls_per_step * c.buffer_bytes for c in plan.collectives
            if c.strategy == "data" and c.operation == "all-gather"}


def test_unset_gathers_the_edges_with_the_blocks():
    plain = llmpar.evaluate(spec_8b(reshard_after_forward=False))
    assert [c.name for c in plain.collectives if c.operation == "all-gather"] == [
        "data.dense-param-all-gather"]


def test_llama_3_8b_edge_gathers_hand_check():
    # 4 micro-batches. The edges: 2 x 525,336,576 parameters in bf16 = 2,101,346,304 bytes
    # gathered per pass; the blocks: the rest of the 8,030,261,248 parameters.
    edges = 2 * EMBEDDING_PARAMETERS * 2
    whole = 8_030_261_248 * 2
    kept = llmpar.evaluate(spec_8b(reshard_after_forward=False))
    assert _gathered_bytes(kept) == {"data.dense-param-all-gather": pytest.approx(4 * whole)}
    # Blocks kept gathered from forward to backward (once per micro-batch), the edges
    # resharded after forward and gathered again for the backward (twice): PithTrain.
    pith = llmpar.evaluate(spec_8b(reshard_after_forward=False,
                                   edge_reshard_after_forward=True))
    assert _gathered_bytes(pith) == {
        "data.dense-param-all-gather": pytest.approx(4 * (whole - edges)),
        "data.dense-edge-param-all-gather": pytest.approx(8 * edges)}
    # Stating the blocks' own setting for the edges gathers the same bytes.
    same = llmpar.evaluate(spec_8b(reshard_after_forward=False,
                                   edge_reshard_after_forward=False))
    assert sum(_gathered_bytes(same).values()) == pytest.approx(4 * whole)
    # More gathering, never less time; the memory is the edge key's to leave alone.
    assert pith.step_seconds >= same.step_seconds
    assert pith.total_bytes == kept.total_bytes


@pytest.mark.parametrize(("schedule", "edges_on_busiest"), [
    ("1f1b", 1),  # the embeddings on the first stage, the output layer on the last
    ("dualpipev", 2),  # the first rank holds the first and the last chunk
    ("dualpipe", 2),  # each rank holds stage i and its mirror p - 1 - i
])
def test_edge_gathers_are_timed_on_the_stage_that_holds_them(schedule, edges_on_busiest):
    # Llama-3-8B on 16 H100s, PP2 x FSDP8, 4 micro-batches: each edge is 525,336,576
    # bf16 parameters, gathered whole (FSDP gathers the shard group's full unit).
    spec = spec_8b(reshard_after_forward=False, edge_reshard_after_forward=True)
    spec["hardware"]["num_gpus"] = 16
    spec["parallel"]["pipeline"] = {"degree": 2, "schedule": schedule}
    plan = llmpar.evaluate(spec)
    (edge,) = [c for c in plan.collectives if c.name == "data.dense-edge-param-all-gather"]
    assert edge.calls_per_step == 8
    assert edge.buffer_bytes == pytest.approx(edges_on_busiest * EMBEDDING_PARAMETERS * 2)


def test_only_the_dense_group_has_edge_units():
    plan = llmpar.evaluate(small_spec(model=MOE_MODEL, parallel={
        "data": {"fsdp": True, "edge_reshard_after_forward": True}}))
    names = {c.name for c in plan.collectives if c.operation == "all-gather"}
    assert "data.dense-edge-param-all-gather" in names
    assert "data.expert-edge-param-all-gather" not in names


@pytest.mark.parametrize(("data", "fragment"), [
    ({"zero": 2, "edge_reshard_after_forward": True},
     "edge_reshard_after_forward = true needs parallel.data.zero = 3"),
    ({"zero": 3, "edge_reshard_after_forward": False, "prefetch_bucket_parameters": 50_000_000},
     "edge_reshard_after_forward = false is FSDP2's per-unit setting"),
    ({"zero": 3, "edge_reshard_after_forward": True, "quantized_weights": True},
     "edge_reshard_after_forward = true is FSDP2's per-unit setting"),
])
def test_edge_setting_outside_fsdp2_names_the_key(data, fragment):
    spec = spec_8b()
    spec["parallel"] = {"data": data}
    with pytest.raises(llmpar.SpecError) as raised:
        llmpar.evaluate(spec)
    problems = raised.value.problems
    assert [p.path for p in problems] == ["$.parallel.data.edge_reshard_after_forward"]
    assert fragment in problems[0].message


SPACES = {
    "dense-edges-regathered": small_spec(parallel={"data": {
        "fsdp": True, "reshard_after_forward": False, "edge_reshard_after_forward": True}}),
    "moe-edges-kept-zero-searched": small_spec(model=MOE_MODEL, parallel={"data": {
        "edge_reshard_after_forward": False}}),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_fast_path_agrees_with_each_layout_alone(name):
    assert agreeing_pairs(SESSION, SPACES[name])


def test_fast_form_agrees_around_a_dualpipev_expert_layout():
    spec = SESSION.load_spec({
        "model": "mixtral-8x7b",
        "hardware": {"cluster": "dgx-h100", "num_gpus": 32, "gpus_per_node": 8},
        "training": {"sequence_length": 4096, "global_batch_size": 64},
        "parallel": {"expert": {"degree": 4}, "pipeline": {"degree": 2, "schedule": "dualpipev"},
                     "data": {"fsdp": True, "reshard_after_forward": False,
                              "edge_reshard_after_forward": True,
                              "gradient_sync": "last-micro-batch"}}})
    assert list(disagreements(SESSION, spec)) == []
