"""The plugin keeps llmpar's workload contract and arrives only through its entry point."""

from __future__ import annotations

import importlib.metadata

import llmpar
import pytest
from llmpar.cli.main import main
from llmpar.testing import (
    REFERENCE_SPECS,
    WORKLOAD_CHECKS,
    WORKLOAD_SPEC_CHECKS,
    WorkloadContract,
    check_workload_contract,
)

from llmpar_dpo import DpoWorkload, __version__


def test_found_through_the_llmpar_entry_point_group(session):
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="llmpar")
                if ep.name == "dpo"]
    assert entry.value == "llmpar_dpo.plugin"
    assert entry.dist.name == "llmpar-dpo" and entry.dist.version == __version__
    assert isinstance(session.workloads["dpo"], DpoWorkload)
    (info,) = [info for info in session.plugins() if info.name == "dpo"]
    assert (info.distribution, info.version, info.strategies, info.workloads) == (
        "llmpar-dpo", __version__, (), ("dpo",))


def test_nothing_registers_it_but_the_entry_point():
    assert "dpo" not in llmpar.Session(load_entry_points=False).workloads


def test_llmpar_plugins_lists_it_with_distribution_and_version(capsys):
    assert main(["plugins"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dpo")]
    assert row.split() == ["dpo", "llmpar-dpo", __version__, "loaded", "workload.dpo"]


def test_blocked_it_is_named_where_a_spec_needs_it():
    session = llmpar.Session(blocked=["dpo"])
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate({**REFERENCE_SPECS[1], "workload": {"dpo": {}}})
    (problem,) = error.value.problems
    assert problem.path == "$.workload.dpo" and "blocked" in problem.message


def test_keeps_the_whole_contract_on_the_reference_specs(session):
    counts = check_workload_contract("dpo", session=session)
    assert all(count > 0 for count in counts.values())


@pytest.mark.parametrize("check", WORKLOAD_CHECKS + WORKLOAD_SPEC_CHECKS)
def test_each_contract_check(session, check):
    contract = WorkloadContract("dpo", session)
    if check in WORKLOAD_CHECKS:
        contract.check(check)
    else:
        assert sum(contract.check(check, table) for table in REFERENCE_SPECS) > 0
