"""The contract every workload keeps (`llmpar.workload`), as checks.

`WorkloadContract(workload, session)` holds them; each raises `ContractViolation` naming
the spec and what broke. Checks of the workload alone:

- "config-schema": `config_type` is a frozen attrs class whose every field has a default.
- "registered": the session got it through `llmpar_register_workloads` (one plugin lists
  it), under a bare TOML key that no strategy has.
- "malformed-table": a `[workload.<name>]` that is not a table or has an unknown key gives
  SpecError at `$.workload.<name>`; wrong values for every field give SpecError, never
  another exception.

Checks on one spec table (each returns the cases it exercised: the default config and
every field at another value its validators accept, where the workload's rules accept it):

- "well-formed-transform": the transform's numbers finite and >= 0, its own collectives'
  groups fit, none of the strategies' divisions stated; the plan's numbers finite, >= 0.
- "adds-to-training": against the spec without the workload, gradients, optimizer states
  and the saved activations are unchanged (the workload trains nothing else) and weights,
  buffers, the total, model and hardware FLOPs never fall (it adds models and work).
- "order-independent": the plan is the same after evaluating another spec, and with the
  strategies applied in the reverse order.
- "fast-form-agrees": the search's one call over a node of layouts around the spec gives
  each layout what evaluating it alone gives (`llmpar.testing.fast_form`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from llmpar.errors import SpecError
from llmpar.plan import Plan
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.testing.contract_checks import (
    ROUNDING_BYTES,
    ContractViolation,
    PluginContract,
    is_frozen,
    loaded,
)
from llmpar.testing.specs import REFERENCE_SPECS
from llmpar.testing.variants import field_variants
from llmpar.workload import Workload, WorkloadTable, dividing_fields

WORKLOAD_CHECKS = ("config-schema", "registered", "malformed-table")
WORKLOAD_SPEC_CHECKS = ("well-formed-transform", "adds-to-training", "order-independent",
                        "fast-form-agrees")
UNCHANGED_FIELDS = ("gradients_bytes", "optimizer_bytes", "activations_bytes",
                    "activation_tensors")
"""Plan fields a workload leaves alone: it trains nothing beside the model."""
GROWING_FIELDS = ("weights_bytes", "buffers_bytes", "total_bytes", "host_bytes")
GROWING_TRAINING_FIELDS = ("flops_per_step", "hardware_flops_per_step")


class WorkloadContract(PluginContract):
    """The contract checks for one workload, in one session (default: `llmpar.Session()`)."""

    KIND = "workload"
    SECTION = "workload"
    ALONE_CHECKS = WORKLOAD_CHECKS
    ON_SPEC_CHECKS = WORKLOAD_SPEC_CHECKS
    ACCEPTED = "its checks"

    def __init__(self, workload: Workload[Any] | str, session: Session | None = None):
        self.session = session if session is not None else Session()
        if isinstance(workload, str):
            workload = loaded("workload", self.session.workloads, workload,
                              ", ".join(self.session.workloads) or "-")
        self.workload = workload
        self.plugged = workload
        self.name: str = workload.name

    # --- the workload alone --------------------------------------------------------

    def check_config_schema(self) -> None:
        self._check_config_fields()

    def _default_frozen(self) -> bool:
        try:
            config = self.workload.config_type()
        except Exception:
            return True  # config-schema's defaults check names the problem
        return is_frozen(config)

    def check_registered(self) -> None:
        self._check_listed(self.session.workloads, "llmpar_register_workloads")
        if self.name in self.session.strategies:
            self._fail("registered", f"{self.name!r} is also a strategy's name")
        self._check_one_owner(lambda info: info.workloads)

    def _with_table(self, base: dict[str, Any], value: Any) -> dict[str, Any]:
        return {**base, "workload": {self.name: value}}

    # --- on one spec ---------------------------------------------------------------

    def check_well_formed_transform(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, plan in self._cases(table):
            cases += 1
            self._check_well_formed(config, spec, plan, table)
        return cases

    def _more_transform_problems(self, transform: Any) -> list[str]:
        return [f"states {f}, a strategy's field" for f in dividing_fields(transform)]

    def check_adds_to_training(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, plan in self._cases(table):
            without = self._plan(attrs.evolve(spec, workload={}))
            if without is None:
                continue
            cases += 1
            changed = [f"{f}: {getattr(without, f)!r} -> {getattr(plan, f)!r}"
                       for f in UNCHANGED_FIELDS if getattr(without, f) != getattr(plan, f)]
            changed += [f"{f} falls: {getattr(without, f)} -> {getattr(plan, f)}"
                        for f in GROWING_FIELDS
                        if getattr(plan, f) < getattr(without, f) - ROUNDING_BYTES]
            changed += [f"{f} falls: {getattr(without.training, f)} -> "
                        f"{getattr(plan.training, f)}" for f in GROWING_TRAINING_FIELDS
                        if getattr(plan.training, f) < getattr(without.training, f)]
            if changed:
                self._fail("adds-to-training", f"{config!r}: {'; '.join(changed)}", table)
        return cases

    def check_order_independent(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, plan in self._cases(table):
            cases += 1
            self._check_stateless(config, spec, plan, attrs.evolve(spec, workload={}), table)
        return cases

    def check_fast_form(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, _ in self._cases(table):
            cases += 1
            self._check_fast_form(config, spec, table)
        return cases

    # --- running them --------------------------------------------------------------

    def spec_check_methods(self) -> dict[str, Callable[[Mapping[str, Any]], int]]:
        return {"well-formed-transform": self.check_well_formed_transform,
                "adds-to-training": self.check_adds_to_training,
                "order-independent": self.check_order_independent,
                "fast-form-agrees": self.check_fast_form}

    # --- helpers -------------------------------------------------------------------

    def _configs(self) -> list[Any]:
        config_type = self.workload.config_type
        return [config_type(), *field_variants(config_type)]

    def _cases(self, table: Mapping[str, Any]) -> Iterable[tuple[Any, Spec, Plan]]:
        """(config, spec, plan) of every config the workload's rules accept on `table`."""
        raw = {k: v for k, v in table.items() if k != "workload"}
        try:
            base = self.session.load_spec(raw)
        except SpecError:
            return
        for config in self._configs():
            entry = WorkloadTable(name=self.name, config=config, workload=self.workload)
            spec = attrs.evolve(base, workload={self.name: entry})
            try:
                spec = self.session.load_spec(spec)
            except SpecError:
                continue
            plan = self._plan(spec)
            if plan is not None:
                yield config, spec, plan


def check_workload_contract(workload: Workload[Any] | str, *, session: Session | None = None,
                            specs: Iterable[Mapping[str, Any]] = REFERENCE_SPECS
                            ) -> dict[str, int]:
    """Run every check on `specs` (default `REFERENCE_SPECS`); raise ContractViolation at
    the first failure; return the cases each spec check exercised (a check that no spec
    exercised fails)."""
    contract = WorkloadContract(workload, session)
    for check in WORKLOAD_CHECKS:
        contract.check(check)
    counts = dict.fromkeys(WORKLOAD_SPEC_CHECKS, 0)
    for table in specs:
        for check in WORKLOAD_SPEC_CHECKS:
            counts[check] += contract.check(check, table)
    idle = [check for check, count in counts.items() if not count]
    if idle:
        raise ContractViolation(f"workload {contract.name!r}: no spec exercised "
                                f"{', '.join(idle)} (its rules rejected every config)")
    return counts


__all__ = ["WORKLOAD_CHECKS", "WORKLOAD_SPEC_CHECKS", "WorkloadContract",
           "check_workload_contract"]
