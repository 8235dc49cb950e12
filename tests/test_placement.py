"""The rank order (`[parallel] order`): parsing, strides, and which links groups use."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.placement import (
    RANK_ORDER,
    Axis,
    block_stride,
    default_order,
    order_text,
    parse_order,
    stride,
)
from llmpar.strategies.common import data_context_stride, expert_group_stride

SESSION = llmpar.Session(load_entry_points=False)
AXES = SESSION.axes
NESTED = SESSION.nested_axes
DEGREES = {"tensor": 2, "context": 4, "expert": 2, "data": 8, "pipeline": 3}


def test_default_order_is_megatron_cores_and_comes_from_the_declarations():
    assert default_order(AXES) == RANK_ORDER
    assert order_text(RANK_ORDER, AXES) == "tp-cp-ep-dp-pp"
    assert parse_order("tp-cp-ep-dp-pp", AXES) == (RANK_ORDER, [])
    assert parse_order("tp-cp-dp-pp", AXES) == (RANK_ORDER, [])  # ep goes before dp
    assert parse_order("tensor-context-data-pipeline", AXES) == (RANK_ORDER, [])
    assert frozenset({"expert"}) == NESTED


def test_a_plugin_axis_takes_part_in_the_order():
    axes = {**AXES, "hybrid": Axis(token="hp", rank=45)}
    order, problems = parse_order("tp-cp-ep-dp-hp-pp", axes)
    assert problems == [] and order.index("hybrid") == order.index("data") + 1
    assert "missing hp" in parse_order("tp-cp-ep-dp-pp", axes)[1][0].message
    degrees = {**DEGREES, "hybrid": 2}
    assert stride(order, degrees, "pipeline", NESTED) == 2 * 4 * 8 * 2


@pytest.mark.parametrize(("order", "expected"), [
    # tensor, context, expert, data, pipeline
    ("tp-cp-ep-dp-pp", (1, 2, 2, 8, 64)),
    ("tp-pp-cp-ep-dp", (1, 6, 6, 24, 2)),   # Megatron's tp-pp-dp mapping, with cp
    ("tp-ep-dp-cp-pp", (1, 16, 2, 2, 64)),  # context outside data
    ("cp-ep-dp-tp-pp", (32, 1, 1, 4, 64)),  # tensor outside the data x context block
])
def test_strides_are_the_degrees_placed_inside(order, expected):
    parsed, problems = parse_order(order, AXES)
    assert problems == []
    layout = llmpar.Layout(degrees=DEGREES, num_gpus=96, order=parsed, nested=NESTED)
    found = tuple(expert_group_stride(layout) if name == "expert" else layout.stride(name)
                  for name in ("tensor", "context", "expert", "data", "pipeline"))
    assert found == expected
    # the data x context ranks are one block; experts are its innermost ranks
    block = block_stride(parsed, DEGREES, ("data", "context"), NESTED)
    assert block == found[2] == min(found[1], found[3]) == data_context_stride(layout)


@pytest.mark.parametrize(("order", "says"), [
    ("tp-cp-pp-dp", "cp must sit next to dp"),
    ("tp-ep-cp-dp-pp", "ep must come right before dp"),
    ("tp-cp-dp", "missing pp"),
    ("tp-tp-cp-dp-pp", "repeated tp"),
    ("tp-cp-xp-dp-pp", "unknown 'xp'"),
])
def test_bad_orders_are_spec_errors_at_their_key(order, says):
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.load_spec({"model": "llama-3-8b", "hardware": {"cluster": "dgx-a100"},
                           "parallel": {"order": order}})
    (problem,) = error.value.problems
    assert problem.path == "$.parallel.order" and says in problem.message


def plan(order: str | None):
    parallel = {"tensor": {"degree": 2}, "pipeline": {"degree": 2},
                "data": {"degree": 4, "overlap_grad_reduce": False}}
    if order is not None:
        parallel["order"] = order
    return SESSION.evaluate({"model": "llama-3-8b",
                             "hardware": {"cluster": "dgx-a100", "num_gpus": 16},
                             "training": {"sequence_length": 2048, "global_batch_size": 32},
                             "parallel": parallel})


def tiers(p):
    return {(c.strategy, c.operation): c.tier for c in p.collectives}


def test_the_order_decides_which_groups_cross_the_network():
    """16 GPUs in two nodes, TP2 PP2 DP4. Default order: tensor and data ranks (2 x 4)
    fill a node, the pipeline crosses. tp-pp-dp: tensor and pipeline fill 4 ranks, so the
    data group (stride 4) spans both nodes and the pipeline stays inside."""
    default, swapped = tiers(plan(None)), tiers(plan("tp-pp-cp-dp"))
    assert default[("data", "all-reduce")] == "intra-node"
    assert default[("pipeline", "send-recv")] == "inter-node"
    assert swapped[("data", "all-reduce")] == "inter-node"
    assert swapped[("pipeline", "send-recv")] == "intra-node"
    assert default[("tensor", "all-reduce")] == swapped[("tensor", "all-reduce")] == "intra-node"
    assert plan(None).step_seconds < plan("tp-pp-cp-dp").step_seconds


def test_order_survives_the_toml_round_trip():
    spec = SESSION.load_spec({"model": "llama-3-8b", "hardware": {"cluster": "dgx-a100"},
                              "parallel": {"order": "tp-pp-cp-dp"}})
    text = llmpar.dump_spec(spec)
    assert 'order = "tp-pp-cp-ep-dp"' in text
    assert SESSION.load_spec(text) == spec
    default = SESSION.load_spec({"model": "llama-3-8b", "hardware": {"cluster": "dgx-a100"}})
    assert "order" not in llmpar.dump_spec(default)
