"""llmpar's collective cost against published NCCL measurements (docs/validation-collectives.md).

Each row of validation/published/collectives/*.toml is a measurement copied from a cited
source (nccl-tests output, or PyTorch's all-reduce timed the same way);
validation/collective_bandwidth.py builds the collective llmpar would cost for it and
`llmpar.communication.collectives.call_seconds` prices it on the row's cluster preset.

Only large messages (>= 64 MiB) are tested: there the time is bandwidth, which is what
`collective_efficiency` and the link choice decide. Small messages are reported, not tested:
their time depends on the harness (one process per GPU, one process for 8 GPUs, PyTorch)
and on NCCL's choice of algorithm and protocol more than on a per-step latency.

Tolerance: a row without a documented discrepancy must be predicted within 25% of its
measured time (0.75 <= predicted / measured <= 1.25). Those rows are the ring (and
point-to-point) measurements inside one NVLink domain; observed, they span 0.79 (A100
sendrecv, whose busbw is 65% of the link) to 1.02 (H100 ring all-reduce at 8 GiB), and 25%
is the bound beyond which the brief that commissioned these rows counts the model as off.

Rows where llmpar is off by more than that are not hidden by a looser tolerance: their data
file marks them with `expected_ratio = [low, high]` and an `expected_reason`, and the test
pins their predicted / measured inside that documented range, so a change to the model that
moves them (for better or worse) fails here until the data file is updated. Today those are
NVLink SHARP all-reduces (llmpar up to 1.34x pessimistic; on GB200 also 0.72x at 64 MiB),
two-node runs where NCCL's tree beats a ring over the node's NICs (up to 2.25x pessimistic),
one log excerpt slower than its own source's other run at mid sizes, and the first size of
one sendrecv sweep (0.46x, unexplained by its source).
"""

from __future__ import annotations

import pytest
from validation_scripts import load_script

TOLERANCE = 0.25

report = load_script("collective_bandwidth")

ROWS = [(path.stem, index, row)
        for path, data in report.sources()
        for index, row in enumerate(report.rows(data))]
LARGE = [item for item in ROWS if report.is_large(item[2])]


def _id(item) -> str:
    stem, index, row = item
    return f"{stem}-{index}-{row['operation']}-{row['gpus']}gpu-{row['size']}B"


def test_every_source_is_cited_and_has_large_rows():
    sources = report.sources()
    assert len(sources) >= 5
    for path, data in sources:
        assert data["title"] and data["citation"], path.name
        assert any(report.is_large(row) for row in report.rows(data)), path.name


@pytest.mark.parametrize("item", ROWS, ids=[_id(item) for item in ROWS])
def test_row_is_consistent_with_itself(item):
    """The copied numbers agree with nccl-tests' own formulas (algbw = size / time, busbw =
    algbw x factor, at the two decimals printed), which catches a mistyped digit."""
    _, _, row = item
    assert row["operation"] in report.OPERATIONS
    assert row["gpus"] >= row["nodes"] >= 1
    if "time_us" in row and row.get("algbw", 0) >= 1:
        assert row["size"] / row["time_us"] / 1e3 == pytest.approx(row["algbw"], rel=0.01)
    if row.get("algbw", 0) >= 1 and "busbw" in row:
        assert row["algbw"] * report.busbw_factor(row) == pytest.approx(row["busbw"], rel=0.01)


@pytest.mark.parametrize("item", LARGE, ids=[_id(item) for item in LARGE])
def test_large_message_time(item):
    _, _, row = item
    ratio = report.compare(row)["ratio"]
    bounds = report.expected(row)
    if bounds is None:
        assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (
            f"predicted / measured = {ratio:.2f} for {row['system']} {row['operation']} "
            f"{row['size']} B on {row['gpus']} GPUs")
    else:
        low, high = bounds
        assert low <= ratio <= high, (
            f"predicted / measured = {ratio:.2f} left the documented range [{low}, {high}] "
            f"({row['expected_reason']}): update the data file if the model changed")


def test_documented_discrepancies_are_discrepancies():
    """A range marked as a known miss must lie at least partly outside the tolerance;
    otherwise the mark hides nothing and should go."""
    for _, _, row in LARGE:
        bounds = report.expected(row)
        if bounds is not None:
            assert bounds[0] < 1 - TOLERANCE or bounds[1] > 1 + TOLERANCE, row["system"]
