"""ZeRO++ (Wang et al. 2023, arXiv:2306.10209) as `[parallel.data]` settings: qwZ's int8
weight gathers, hpZ's secondary weight partition inside a node and qgZ's int4 gradient
all-to-alls, against the paper's statement that together they cut ZeRO-3's cross-node
volume from 3M to 0.75M a step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from search_specs import agreeing_pairs, small_spec

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
GPUS, PER_NODE = 512, 8  # 64 nodes of 8 H100


def plan_of(num_gpus: int = GPUS, **data: Any) -> llmpar.Plan:
    """Llama-3-70B, data parallelism alone under ZeRO-3, one micro-batch a step, and no
    link latency, so that every collective's time is its bytes over its link."""
    return SESSION.evaluate({
        "model": "llama-3-70b",
        "hardware": {"cluster": "dgx-h100", "num_gpus": num_gpus,
                     "intra_node_latency_seconds": 0.0, "inter_node_latency_seconds": 0.0},
        "training": {"sequence_length": 4096, "micro_batch_size": 1,
                     "global_batch_size": num_gpus, "recompute": "full"},
        "parallel": {"data": {"zero": 3, **data}}})


def data_collectives(plan: llmpar.Plan, tier: str | None = None) -> list[Any]:
    return [c for c in plan.collectives if c.strategy == "data"
            and (tier is None or c.tier == tier)]


def cross_node_seconds(plan: llmpar.Plan) -> float:
    return sum(c.seconds for c in data_collectives(plan, "inter-node"))


def named(plan: llmpar.Plan, name: str) -> Any:
    (found,) = [c for c in plan.collectives if c.name == name]
    return found


ALL_THREE = dict(quantized_weights=True, hpz_partition_size=PER_NODE,
                 quantized_gradients=True)


def test_zeropp_cuts_the_cross_node_volume_from_3m_to_075m():
    """Wang et al. 2023, Sec. 3 and the abstract: ZeRO-3 moves 3M across the nodes a step
    (forward all-gather, backward all-gather, gradient reduce-scatter, M each); ZeRO++
    0.5M (int8 forward gather) + 0 (backward gather inside the node) + 0.25M (int4
    gradients): 4x less. The ring's (n-1)/n and the all-to-all's (nodes-1)/nodes keep
    the ratio a little off 4 at 64 nodes."""
    n, nodes = GPUS, GPUS // PER_NODE
    zero3, zeropp = cross_node_seconds(plan_of()), cross_node_seconds(plan_of(**ALL_THREE))
    # per GPU, in units of M / (PER_NODE x per-GPU network bandwidth): a ring over nodes
    # uses a node's 8 NICs at once, the all-to-all across nodes each GPU's own NIC.
    expected = (3 * (n - 1) / n) / ((n - 1) / n / 2 + (nodes - 1) / nodes / 4)
    assert zero3 / zeropp == pytest.approx(expected, rel=1e-6)
    assert zero3 / zeropp == pytest.approx(4.0, rel=0.02)


def test_qwz_halves_the_bytes_of_every_weight_gather():
    plain, quantized = plan_of(), plan_of(quantized_weights=True)
    gather = "data.dense-param-all-gather"
    assert named(quantized, gather).buffer_bytes == pytest.approx(
        named(plain, gather).buffer_bytes / 2, rel=1e-9)  # int8 instead of bf16
    assert named(quantized, gather).calls_per_step == named(plain, gather).calls_per_step
    assert quantized.stages[0].buffers_bytes == plain.stages[0].buffers_bytes


def test_hpz_moves_the_backward_gather_into_the_node_at_the_cost_of_a_secondary_partition():
    plain, hpz = plan_of(), plan_of(hpz_partition_size=PER_NODE)
    forward = named(hpz, "data.dense-param-all-gather")
    backward = named(hpz, "data.dense-param-secondary-all-gather")
    both = named(plain, "data.dense-param-all-gather")
    assert forward.calls_per_step + backward.calls_per_step == both.calls_per_step
    assert forward.tier == "inter-node" and backward.tier == "intra-node"
    assert backward.group_size == PER_NODE and forward.group_size == GPUS
    # the secondary partition: 1/8 of the (unsplit) bf16 weights on every GPU
    weights = sum(s.weights_bytes for s in plain.stages) * GPUS  # bf16, sharded over 512
    extra = hpz.stages[0].buffers_bytes - plain.stages[0].buffers_bytes
    assert extra == pytest.approx(weights / PER_NODE, rel=1e-6)
    assert hpz.total_bytes > plain.total_bytes


