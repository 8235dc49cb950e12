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

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from llmpar.errors import PluginError, SpecError
from llmpar.evaluation.evaluate import build_plan
from llmpar.footprint.baseline import baseline_footprint
from llmpar.loading.checks import resolve_layout
from llmpar.plan import Plan
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.strategy import StrategyContext
from llmpar.testing.contract import MALFORMED_VALUES, ROUNDING_BYTES, TOML_KEY, ContractViolation
from llmpar.testing.fast_form import fast_form_failure
from llmpar.testing.specs import REFERENCE_SPECS
from llmpar.testing.variants import field_variants
from llmpar.testing.wellformed import plan_problems, transform_problems
from llmpar.workload import Workload, WorkloadTable, dividing_fields

WORKLOAD_CHECKS = ("config-schema", "registered", "malformed-table")
WORKLOAD_SPEC_CHECKS = ("well-formed-transform", "adds-to-training", "order-independent",
                        "fast-form-agrees")
UNCHANGED_FIELDS = ("gradients_bytes", "optimizer_bytes", "activations_bytes",
                    "activation_tensors")
"""Plan fields a workload leaves alone: it trains nothing beside the model."""
GROWING_FIELDS = ("weights_bytes", "buffers_bytes", "total_bytes", "host_bytes")
GROWING_TRAINING_FIELDS = ("flops_per_step", "hardware_flops_per_step")


