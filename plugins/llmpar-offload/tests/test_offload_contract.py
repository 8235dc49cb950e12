"""The plugin keeps llmpar's strategy contract and arrives only through its entry point."""

from __future__ import annotations

import importlib.metadata

import llmpar
import pytest
from hypothesis import given, settings
from llmpar.cli.main import main
from llmpar.testing import (
    REFERENCE_SPECS,
    SPEC_CHECKS,
    STRATEGY_CHECKS,
    StrategyContract,
    check_strategy_contract,
    parallel_training_specs,
)

from llmpar_offload import OffloadStrategy, __version__


def test_found_through_the_llmpar_entry_point_group(session):
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="llmpar")
                if ep.name == "offload"]
    assert entry.value == "llmpar_offload.plugin"
    assert entry.dist.name == "llmpar-offload" and entry.dist.version == __version__
    assert isinstance(session.strategies["offload"], OffloadStrategy)
    (info,) = [info for info in session.plugins() if info.name == "offload"]
    assert (info.distribution, info.version, info.strategies) == (
        "llmpar-offload", __version__, ("offload",))


def test_nothing_registers_it_but_the_entry_point():
    assert "offload" not in llmpar.Session(load_entry_points=False).strategies


def test_llmpar_plugins_lists_it_with_distribution_and_version(capsys):
    assert main(["plugins"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("offload")]
    assert row.split() == ["offload", "llmpar-offload", __version__, "loaded", "offload"]


def test_keeps_the_whole_contract_on_the_reference_specs(session):
    counts = check_strategy_contract("offload", session=session)
    assert counts["neutral-is-identity"] == len(REFERENCE_SPECS)
    assert counts["well-formed-transform"] > 0 and counts["order-independent"] > 0
    assert counts["memory-falls-with-degree"] == 0  # no degree: the check does not apply


@pytest.mark.parametrize("check", STRATEGY_CHECKS + SPEC_CHECKS)
def test_each_contract_check(session, check):
    contract = StrategyContract("offload", session)
    if check in STRATEGY_CHECKS:
        contract.check(check)
    else:
        assert sum(contract.check(check, table) for table in REFERENCE_SPECS) > 0 or (
            not contract.applies(check))


@settings(max_examples=20)
@given(table=parallel_training_specs())
def test_keeps_the_contract_on_drawn_layouts(session, table):
    contract = StrategyContract("offload", session)
    for check in SPEC_CHECKS:
        contract.check(check, table)
