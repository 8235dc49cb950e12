"""The strategy contract suite (`llmpar.testing`): every loaded strategy keeps it,
built-in or installed, and it catches strategies that break it."""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import pytest
from hypothesis import given, settings

import llmpar
from llmpar import (
    Collective,
    HostWork,
    Layout,
    Offload,
    Problem,
    Shard,
    Strategy,
    Transform,
)
from llmpar.spec.validators import positive
from llmpar.testing import (
    REFERENCE_SPECS,
    SPEC_CHECKS,
    STRATEGY_CHECKS,
    ContractViolation,
    StrategyContract,
    check_strategy_contract,
    parallel_training_specs,
    training_specs,
)

NAMES = tuple(llmpar.default_session().strategies)
"""Every strategy of the default session: llmpar's and the installed plugins'."""


@pytest.fixture(scope="module")
def contracts() -> dict[str, StrategyContract]:
    session = llmpar.default_session()
    return {name: StrategyContract(name, session) for name in NAMES}


def test_every_builtin_strategy_is_covered():
    assert {"data", "tensor", "sequence", "context", "expert", "pipeline"} <= set(NAMES)


@pytest.mark.parametrize("check", STRATEGY_CHECKS)
@pytest.mark.parametrize("name", NAMES)
def test_strategy_keeps_its_contract(contracts, name, check):
    contracts[name].check(check)


@pytest.mark.parametrize("check", SPEC_CHECKS)
@pytest.mark.parametrize("name", NAMES)
def test_strategy_keeps_its_contract_on_reference_specs(contracts, name, check):
    contract = contracts[name]
    cases = sum(contract.check(check, table) for table in REFERENCE_SPECS)
    if contract.applies(check):
        assert cases > 0, f"{name}: no reference spec exercised {check}"
    else:
        assert cases == 0


@settings(max_examples=15)
@given(table=parallel_training_specs())
def test_every_strategy_keeps_its_contract_on_drawn_layouts(contracts, table):
    for contract in contracts.values():
        for check in SPEC_CHECKS:
            contract.check(check, table)


@settings(max_examples=15)
@given(table=training_specs())
def test_every_strategy_keeps_its_contract_on_drawn_runs(contracts, table):
    for contract in contracts.values():
        for check in SPEC_CHECKS:
            contract.check(check, table)


def test_drawn_layouts_load_and_plan():
    session = llmpar.Session(load_entry_points=False)

    @settings(max_examples=30)
    @given(parallel_training_specs())
    def plans(table):
        plan = session.evaluate(table)
        assert plan.num_gpus == table["hardware"]["num_gpus"]

    plans()


# --- the suite catches what it should --------------------------------------------------

@attrs.frozen(kw_only=True)
class DegreeConfig:
    degree: int = attrs.field(default=1, validator=positive)


class Splits(Strategy):
    """Keeps the contract: splits the weights over `degree` GPUs."""

    name = "splits"
    config_type = DegreeConfig
    phase = 50

    def transform(self, config, ctx):
        return Transform(strategy=self.name, shards=(
            Shard(component="weights", divisor=config.degree, reason="toy"),))


def session_with(*strategies: Strategy) -> llmpar.Session:
    class Plugin:
        @llmpar.hookimpl
        def llmpar_register_strategies(self, register):
            for strategy in strategies:
                register(strategy)

    return llmpar.Session(load_entry_points=False, plugins=[Plugin()])


def violation(strategy: Strategy, check: str, table: dict[str, Any] | None = None) -> str:
    contract = StrategyContract(strategy.name, session_with(strategy))
    with pytest.raises(ContractViolation) as caught:
        if table is None and check in SPEC_CHECKS:
            for reference in REFERENCE_SPECS:
                contract.check(check, reference)
        else:
            contract.check(check, table)
    return str(caught.value)


def test_a_strategy_that_keeps_the_contract_passes_it_all():
    counts = check_strategy_contract("splits", session=session_with(Splits()))
    assert set(counts) == set(SPEC_CHECKS)
    assert all(counts[check] for check in SPEC_CHECKS if check != "fast-form-agrees")
    assert counts["fast-form-agrees"] == 0  # no fast form: nothing to compare


