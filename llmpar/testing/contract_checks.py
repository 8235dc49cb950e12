"""What the strategy contract (`llmpar.testing.contract`) and the workload contract
(`llmpar.testing.workload_contract`) check the same way, in one place: looking a plugin
up by name, the shape of its config class, how it is registered, malformed tables, the
well-formed transform, a plan that keeps no state between calls, running one check by
name and the failure messages. Each suite names its own checks and the cases they run on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import attrs

from llmpar.errors import PluginError, SpecError
from llmpar.evaluation.evaluate import build_plan
from llmpar.footprint.baseline import baseline_footprint
from llmpar.loading.checks import resolve_layout
from llmpar.plan import Plan
from llmpar.plugins import PluginInfo
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.strategy import StrategyContext
from llmpar.testing.fast_form import fast_form_failure
from llmpar.testing.specs import REFERENCE_SPECS
from llmpar.testing.wellformed import plan_problems, transform_problems

ROUNDING_BYTES = 8
"""Slack for per-component rounding to whole bytes when comparing totals."""
MALFORMED_VALUES: tuple[Any, ...] = ("not a number", -7, 0, 1.5, True, [], {"nested": [1]})
"""Values tried for every field of the strategy's table: each must plan or give SpecError."""
TOML_KEY = re.compile(r"[A-Za-z0-9_-]+")

T = TypeVar("T")


class ContractViolation(AssertionError):
    """A strategy broke its contract; the message names the check, the spec and why."""


def loaded(kind: str, found: Mapping[str, T], name: str, listed: str) -> T:
    """The `kind` called `name` among those a session loaded (`found`, listed as
    `listed`); ContractViolation when none is."""
    if name not in found:
        raise ContractViolation(f"no loaded plugin provides {kind} {name!r}; loaded: {listed}")
    return found[name]


def is_frozen(config: Any) -> bool:
    """Whether setting the first field of the attrs instance `config` is refused."""
    fields = attrs.fields(type(config))
    if not fields:
        return True
    try:
        setattr(config, fields[0].name, getattr(config, fields[0].name))
    except attrs.exceptions.FrozenInstanceError:
        return True
    return False