def test_qgz_replaces_the_reduce_scatter_by_two_int4_all_to_alls():
    plain, qgz = plan_of(), plan_of(quantized_gradients=True)
    scatter = named(plain, "data.dense-grad-reduce-scatter")
    intra = named(qgz, "data.dense-grad-quantized-all-to-all")
    inter = named(qgz, "data.dense-grad-quantized-all-to-all-nodes")
    assert not [c for c in qgz.collectives if c.name == "data.dense-grad-reduce-scatter"]
    gradient_bytes = 2  # bf16 gradients against int4's half a byte
    assert intra.buffer_bytes == pytest.approx(scatter.buffer_bytes * 0.5 / gradient_bytes,
                                               rel=1e-9)
    assert inter.buffer_bytes == pytest.approx(intra.buffer_bytes / PER_NODE, rel=1e-9)
    assert (intra.group_size, intra.tier) == (PER_NODE, "intra-node")
    assert (inter.group_size, inter.tier) == (GPUS // PER_NODE, "inter-node")
    assert intra.calls_per_step == inter.calls_per_step == scatter.calls_per_step


def test_inside_one_node_qgz_is_one_all_to_all():
    qgz = plan_of(num_gpus=PER_NODE, quantized_gradients=True)
    names = {c.name for c in data_collectives(qgz)}
    assert "data.dense-grad-quantized-all-to-all" in names
    assert "data.dense-grad-quantized-all-to-all-nodes" not in names


@pytest.mark.parametrize("data", [dict(quantized_weights=False), dict(hpz_partition_size=1),
                                  dict(quantized_gradients=False)])
def test_the_defaults_are_the_plan_without_the_settings(data):
    assert plan_of(**data).to_dict() == plan_of().to_dict()


def test_every_setting_makes_the_step_no_slower():
    base = plan_of().step_seconds
    for data in (dict(quantized_weights=True), dict(hpz_partition_size=PER_NODE),
                 dict(quantized_gradients=True), ALL_THREE):
        assert plan_of(**data).step_seconds <= base


# --- refusals --------------------------------------------------------------------------


def problems(**data: Any) -> list[tuple[str, str]]:
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate({"model": "llama-3-8b",
                          "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
                          "training": {"sequence_length": 4096, "global_batch_size": 16},
                          "parallel": {"data": data}})
    return [(p.path, p.message) for p in error.value.problems]


@pytest.mark.parametrize("key, value", [("quantized_weights", True),
                                        ("quantized_gradients", True),
                                        ("hpz_partition_size", 8)])
def test_zeropp_needs_zero_3(key, value):
    found = problems(zero=1, **{key: value})
    assert [path for path, _ in found] == [f"$.parallel.data.{key}"]
    assert "zero = 3" in found[0][1]


def test_hpz_must_divide_the_data_ranks():
    found = problems(zero=3, hpz_partition_size=3)
    assert found == [("$.parallel.data.hpz_partition_size",
                      "hpz_partition_size (3) must divide the data x context ranks (16) that "
                      "shard the weights")]


def test_hpz_needs_the_backward_gather_and_no_hybrid_sharding():
    found = problems(zero=3, hpz_partition_size=8, reshard_after_forward=False)
    assert [path for path, _ in found] == ["$.parallel.data.hpz_partition_size"]
    assert "reshard_after_forward = true" in found[0][1]
    found = problems(zero=3, hpz_partition_size=8, shard_degree=8)
    assert [path for path, _ in found] == ["$.parallel.data.hpz_partition_size"]
    assert "shard_degree" in found[0][1]


def test_the_search_keeps_hpz_and_refuses_only_the_shard_degrees_beside_it():
    """A search node's shard degrees are an array with unset entries: hpZ is refused only
    where one is set (the rule once read the array itself as set and refused every
    layout of the shipped ZeRO++ example)."""
    spec = small_spec(parallel={"data": {"zero": 3, "hpz_partition_size": 2}})
    hpz = "$.parallel.data.hpz_partition_size"
    pairs = list(agreeing_pairs(llmpar.default_session(), spec))
    assert any(p.choice.get("data.shard_degree") is None for p in pairs)
    fast = llmpar.search(spec, top=8)
    slow = llmpar.search(spec, top=8, exact=True)
    assert fast.results and [r.choices for r in fast.results] == [
        r.choices for r in slow.results]
    assert all(r.choices.get("data.shard_degree") is None for r in fast.results)
    assert fast.rejected[hpz] == slow.rejected[hpz] > 0  # the shard degrees beside it


def test_hpz_below_1_is_refused_as_the_field_says():
    found = problems(zero=3, hpz_partition_size=0)
    assert found[0][0] == "$.parallel.data.hpz_partition_size"


def test_deepspeed_config_carries_the_settings_both_ways():
    example = EXAMPLES / "llama-3-70b-zeropp-512-h100.toml"
    launch = SESSION.launch(example, "deepspeed")
    text = launch.files[0].text
    zero = json.loads(text)["zero_optimization"]
    assert (zero["zero_quantized_weights"], zero["zero_hpz_partition_size"],
            zero["zero_quantized_gradients"]) == (True, 8, True)
    read = SESSION.launch_targets.find("deepspeed").read(text, "ds_config.json")
    assert {key: read.settings[f"parallel.data.{key}"] for key in
            ("quantized_weights", "hpz_partition_size", "quantized_gradients")} == {
        "quantized_weights": True, "hpz_partition_size": 8, "quantized_gradients": True}
    assert "zero_quantized_weights" not in json.loads(SESSION.launch(
        example, "deepspeed", {"parallel.data.quantized_weights": False}).files[0].text)[
        "zero_optimization"]
