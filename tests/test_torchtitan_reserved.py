"""torchtitan's logged reserved peaks (`memory: X GiB(Y%)`, max_memory_reserved()) of
Llama-3-8B runs on H100s, against llmpar's reserved peak of the same runs
(validation/published/memory/torchtitan_reserved_logs.toml; docs/validation-memory.md)."""

from __future__ import annotations

import tomllib

import pytest
from validation_scripts import load_script

import llmpar

REPORT = load_script("report_memory_peak")
GIB = 2**30


def _runs() -> list[dict]:
    return tomllib.loads(REPORT.TORCHTITAN.read_text())["row"]


def test_every_log_states_its_source_and_a_consistent_capacity():
    """Each row names its pull request and the commit its configuration was read at, and
    its GiB and percentage give the same device total (95.0 GiB, torchtitan's
    get_device_properties().total_memory of the 96 GB H100), to the log's rounding."""
    runs = _runs()
    assert len(runs) == 2
    for run in runs:
        assert run["repository"] == "pytorch/torchtitan" and run["pull_request"] > 0
        assert len(run["config_commit"]) == 40
        total = run["max_reserved_gib"] / (run["percent_of_total"] / 100)
        assert total == pytest.approx(95.0, abs=0.05)


@pytest.mark.parametrize("run", _runs(), ids=lambda r: f"pr{r['pull_request']}")
def test_each_log_s_spec_evaluates_as_the_run_was_launched(run):
    """The spec loads and evaluates under the torchtitan profile: FSDP2 over every rank
    (torchtitan shards over data x context), one 8192-token sequence per data-parallel
    rank, expandable segments (so reserved is allocated rounded up to 2 MiB pages), and
    the three numbers ordered allocated <= reserved <= device."""
    spec = REPORT.torchtitan_spec(run)
    plan = llmpar.evaluate(spec)
    checked = llmpar.Session()._checked(spec, None)[0]
    assert checked.training.profile.expandable_segments
    assert checked.hardware.num_gpus == run["num_gpus"]
    peak = plan.training.memory_peak
    assert peak.allocated_bytes <= peak.reserved_bytes <= peak.device_bytes
    assert peak.reserved_bytes - peak.allocated_bytes < 2 * 2**20 * 64


def test_rows_are_the_logged_values_against_the_plans():
    """The page's rows are computed, not written: each error is llmpar's reserved peak of
    the row's spec over the logged GiB."""
    rows = REPORT.torchtitan_rows()
    assert [r["run"]["pull_request"] for r in rows] == [1287, 1884]
    for row in rows:
        plan = llmpar.evaluate(REPORT.torchtitan_spec(row["run"]))
        reserved = plan.training.memory_peak.reserved_bytes
        assert row["reserved"] == reserved
        assert row["error"] == pytest.approx(reserved / (row["run"]["max_reserved_gib"] * GIB) - 1)


def test_the_page_shows_the_torchtitan_section():
    """docs/validation-memory.md is regenerated whole by test_memory_peak's page test; here
    the section and each row's source are on it."""
    page = (REPORT.HERE.parent / "docs" / "validation-memory.md").read_text()
    assert "## Published logs: torchtitan's reserved peak" in page
    for run in _runs():
        assert f"pytorch/torchtitan #{run['pull_request']}, step {run['step']}" in page


def test_fsdp2_side_streams_hold_too_little_to_explain_the_logs():
    """The page's bound on FSDP2's own streams' pools (side_stream_bytes): Llama-3-8B's
    all-gather stream holds at most the [norm, output] unit (128,256 x 4096) and one block
    (attention 4096 x (4096 + 2 x 1024) + 4096 x 4096, SwiGLU 3 x 4096 x 14336, two norms
    of 4096) whole in bf16; the copy-in and reduce-scatter streams shards of them (2 and 4
    bytes over the shard degree). Below what either log holds above llmpar's reserved
    peak."""
    block = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    pair = 128256 * 4096 + block
    for row in REPORT.torchtitan_rows():
        found = REPORT.side_stream_bytes(row["run"])
        n = row["run"]["num_gpus"]
        assert found["all-gather outputs"] == pytest.approx(2 * pair, rel=1e-4)
        assert found["all-gather inputs"] == pytest.approx(2 * pair / n, rel=1e-4)
        assert found["reduce-scatter outputs"] == pytest.approx(4 * pair / n, rel=1e-4)
        assert sum(found.values()) < 0.3 * (row["measured"] - row["reserved"])
