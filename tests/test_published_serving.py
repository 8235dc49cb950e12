"""The serving validation page (docs/validation-serving.md) is what
validation/published_serving.py prints today, and every committed serving row is
evaluated: its spec loads, fits and gives a prediction (the rows are validation only;
their errors are reported, not held to a tolerance)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from validation_scripts import load_script

import llmpar

report = load_script("published_serving")
ROWS = report.all_rows()
PAGE = Path(__file__).resolve().parent.parent / "docs" / "validation-serving.md"


def test_the_page_is_current():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert report.main() == 0
    assert PAGE.read_text(encoding="utf-8") == printed.getvalue(), (
        "regenerate: python validation/published_serving.py > docs/validation-serving.md")


@pytest.mark.parametrize(("name", "row"), ROWS, ids=[r.label for _, r in ROWS])
def test_every_row_is_predicted(name, row):
    spec = llmpar.load_spec(row.spec)
    plan = llmpar.evaluate(spec)
    assert plan.fits, name
    value = report.predicted_tokens_per_second_per_gpu(plan, row.phase,
                                                       spec.inference.prompt_tokens)
    assert value is not None and value > 0
    # Never above what the roofline floor of the phase allows.
    pool = plan.serving[0]
    phase = pool.phases[0 if row.phase == "prefill" else 1]
    assert phase.seconds >= phase.floor_seconds


def test_every_file_cites_its_source_and_states_assumptions():
    for path in sorted(report.PUBLISHED.glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        assert "Assumptions" in text and "source = " in text, path.name
