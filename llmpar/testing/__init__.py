"""The test kit for strategy authors: valid specs to draw from, and the contract suite.

Needs the test extra (`pip install 'llmpar[test]'`: Hypothesis). A plugin's tests run
the suite on its strategy in three lines:

    from llmpar.testing import check_strategy_contract

    def test_my_strategy_keeps_the_contract():
        check_strategy_contract("mine")   # as registered by the installed plugin

or one pytest case per check, with failures reported separately:

    import pytest
    from llmpar.testing import REFERENCE_SPECS, SPEC_CHECKS, StrategyContract

    @pytest.mark.parametrize("check", SPEC_CHECKS)
    @pytest.mark.parametrize("table", REFERENCE_SPECS)
    def test_contract(check, table):
        StrategyContract("mine").check(check, table)

and on drawn specs, with Hypothesis:

    from hypothesis import given
    from llmpar.testing import parallel_training_specs

    @given(parallel_training_specs())
    def test_contract_on_drawn_specs(table):
        for check in SPEC_CHECKS:
            StrategyContract("mine").check(check, table)

llmpar runs the same suite on every strategy it loads (tests/test_contract.py).

A workload plugin (`llmpar.workload`) runs its own suite the same way:

    from llmpar.testing import check_workload_contract

    def test_my_workload_keeps_the_contract():
        check_workload_contract("dpo")
"""

from llmpar.testing.contract import (
    SPEC_CHECKS,
    STRATEGY_CHECKS,
    ContractViolation,
    StrategyContract,
    check_strategy_contract,
)
from llmpar.testing.profiles import load_hypothesis_profiles
from llmpar.testing.specs import (
    GPUS,
    REFERENCE_SPECS,
    architectures,
    moe_architectures,
    parallel_training_specs,
    training_specs,
)
from llmpar.testing.wellformed import plan_problems, transform_problems
from llmpar.testing.workload_contract import (
    WORKLOAD_CHECKS,
    WORKLOAD_SPEC_CHECKS,
    WorkloadContract,
    check_workload_contract,
)

__all__ = [
    "GPUS",
    "REFERENCE_SPECS",
    "SPEC_CHECKS",
    "STRATEGY_CHECKS",
    "WORKLOAD_CHECKS",
    "WORKLOAD_SPEC_CHECKS",
    "ContractViolation",
    "StrategyContract",
    "WorkloadContract",
    "architectures",
    "check_strategy_contract",
    "check_workload_contract",
    "load_hypothesis_profiles",
    "moe_architectures",
    "parallel_training_specs",
    "plan_problems",
    "training_specs",
    "transform_problems",
]