class FastSplits(Splits):
    """The same, with a fast form: its one formula takes arrays as well."""

    vectorised = True

    def transform(self, config, ctx):
        per_micro_batch = 1e6 * ctx.spec.training.micro_batch_size * (config.degree - 1)
        return Transform(strategy=self.name, buffer_bytes=per_micro_batch, shards=(
            Shard(component="weights", divisor=config.degree, reason="toy"),))


def test_a_fast_form_that_agrees_passes():
    counts = check_strategy_contract("splits", session=session_with(FastSplits()))
    assert counts["fast-form-agrees"] > 0


def test_a_fast_form_that_disagrees_is_caught():
    class Silent(FastSplits):
        def transform(self, config, ctx):
            b = ctx.spec.training.micro_batch_size
            buffer = 1e6 * b if isinstance(b, int) else 1e6  # ignores the array
            return Transform(strategy=self.name, buffer_bytes=buffer * (config.degree - 1))

    assert "bytes in one call" in violation(Silent(), "fast-form-agrees")


def test_a_fast_form_that_branches_on_an_array_is_caught():
    class Branches(FastSplits):
        def transform(self, config, ctx):
            full = ctx.spec.training.recompute == "full"
            buffer = 2e6 if full else 1e6
            return Transform(strategy=self.name, buffer_bytes=buffer * (config.degree - 1))

    assert "truth value of an array" in violation(Branches(), "fast-form-agrees")


def test_suite_runs_on_a_hypothesis_strategy_of_specs():
    counts = check_strategy_contract("splits", session=session_with(Splits()),
                                     specs=training_specs())
    assert counts["neutral-is-identity"] > 0


def test_a_field_without_default_breaks_the_schema():
    @attrs.frozen(kw_only=True)
    class NoDefault:
        degree: int

    class Bad(Splits):
        config_type = NoDefault

        def neutral_config(self, layout):
            return NoDefault(degree=1)

    assert "fields without a default: degree" in violation(Bad(), "config-schema")


def test_a_mutable_config_breaks_the_schema():
    @attrs.define(kw_only=True)
    class Mutable:
        degree: int = 1

    class Bad(Splits):
        config_type = Mutable

    assert "is not frozen" in violation(Bad(), "config-schema")


def test_a_strategy_not_in_the_session_is_not_registered():
    contract = StrategyContract(Splits(), llmpar.Session(load_entry_points=False))
    with pytest.raises(ContractViolation, match="llmpar_register_strategies"):
        contract.check("registered")


def test_degree_one_that_changes_memory_breaks_identity():
    class Bad(Splits):
        def transform(self, config, ctx):
            return Transform(strategy=self.name, buffer_bytes=1000.0)

    message = violation(Bad(), "neutral-is-identity")
    assert "buffers_bytes: 0 -> 1000" in message and "spec:" in message


def test_memory_that_grows_with_the_degree_is_caught():
    class Bad(Splits):
        def transform(self, config, ctx):
            return Transform(strategy=self.name, buffer_bytes=1e9 * (config.degree - 1))

    assert "total_bytes grows" in violation(Bad(), "memory-falls-with-degree")


def test_state_kept_between_calls_is_caught():
    class Counting(Splits):
        def __init__(self):
            self.calls = 0

        def transform(self, config, ctx):
            self.calls += 1
            return Transform(strategy=self.name, buffer_bytes=float(self.calls))

    assert "plan changes" in violation(Counting(), "order-independent")


def test_a_collective_group_that_does_not_divide_the_gpus_is_caught():
    class Bad(Splits):
        def transform(self, config, ctx):
            return Transform(strategy=self.name, collectives=(Collective(
                strategy=self.name, name="splits.odd", operation="all-reduce",
                buffer_bytes=1e6, group_size=3, reason="toy"),))

    message = violation(Bad(), "well-formed-transform", dict(REFERENCE_SPECS[1]))
    assert "group_size 3 does not divide num_gpus (8)" in message


def test_a_shard_that_multiplies_is_caught():
    class Bad(Splits):
        def transform(self, config, ctx):
            return Transform(strategy=self.name, shards=(
                Shard(component="weights", divisor=0.5, reason="toy"),))

    assert "divisor must be >= 1, got 0.5" in violation(Bad(), "well-formed-transform",
                                                        dict(REFERENCE_SPECS[0]))


