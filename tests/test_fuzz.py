"""Fuzzing the shipped examples: any mutation is either a SpecError or a plan that is
finite, non-negative and physically bounded (the weights are stored somewhere; no GPU runs
faster than its peak). Anything else (a traceback, a NaN, HFU above 1) is a defect."""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import llmpar
from llmpar import SpecError
from llmpar.dtypes import BYTES_PER_ELEMENT
from llmpar.report.json_format import strict_json

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "specs" / "examples").glob("*.toml"))
TABLES = {path.stem: tomllib.loads(path.read_text(encoding="utf-8")) for path in EXAMPLES}
SMALL = [name for name, table in TABLES.items()
         if table.get("hardware", {}).get("num_gpus", 1) <= 8 and "training" in table]
"""Training examples whose layout space is small enough to search many times in a test
(the search ranks training layouts)."""
PRESET_KEYS = {("model",), ("optimizer",), ("hardware", "cluster"), ("hardware", "gpu")}
"""Preset names: mutated by tests of their own (test_reliability.py), not here, so that
most mutations reach the model."""
FEWEST_BYTES_PER_WEIGHT = min(BYTES_PER_ELEMENT.values())
MUTATIONS = 4 * settings.default.max_examples
"""Most mutations are refused at once; four times the profile's examples give tens of plans."""
SEARCHES = max(5, settings.default.max_examples // 4)
"""A search costs tens of evaluations: a quarter of the profile's examples."""

HOSTILE_NUMBERS = st.sampled_from([0, -1, 1, 3, 7, 2**31, 2**63, 10**30, 10**31, 2**1100,
                                   0.5, -0.0, 1e-300, 1e300, 1e30, 1e-30, math.inf, math.nan])
VALUES = st.one_of(
    HOSTILE_NUMBERS,
    st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["", "full", "bf16", "fp8", "int4", "h100-sxm", "llama-3-8b", "\x1b[2J",
                     "../x", "/etc/passwd", "1 GB", "-1 TB", "1e400 B/s"]),
    st.booleans(),
    st.lists(st.integers(-3, 10), max_size=3),
    st.dictionaries(st.sampled_from(["a", "degree", "preset", "file"]),
                    st.integers(-2, 4), max_size=2),
)
PLAUSIBLE = st.one_of(st.integers(1, 16), st.sampled_from(
    [True, False, 0.5, 0.9, "full", "selective", "none", "bf16", "fp8", "int8", "int4",
     "interleaved", "zero-bubble", "ring", "all-to-all"]))
SCALES = st.sampled_from([0.5, 2, 4, 8, 1000, 10**6, 10**12, 0, -1])
ACTIONS = st.sampled_from(["scale", "scale", "scale", "plausible", "plausible", "replace",
                           "delete", "add"])


def _paths(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for key, value in table.items():
        found.append((*prefix, key))
        if isinstance(value, dict):
            found += _paths(value, (*prefix, key))
    return found


def _parent(table: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path[:-1]:
        table = table[key]
    return table


@st.composite
def mutated(draw: Any, names: list[str]) -> dict[str, Any]:
    """An example with one to three keys replaced, scaled, deleted or added."""
    table = copy.deepcopy(TABLES[draw(st.sampled_from(names))])
    for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):
        action = draw(ACTIONS)
        paths = _paths(table)
        if action not in ("delete", "add"):  # values, not whole tables, are changed
            paths = [p for p in paths if p not in PRESET_KEYS
                     and not isinstance(_parent(table, p)[p[-1]], dict)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(table, path), path[-1]
        old = parent[key]
        if action == "scale" and isinstance(old, (int, float)) and not isinstance(old, bool):
            factor = draw(SCALES)
            if isinstance(old, int) and isinstance(factor, int):
                parent[key] = old * factor
            else:
                parent[key] = old * factor if abs(old) < 1e300 else old
        elif action == "delete":
            del parent[key]
        elif action == "plausible":
            parent[key] = draw(PLAUSIBLE)
        elif action == "add":
            parent[draw(st.sampled_from(["extra", "degree", "zero", "preset"]))] = draw(VALUES)
        else:
            parent[key] = draw(VALUES)
    return table


def assert_physical(plan: llmpar.Plan) -> None:
    """What every plan must satisfy, whatever spec it came from."""
    strict_json(plan.to_dict())  # raises on NaN or an infinity anywhere
    parts = [plan.weights_bytes, plan.gradients_bytes, plan.optimizer_bytes,
             plan.activations_bytes, plan.buffers_bytes, plan.total_bytes]
    assert all(part >= 0 for part in parts if part is not None), parts
    stored_bytes = plan.total_bytes * plan.num_gpus + (plan.host_bytes or 0) * plan.num_gpus
    assert stored_bytes >= FEWEST_BYTES_PER_WEIGHT * plan.parameters * (1 - 1e-9)
    if plan.hfu is not None:
        assert plan.hfu <= 1 + 1e-9, f"HFU {plan.hfu}"
    if plan.step_seconds is not None:
        assert plan.step_seconds > 0


@settings(max_examples=MUTATIONS)
@given(mutated(list(TABLES)))
def test_mutated_examples_evaluate_or_fail_clearly(session, table):
    try:
        plan = session.evaluate(table)
    except SpecError:
        return
    assert_physical(plan)


@settings(max_examples=SEARCHES)
@given(mutated(SMALL), st.sampled_from(["step_time", "memory"]))
def test_mutated_examples_search_or_fail_clearly(session, table, objective):
    table.setdefault("search", {}).update({"top": 3, "micro_batch_sizes": [1, 2]})
    try:
        result = llmpar.search(table, objective=objective, session=session)
    except SpecError:
        return
    for ranked in result.results:
        assert_physical(ranked.plan)
