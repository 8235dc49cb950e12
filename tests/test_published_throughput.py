"""Modelled step time against published training throughput (docs/validation-throughput.md).

Each row of validation/published/*.toml is a real run with its citation; llmpar must
predict its teraFLOP/s per GPU within 10%.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import llmpar
from llmpar.loading.reader import merge

PUBLISHED = Path(__file__).resolve().parent.parent / "validation" / "published"
ROWS = [(path.stem, row, tomllib.loads(path.read_text())["base"])
        for path in sorted(PUBLISHED.glob("*.toml"))
        for row in tomllib.loads(path.read_text())["rows"]]


@pytest.mark.parametrize(("table", "row", "base"), ROWS,
                         ids=[f"{table}-{row['label']}" for table, row, _ in ROWS])
def test_predicted_throughput_within_10_percent(table, row, base):
    plan = llmpar.evaluate(merge(base, row["spec"]))
    assert plan.time_model == "modelled"
    predicted = plan.hardware_flops_per_step / plan.num_gpus / plan.step_seconds / 1e12
    assert predicted == pytest.approx(row["reported_tflops_per_gpu"], rel=0.10)