def test_a_degree_without_a_validator_is_caught():
    @attrs.frozen(kw_only=True)
    class Unchecked:
        degree: int = 1

    class Bad(Splits):
        config_type = Unchecked

    assert "degree = 0 raised ZeroDivisionError" in violation(Bad(), "malformed-table")


def test_a_bad_value_that_crashes_the_transform_is_caught():
    @attrs.frozen(kw_only=True)
    class Loose:
        degree: int = 1
        factor: Any = 1.0

    class Bad(Splits):
        config_type = Loose

        def transform(self, config, ctx):
            return Transform(strategy=self.name, shards=(
                Shard(component="weights", divisor=config.factor, reason="toy"),))

    assert "not SpecError" in violation(Bad(), "malformed-table")


def test_a_strategy_whose_checks_reject_everything_exercises_nothing():
    class Picky(Splits):
        def check(self, config, spec, layout: Layout):
            return [Problem("$.parallel.splits", "never")]

    with pytest.raises(ContractViolation, match="no spec exercised 'neutral-is-identity'"):
        check_strategy_contract(Picky(), session=session_with(Picky()))


def test_an_unknown_check_or_a_missing_table_is_refused():
    contract = StrategyContract(Splits(), session_with(Splits()))
    with pytest.raises(ValueError, match="unknown check"):
        contract.check("fast")
    with pytest.raises(ValueError, match="needs a spec table"):
        contract.check("order-independent")


# --- offloading: Transform.offloads and Transform.host_work compose into the plan -------

@attrs.frozen(kw_only=True)
class HostConfig:
    component: str = "optimizer"
    seconds_per_parameter: float = 0.0
    passes_per_step: float = 1.0
    overlap: float = 0.0


class ToHost(Strategy):
    """A toy offloader: keeps `component` in host memory and charges host work on it."""

    name = "tohost"
    config_type = HostConfig
    phase = 90

    def transform(self, config, ctx):
        return Transform(
            strategy=self.name,
            offloads=(Offload(component=config.component, reason="toy"),),
            host_work=(HostWork(strategy=self.name, name="tohost.work",
                                component=config.component,
                                seconds_per_parameter=config.seconds_per_parameter,
                                passes_per_step=config.passes_per_step,
                                overlap=config.overlap, reason="toy"),))


SEVEN_B = {"model": {"parameters": 7e9}, "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
           "training": {"mfu": 0.5, "global_batch_size": 8, "sequence_length": 2048}}


def with_tohost(spec: dict, zero: int = 0, **host) -> dict:
    return {**spec, "parallel": {"data": {"zero": zero}, "tohost": host}}


def test_offloaded_states_leave_the_gpu_after_shards_and_count_on_the_host():
    session = session_with(ToHost())
    base = session.evaluate({**SEVEN_B, "parallel": {"data": {"zero": 1}}})
    moved = session.evaluate(with_tohost(SEVEN_B, zero=1))
    assert base.optimizer_bytes == 12 * 7e9 / 8  # ZeRO-1 over 8 ranks, then offloaded
    assert moved.optimizer_bytes == 0 and moved.host_bytes == base.optimizer_bytes
    assert moved.total_bytes == base.total_bytes - base.optimizer_bytes
    assert moved.weights_bytes == base.weights_bytes
    assert moved.stages[0].host_bytes == moved.host_bytes
    assert "host_bytes" in moved.explain("host_bytes")


def test_host_work_costs_passes_times_parameters_times_seconds_per_parameter():
    session = session_with(ToHost())
    base = session.evaluate({**SEVEN_B, "parallel": {"data": {"zero": 1}}})
    plan = session.evaluate(with_tohost(SEVEN_B, zero=1, seconds_per_parameter=1e-9,
                                        passes_per_step=2.0))
    partition = 7e9 / 8  # parameters whose optimizer states one GPU holds under ZeRO-1
    assert plan.offload_seconds == pytest.approx(2 * partition * 1e-9)
    assert plan.exposed_offload_seconds == plan.offload_seconds  # overlap 0
    assert plan.step_seconds == pytest.approx(base.step_seconds + plan.offload_seconds)
    assert "exposed offload" in plan.derivation("step_seconds").rule
    assert plan.derivation("offload_seconds").inputs["tohost.work_seconds"] == pytest.approx(
        plan.offload_seconds)