class PluginContract:
    """The checks both contract suites run alike, on `self.plugged` (a strategy or a
    workload) called `self.name`, in `self.session`. A suite sets what it is (`KIND`),
    the spec section its table lives in (`SECTION`), its checks (`ALONE_CHECKS`, run on
    the plugin alone, and `ON_SPEC_CHECKS`, on one spec table) and the method of each spec
    check (`spec_check_methods`)."""

    KIND: ClassVar[str]
    SECTION: ClassVar[str]
    ALONE_CHECKS: ClassVar[tuple[str, ...]]
    ON_SPEC_CHECKS: ClassVar[tuple[str, ...]]
    ACCEPTED: ClassVar[str]
    """Who accepted a spec whose evaluation failed: "every check", "its checks"."""

    session: Session
    name: str
    plugged: Any

    def spec_check_methods(self) -> dict[str, Callable[[Mapping[str, Any]], int]]:
        raise NotImplementedError

    def check(self, check: str, table: Mapping[str, Any] | None = None) -> int:
        """Run one check by name; spec checks need `table`. Returns the cases exercised."""
        if check in self.ALONE_CHECKS:
            getattr(self, "check_" + check.replace("-", "_"))()
            return 1
        if check not in self.ON_SPEC_CHECKS:
            raise ValueError(f"unknown check {check!r}; known: "
                             f"{', '.join(self.ALONE_CHECKS + self.ON_SPEC_CHECKS)}")
        if table is None:
            raise ValueError(f"check {check!r} needs a spec table")
        return self.spec_check_methods()[check](table)

    # --- the plugin alone ----------------------------------------------------------

    def _check_config_fields(self) -> None:
        """"config-schema": an attrs class, every field with a default, frozen."""
        config_type = self.plugged.config_type
        if not attrs.has(config_type):
            self._fail("config-schema", f"config_type {config_type!r} is not an attrs class")
        missing = [f.name for f in attrs.fields(config_type) if f.default is attrs.NOTHING]
        if missing:
            self._fail("config-schema", f"fields without a default: {', '.join(missing)} "
                       f"(an empty [{self.SECTION}.{self.name}] table must load)")
        if not self._default_frozen():
            self._fail("config-schema", f"{config_type.__name__} is not frozen "
                       "(use @attrs.frozen(kw_only=True))")

    def _default_frozen(self) -> bool:
        return is_frozen(self.plugged.config_type())

    def _check_listed(self, found: Mapping[str, Any], hook: str) -> None:
        """"registered": a bare TOML key under which the session has the plugin."""
        if not TOML_KEY.fullmatch(self.name):
            self._fail("registered", f"name {self.name!r} is not a bare TOML key")
        entry = found.get(self.name)
        if entry is None or type(entry) is not type(self.plugged):
            self._fail("registered", f"the session has no {self.KIND} of this type under "
                       f"{self.name!r}: register it from {hook} and name "
                       "the plugin in the `llmpar` entry-point group")

    def _check_one_owner(self, listed: Callable[[PluginInfo], tuple[str, ...]]) -> None:
        """"registered": exactly one plugin lists it."""
        owners = [info.name for info in self.session.plugins() if self.name in listed(info)]
        if len(owners) != 1:
            self._fail("registered", f"expected one plugin to list it, found {owners}")

    def check_malformed_table(self, table: Mapping[str, Any] | None = None) -> None:
        base = dict(table if table is not None else REFERENCE_SPECS[0])
        path = f"$.{self.SECTION}.{self.name}"
        cases: list[tuple[str, Any]] = [("a table that is a number", 5),
                                        ("an unknown key", {"no_such_setting": 1})]
        for field in attrs.fields(self.plugged.config_type):
            cases += [(f"{field.name} = {value!r}", {field.name: value})
                      for value in MALFORMED_VALUES]
        for label, value in cases:
            spec = self._with_table(base, value)
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

    def _with_table(self, base: dict[str, Any], value: Any) -> dict[str, Any]:
        """The spec table `base` with `value` as the plugin's own table."""
        raise NotImplementedError

    # --- on one spec ---------------------------------------------------------------

    def _check_well_formed(self, config: Any, spec: Spec, plan: Plan,
                           table: Mapping[str, Any]) -> None:
        """"well-formed-transform" for one config on `spec`, whose plan is `plan`."""
        layout, _ = resolve_layout(spec, self.session.strategies)
        ctx = StrategyContext(spec=spec, footprint=baseline_footprint(spec), layout=layout)
        transform = self.plugged.transform(config, ctx)
        problems = transform_problems(transform, self.name, spec) + plan_problems(plan)
        problems += self._more_transform_problems(transform)
        if problems:
            self._fail("well-formed-transform", f"{config!r}: {'; '.join(problems)}", table)

    def _more_transform_problems(self, transform: Any) -> list[str]:
        return []

    def _check_stateless(self, config: Any, spec: Spec, plan: Plan, other: Spec,
                         table: Mapping[str, Any]) -> None:
        """"order-independent": `plan` (of `spec`) stays with the strategies applied in
        the reverse order, and after evaluating the spec `other`."""
        layout, _ = resolve_layout(spec, self.session.strategies)
        backwards = dict(reversed(list(self.session.strategies.items())))
        if build_plan(spec, layout, backwards) != plan:
            self._fail("order-independent", f"{config!r}: the plan changes when the "
                       "strategies are applied in the reverse order", table)
        self._plan(other)
        if self._plan(spec) != plan:
            self._fail("order-independent", f"{config!r}: the plan changes after "
                       "evaluating another spec (state kept between calls?)", table)

    def _check_fast_form(self, config: Any, spec: Spec, table: Mapping[str, Any]) -> None:
        """"fast-form-agrees" for one config on `spec`."""
        failure = fast_form_failure(self.session, spec, config)
        if failure is not None:
            self._fail("fast-form-agrees", failure, table)

    # --- helpers -------------------------------------------------------------------

    def _fail(self, check: str, message: str, table: Mapping[str, Any] | None = None) -> None:
        where = f"\n  spec: {dict(table)!r}" if table is not None else ""
        raise ContractViolation(f"{self.KIND} {self.name!r} breaks {check!r}: {message}{where}")

    def _plan(self, spec: Spec) -> Plan | None:
        """The plan; None when a check rejects the spec."""
        try:
            return self.session.evaluate(spec)
        except SpecError:
            return None
        except PluginError as error:
            raise ContractViolation(f"{self.KIND} {self.name!r}: evaluating a spec "
                                    f"{self.ACCEPTED} accepted failed: {error}"
                                    f"{self._spec_detail(spec)}\n  model: {spec.model.name}"
                                    ) from error

    def _spec_detail(self, spec: Spec) -> str:
        """What of `spec` a failed evaluation's message names before its model."""
        return ""


__all__ = ["MALFORMED_VALUES", "ROUNDING_BYTES", "TOML_KEY", "ContractViolation",
           "PluginContract", "is_frozen", "loaded"]