class WorkloadContract:
    """The contract checks for one workload, in one session (default: `llmpar.Session()`)."""

    def __init__(self, workload: Workload[Any] | str, session: Session | None = None):
        self.session = session if session is not None else Session()
        if isinstance(workload, str):
            if workload not in self.session.workloads:
                raise ContractViolation(f"no loaded plugin provides workload {workload!r}; "
                                        f"loaded: {', '.join(self.session.workloads) or '-'}")
            workload = self.session.workloads[workload]
        self.workload = workload
        self.name: str = workload.name

    # --- the workload alone --------------------------------------------------------

    def check_config_schema(self) -> None:
        config_type = self.workload.config_type
        if not attrs.has(config_type):
            self._fail("config-schema", f"config_type {config_type!r} is not an attrs class")
        missing = [f.name for f in attrs.fields(config_type) if f.default is attrs.NOTHING]
        if missing:
            self._fail("config-schema", f"fields without a default: {', '.join(missing)} "
                       f"(an empty [workload.{self.name}] table must load)")
        if not _frozen(config_type):
            self._fail("config-schema", f"{config_type.__name__} is not frozen "
                       "(use @attrs.frozen(kw_only=True))")

    def check_registered(self) -> None:
        if not TOML_KEY.fullmatch(self.name):
            self._fail("registered", f"name {self.name!r} is not a bare TOML key")
        found = self.session.workloads.get(self.name)
        if found is None or type(found) is not type(self.workload):
            self._fail("registered", "the session has no workload of this type under "
                       f"{self.name!r}: register it from llmpar_register_workloads and name "
                       "the plugin in the `llmpar` entry-point group")
        if self.name in self.session.strategies:
            self._fail("registered", f"{self.name!r} is also a strategy's name")
        owners = [info.name for info in self.session.plugins() if self.name in info.workloads]
        if len(owners) != 1:
            self._fail("registered", f"expected one plugin to list it, found {owners}")

    def check_malformed_table(self, table: Mapping[str, Any] | None = None) -> None:
        base = dict(table if table is not None else REFERENCE_SPECS[0])
        path = f"$.workload.{self.name}"
        cases: list[tuple[str, Any]] = [("a table that is a number", 5),
                                        ("an unknown key", {"no_such_setting": 1})]
        for field in attrs.fields(self.workload.config_type):
            cases += [(f"{field.name} = {value!r}", {field.name: value})
                      for value in MALFORMED_VALUES]
        for label, value in cases:
            spec = {**base, "workload": {self.name: value}}
            try:
                self.session.evaluate(spec)
            except SpecError as error:
                if label.startswith(("a table", "an unknown")) and not any(
                        p.path.startswith(path) for p in error.problems):
                    self._fail("malformed-table", f"{label}: no problem at {path}...; got "
                               f"{[str(p) for p in error.problems]}")
            except Exception as error:
                self._fail("malformed-table", f"{label} raised {type(error).__name__} "
                           f"({error}), not SpecError")
            else:
                if label.startswith(("a table", "an unknown")):
                    self._fail("malformed-table", f"{label} was accepted")

    # --- on one spec ---------------------------------------------------------------

    def check_well_formed_transform(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, plan in self._cases(table):
            cases += 1
            layout, _ = resolve_layout(spec, self.session.strategies)
            ctx = StrategyContext(spec=spec, footprint=baseline_footprint(spec), layout=layout)
            transform = self.workload.transform(config, ctx)
            problems = transform_problems(transform, self.name, spec) + plan_problems(plan)
            problems += [f"states {f}, a strategy's field" for f in dividing_fields(transform)]
            if problems:
                self._fail("well-formed-transform", f"{config!r}: {'; '.join(problems)}",
                           table)
        return cases

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
            layout, _ = resolve_layout(spec, self.session.strategies)
            backwards = dict(reversed(list(self.session.strategies.items())))
            if build_plan(spec, layout, backwards) != plan:
                self._fail("order-independent", f"{config!r}: the plan changes when the "
                           "strategies are applied in the reverse order", table)
            self._plan(attrs.evolve(spec, workload={}))
            if self._plan(spec) != plan:
                self._fail("order-independent", f"{config!r}: the plan changes after "
                           "evaluating another spec (state kept between calls?)", table)
        return cases

    def check_fast_form(self, table: Mapping[str, Any]) -> int:
        cases = 0
        for config, spec, _ in self._cases(table):
            cases += 1
            failure = fast_form_failure(self.session, spec, config)
            if failure is not None:
                self._fail("fast-form-agrees", failure, table)
        return cases

    # --- running them --------------------------------------------------------------

    def check(self, check: str, table: Mapping[str, Any] | None = None) -> int:
        """Run one check by name; spec checks need `table`. Returns the cases exercised."""
        if check in WORKLOAD_CHECKS:
            getattr(self, "check_" + check.replace("-", "_"))()
            return 1
        if check not in WORKLOAD_SPEC_CHECKS:
            raise ValueError(f"unknown check {check!r}; known: "
                             f"{', '.join(WORKLOAD_CHECKS + WORKLOAD_SPEC_CHECKS)}")
        if table is None:
            raise ValueError(f"check {check!r} needs a spec table")
        method = {"well-formed-transform": self.check_well_formed_transform,
                  "adds-to-training": self.check_adds_to_training,
                  "order-independent": self.check_order_independent,
                  "fast-form-agrees": self.check_fast_form}[check]
        return method(table)

    # --- helpers -------------------------------------------------------------------

    def _fail(self, check: str, message: str, table: Mapping[str, Any] | None = None) -> None:
        where = f"\n  spec: {dict(table)!r}" if table is not None else ""
        raise ContractViolation(f"workload {self.name!r} breaks {check!r}: {message}{where}")

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

    def _plan(self, spec: Spec) -> Plan | None:
        try:
            return self.session.evaluate(spec)
        except SpecError:
            return None
        except PluginError as error:
            raise ContractViolation(f"workload {self.name!r}: evaluating a spec its checks "
                                    f"accepted failed: {error}\n  model: {spec.model.name}"
                                    ) from error


def _frozen(config_type: type[Any]) -> bool:
    try:
        config = config_type()
    except Exception:
        return True  # config-schema's defaults check names the problem
    fields = attrs.fields(config_type)
    if not fields:
        return True
    try:
        setattr(config, fields[0].name, getattr(config, fields[0].name))
    except attrs.exceptions.FrozenInstanceError:
        return True
    return False


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
