"""The speed budget, counted: the bytecodes one exact evaluation runs in llmpar's own
code (benchmarks/work.py) on the cases of benchmarks/evaluate_speed.py, in a session that
evaluated the spec before.

Times on a shared machine move by 5 to 30% between runs of the same code; these counts
move only when the code does. A change that adds more work than the headroom fails here
until it is measured against llm-analysis (`python benchmarks/evaluate_speed.py`, its own
environment) and the budget below is raised in the same commit, with the reason in
CHANGELOG.md; one that removes work lowers it. Counted on CPython 3.11 only: other versions
compile other bytecodes and report them to sys.settrace in part. The attrs-generated
methods of the records are left out, so that the count does not follow the attrs version.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import llmpar

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_PARENT = f"{Path(llmpar.__file__).resolve().parent.parent}/"
BUDGETS = {
    # llmpar's own bytecodes of one evaluation, CPython 3.11.7 (attrs 26.1, numpy 2.4).
    # In all, with the records' attrs methods, the training cases run 31,030 and 15,111,
    # where llm-analysis 0.2.2's `training()` runs 15,243 and 15,197 on the same cases
    # (`evaluate_speed.py --work`)
    "specs/examples/gpt3-175b-1024-a100.toml": 25_866,
    "benchmarks/specs/llama-2-7b-fsdp-8-h100.toml": 12_902,
    "specs/examples/inference-llama-2-70b-h100.toml": 24_349,
    "specs/examples/inference-deepseek-v3-h200.toml": 31_755,
}
TRAINING = ("specs/examples/gpt3-175b-1024-a100.toml",
            "benchmarks/specs/llama-2-7b-fsdp-8-h100.toml")
HEADROOM = 1.05
"""A small fix may add up to 5% before the budget needs measuring again."""

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11),
    reason="bytecodes are counted on CPython 3.11 (benchmarks/work.py)")


def _work() -> ModuleType:
    """benchmarks/work.py (a script folder, not a package)."""
    path = ROOT / "benchmarks" / "work.py"
    if not path.exists():  # the tests of a tree without its benchmarks
        pytest.skip("benchmarks/work.py is not in this tree")
    found = importlib.util.spec_from_file_location("llmpar_benchmark_work", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def counts() -> dict[str, int]:
    """Each case's bytecodes in llmpar's code, counted twice: a count is a measure only if
    the same evaluation counts the same."""
    work = _work()
    session = llmpar.Session(load_entry_points=False)
    found = {}
    for path in BUDGETS:
        spec = session.load_spec(ROOT / path)
        session.evaluate(spec)  # the session keeps what it keeps for the model
        first, second = (work.work_of(lambda spec=spec: session.evaluate(spec),
                                      (PACKAGE_PARENT,)).bytecodes_under("llmpar/")
                         for _ in range(2))
        assert first == second, f"{path}: {first:,} and then {second:,} bytecodes"
        found[path] = first
    return found


@pytest.mark.parametrize("path", list(BUDGETS))
def test_an_evaluation_runs_within_its_bytecode_budget(counts: dict[str, int],
                                                        path: str) -> None:
    budget = BUDGETS[path]
    assert counts[path] <= budget * HEADROOM, (
        f"{path}: {counts[path]:,} bytecodes, {counts[path] / budget - 1:+.1%} over the "
        f"budget of {budget:,}: measure against llm-analysis (benchmarks/evaluate_speed.py) "
        "and raise BUDGETS with the reason in CHANGELOG.md, or remove the work")


def test_a_serving_spec_runs_at_most_twice_the_work_of_a_training_one(
        counts: dict[str, int]) -> None:
    # the speed budget of serving: closed forms, not repeated bisections
    training = max(counts[path] for path in TRAINING)
    for path in set(BUDGETS) - set(TRAINING):
        assert counts[path] <= 2 * training, (path, counts[path], training)