def test_overlappable_host_work_hides_behind_compute_up_to_compute():
    session = session_with(ToHost())
    base = session.evaluate({**SEVEN_B, "parallel": {"data": {"zero": 1}}})
    hidden = session.evaluate(with_tohost(SEVEN_B, zero=1, seconds_per_parameter=1e-12,
                                          overlap=1.0))
    assert hidden.offload_seconds > 0 and hidden.exposed_offload_seconds == 0
    assert hidden.step_seconds == base.step_seconds
    long = session.evaluate(with_tohost(SEVEN_B, zero=1, seconds_per_parameter=1e-6,
                                        overlap=1.0))
    assert long.exposed_offload_seconds == pytest.approx(long.offload_seconds
                                                         - base.step_seconds)


def test_the_gpu_skips_the_optimizer_step_of_offloaded_states():
    session = session_with(ToHost())
    spec = {"model": "llama-3-8b", "hardware": {"cluster": "dgx-a100", "num_gpus": 8},
            "training": {"global_batch_size": 8, "sequence_length": 2048}}
    base = session.evaluate({**spec, "parallel": {}})
    moved = session.evaluate(with_tohost(spec))
    assert base.time_model == moved.time_model == "modelled"
    assert base.optimizer_seconds > 0 and moved.optimizer_seconds == 0
    # Gradients on the host: the GPU still updates its states, without reading them from HBM.
    assert 0 < session.evaluate(with_tohost(spec, component="gradients")).optimizer_seconds < (
        base.optimizer_seconds)


def test_host_memory_of_a_node_is_checked():
    session = session_with(ToHost())
    small = {**SEVEN_B, "hardware": {**SEVEN_B["hardware"], "host_memory_bytes": "100 GB"}}
    plan = session.evaluate(with_tohost(small))
    assert any("host memory per node" in w and "8 GPUs" in w for w in plan.warnings)
    assert not any("host memory" in w for w in session.evaluate(with_tohost(SEVEN_B)).warnings)


def test_the_built_in_strategies_records_are_the_checked_constructors_records():
    """`checked_shard` and `checked_collective` (a built-in strategy's records, built
    without validators) make the record the public constructor makes, defaults included,
    and refuse a field the class lacks or a required one left out; the public classes
    still reject a bad value, as a third-party strategy's."""
    from llmpar.strategy import GroupSelection, checked_collective, checked_shard

    experts = frozenset({"experts"})
    shard = dict(component="weights", divisor=8, reason="toy", excluded=experts)
    assert checked_shard(**shard) == Shard(**shard)
    assert hash(checked_shard(**shard)) == hash(Shard(**shard))
    fields = dict(strategy="data", name="toy", operation="all-gather", group_size=8,
                  calls_per_step=2.0, pieces=32, bytes_per_parameter=2.0,
                  component="weights", parameter_groups=GroupSelection(groups=experts))
    built = checked_collective(**fields)
    assert built == Collective(**fields)
    assert attrs.asdict(built, recurse=False) == attrs.asdict(Collective(**fields),
                                                              recurse=False)
    assert built.hides_behind == "compute" and built.kernel == "" and built.overlap == 0.0
    with pytest.raises(TypeError):
        checked_collective(**fields, buckets=2)
    with pytest.raises(TypeError):
        checked_shard(component="weights", reason="toy")
    with pytest.raises(ValueError):
        Shard(component="weights", divisor=0.5, reason="toy")
    # checked_shard states Shard's fields one by one: the same names and defaults
    parameters = inspect.signature(checked_shard).parameters
    assert {name: p.default for name, p in parameters.items()} == {
        a.name: (inspect.Parameter.empty if a.default is attrs.NOTHING else a.default)
        for a in attrs.fields(Shard)}
    with pytest.raises(ValueError):
        Collective(**{**fields, "operation": "broadcast"})
