"""The contract every parallel strategy keeps, built-in or third-party, as checks.

`StrategyContract(strategy, session)` holds the checks; each raises
`ContractViolation` (an AssertionError, so pytest shows it as a failed assertion)
naming the spec and what broke. Checks of the strategy alone:

- "config-schema": `config_type` is a frozen attrs class, every field has a default,
  and `neutral_config()` on one GPU is an instance of it.
- "registered": the session got the strategy through `llmpar_register_strategies`
  (a plugin lists it), under a name usable as a TOML key.
- "malformed-table": a table of the wrong shape, an unknown key or a value of the
  wrong type or range gives SpecError with a `$.parallel.<name>` key path, never
  another exception.

Checks on one spec table (each returns the cases it could exercise on it: 0 when
the strategy's own checks reject every config there):

- "neutral-is-identity": under `neutral_config(layout)` memory, FLOPs, collectives and
  offloading equal those of the spec without the strategy at all (where the strategy
  names a neutral config for the other strategies' degrees).
- "memory-falls-with-degree": where the schema has a `degree`, per-GPU memory never
  grows as it doubles from 1 to 8, every other degree held: model states and buffers
  never, and the total only where a GPU holds more micro-batches in flight (pipeline
  schedules).
- "order-independent": the plan does not depend on the order strategies are
  registered or applied in, nor on what was evaluated before.
- "well-formed-transform": divisors >= 1, bytes, FLOPs and times finite and >= 0,
  collective groups of the strategy's own that divide the GPU count, overlaps in
  [0, 1], stages that cover the layers once; the plan's numbers finite and >= 0.
- "fast-form-agrees": for a strategy with a fast form (`vectorised`), the search's one
  call over a node of layouts gives each layout the first problem, memory and step
  time that evaluating it alone gives (`llmpar.testing.fast_form`); its neutral
  config passes its own checks.

The spec checks try the default config, degree 2 where the schema has a degree, and
every field set to another value its validators accept (`llmpar.testing.variants`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from llmpar.errors import SpecError
from llmpar.evaluation.evaluate import build_plan
from llmpar.hookspecs import hookimpl
from llmpar.loading.checks import resolve_layout
from llmpar.plan import Plan
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.strategy import Layout, Strategy
from llmpar.testing.contract_checks import (
    MALFORMED_VALUES,
    ROUNDING_BYTES,
    TOML_KEY,
    ContractViolation,
    PluginContract,
    loaded,
)
from llmpar.testing.specs import REFERENCE_SPECS
from llmpar.testing.variants import field_variants

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

STRATEGY_CHECKS = ("config-schema", "registered", "malformed-table")
SPEC_CHECKS = ("neutral-is-identity", "memory-falls-with-degree", "order-independent",
               "well-formed-transform", "fast-form-agrees")
DEGREES = (1, 2, 4, 8)
"""Degrees tried where a schema has one."""
IDENTITY_FIELDS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                   "buffers_bytes", "total_bytes", "host_bytes", "stages", "activation_tensors",
                   "flops_per_step", "hardware_flops_per_step", "offload_seconds")
"""Plan fields a neutral config leaves alone (with the collectives, compared apart)."""


class _Registers:
    """A plugin that hands over one strategy object."""

    def __init__(self, strategy: Strategy[Any]):
        self.strategy = strategy

    @hookimpl
    def llmpar_register_strategies(self, register: Callable[[Strategy[Any]], None]) -> None:
        register(self.strategy)


def _builtin_names() -> frozenset[str]:
    return frozenset(Session(load_entry_points=False).strategies)


class StrategyContract(PluginContract):
    """The contract checks for one strategy, in one session (default: `llmpar.Session()`,
    built-ins and installed plugins)."""

    KIND = "strategy"
    SECTION = "parallel"
    ALONE_CHECKS = STRATEGY_CHECKS
    ON_SPEC_CHECKS = SPEC_CHECKS
    ACCEPTED = "every check"

    def __init__(self, strategy: Strategy[Any] | str, session: Session | None = None):
        self.session = session if session is not None else Session()
        if isinstance(strategy, str):
            strategy = loaded("strategy", self.session.strategies, strategy,
                              ", ".join(self.session.strategies))
        self.strategy = strategy
        self.plugged = strategy
        self.name: str = strategy.name

    # --- the strategy alone --------------------------------------------------------

    def check_config_schema(self) -> None:
        self._check_config_fields()
        config_type = self.strategy.config_type
        neutral = self.strategy.neutral_config(Layout(degrees={}, num_gpus=1))
        if not isinstance(neutral, config_type):
            self._fail("config-schema", f"neutral_config() on one GPU returned {neutral!r}, "
                       f"not a {config_type.__name__}")

    def check_registered(self) -> None:
        self._check_listed(self.session.strategies, "llmpar_register_strategies")
        self._check_one_owner(lambda info: info.strategies)
        if not isinstance(self.strategy.phase, int):
            self._fail("registered", f"phase {self.strategy.phase!r} is not an integer")

    def _with_table(self, base: dict[str, Any], value: Any) -> dict[str, Any]:
        return {**base, "parallel": {**base.get("parallel", {}), self.name: value}}

    # --- on one spec ---------------------------------------------------------------

    def check_identity(self, table: Mapping[str, Any]) -> int:
        base = self._base(table)
        if base is None:
            return 0
        neutral = self._neutral(base)
        if neutral is None:
            return 0
        spec = _with(base, self.name, neutral)
        plan = self._plan(spec)
        if plan is None:
            return 0
        without = attrs.evolve(spec, parallel={k: v for k, v in spec.parallel.items()
                                               if k != self.name})
        layout, problems = resolve_layout(without, self.session.strategies)
        if problems:
            return 0
        reference = build_plan(without, layout, self.session.strategies)
        changed = [f"{f}: {getattr(reference, f)!r} -> {getattr(plan, f)!r}"
                   for f in IDENTITY_FIELDS if getattr(reference, f) != getattr(plan, f)]
        if _collectives(reference) != _collectives(plan):
            changed.append(f"collectives: {_collectives(reference)} -> {_collectives(plan)}")
        if changed:
            self._fail("neutral-is-identity", f"{neutral!r} changed "
                       f"{'; '.join(changed)}", table)
        return 1

    def check_memory_falls_with_degree(self, table: Mapping[str, Any]) -> int:
        config_type = self.strategy.config_type
        if "degree" not in attrs.fields_dict(config_type):
            return 0
        base = self._base(table)
        if base is None:
            return 0
        start = _with(base, self.name, self._default())
        layout, problems = resolve_layout(start, self.session.strategies)
        if problems:
            return 0
        pinned = {name: _pin(config, layout.degree(name))
                  for name, config in start.parallel.items() if name != self.name}
        others = start.hardware.num_gpus // layout.degree(self.name)
        plans: list[tuple[int, Plan]] = []
        for degree in DEGREES:
            gpus = others * degree if self.strategy.multiplies_gpus else start.hardware.num_gpus
            spec = attrs.evolve(
                start, hardware=attrs.evolve(start.hardware, num_gpus=gpus),
                parallel={**pinned, self.name: attrs.evolve(self._default(), degree=degree)})
            plan = self._plan(spec)
            if plan is not None:
                plans.append((degree, plan))
        for (low, before), (high, after) in zip(plans, plans[1:]):
            grown = [f"{label} grows from {a} at degree {low} to {b} at degree {high}"
                     for label, a, b in _memory_pairs(before, after)
                     if b > a + ROUNDING_BYTES]
            if grown:
                self._fail("memory-falls-with-degree", "; ".join(grown), table)
        return max(0, len(plans) - 1)

    def check_order_independent(self, table: Mapping[str, Any]) -> int:
        base = self._base(table)
        if base is None:
            return 0
        cases = 0
        for config in self._active_configs():
            spec = _with(base, self.name, config)
            plan = self._plan(spec)
            if plan is None:
                continue
            cases += 1
            self._check_stateless(config, spec, plan, base, table)
            for session in self._reordered_sessions:
                if session.evaluate(spec) != plan:
                    self._fail("order-independent", f"{config!r}: the plan changes with "
                               "the order plugins are registered in", table)
        return cases

    def check_well_formed_transform(self, table: Mapping[str, Any]) -> int:
        base = self._base(table)
        if base is None:
            return 0
        cases = 0
        neutral = self._neutral(base)
        configs = [*([] if neutral is None else [neutral]), *self._active_configs()]
        if "degree" in attrs.fields_dict(self.strategy.config_type):
            configs += [attrs.evolve(self._default(), degree=d) for d in DEGREES[2:]]
        for config in configs:
            spec = _with(base, self.name, config)
            plan = self._plan(spec)
            if plan is None:
                continue
            cases += 1
            self._check_well_formed(config, spec, plan, table)
        return cases

    def check_fast_form(self, table: Mapping[str, Any]) -> int:
        if not self.strategy.vectorised:
            return 0
        base = self._base(table)
        if base is None:
            return 0
        cases = 0
        neutral = self._neutral(base)
        if neutral is not None:
            layout, _ = resolve_layout(_with(base, self.name, neutral), self.session.strategies)
            problems = self.strategy.check(neutral, _with(base, self.name, neutral), layout)
            if problems:
                self._fail("fast-form-agrees", f"the neutral config {neutral!r} fails its own "
                           f"checks: {[str(p) for p in problems]}", table)
        for config in self._active_configs():
            spec = _with(base, self.name, config)
            if self._plan(spec) is None:
                continue
            cases += 1
            self._check_fast_form(config, spec, table)
        return cases

    # --- running them --------------------------------------------------------------

    def spec_check_methods(self) -> dict[str, Callable[[Mapping[str, Any]], int]]:
        return {"neutral-is-identity": self.check_identity,
                "memory-falls-with-degree": self.check_memory_falls_with_degree,
                "order-independent": self.check_order_independent,
                "well-formed-transform": self.check_well_formed_transform,
                "fast-form-agrees": self.check_fast_form}

    def applies(self, check: str) -> bool:
        """Whether `check` means anything for this strategy (degrees need a degree)."""
        if check == "memory-falls-with-degree":
            return "degree" in attrs.fields_dict(self.strategy.config_type)
        if check == "fast-form-agrees":
            return self.strategy.vectorised
        return True

    # --- helpers -------------------------------------------------------------------

    def _neutral(self, base: Spec) -> Any | None:
        """The strategy's neutral config among the other degrees of `base`."""
        layout, problems = resolve_layout(base, self.session.strategies)
        return None if problems else self.strategy.neutral_config(layout)

    def _default(self) -> Any:
        return self.strategy.config_type()

    def _active_configs(self) -> list[Any]:
        """The default config, degree 2 where the schema has a degree, and each field at
        another value its validators accept."""
        configs = [self._default()]
        if "degree" in attrs.fields_dict(self.strategy.config_type):
            configs.append(attrs.evolve(self._default(), degree=2))
        return configs + list(field_variants(self.strategy.config_type))

    def _base(self, table: Mapping[str, Any]) -> Spec | None:
        """The spec without this strategy's table; None when it does not load."""
        parallel = {k: v for k, v in dict(table.get("parallel", {})).items() if k != self.name}
        try:
            return self.session.load_spec({**table, "parallel": parallel})
        except SpecError:
            return None

    def _spec_detail(self, spec: Spec) -> str:
        return f"\n  parallel: {spec.parallel!r}"

    @functools.cached_property
    def _reordered_sessions(self) -> tuple[Session, ...]:
        """For a third-party strategy: hermetic sessions registering it first and last
        among the other third-party strategies."""
        if self.name in _builtin_names():
            return ()
        builtin = _builtin_names()
        others = [_Registers(s) for n, s in self.session.strategies.items()
                  if n not in builtin and n != self.name]
        mine = _Registers(self.strategy)
        return (Session(load_entry_points=False, plugins=[mine, *others]),
                Session(load_entry_points=False, plugins=[*reversed(others), mine]))


def _with(spec: Spec, name: str, config: Any) -> Spec:
    return attrs.evolve(spec, parallel={**spec.parallel, name: config})


def _pin(config: Any, degree: int) -> Any:
    """`config` with its degree fixed at the resolved one (no -1 fill)."""
    if "degree" in attrs.fields_dict(type(config)):
        return attrs.evolve(config, degree=degree)
    return config


def _in_flight(plan: Plan) -> float:
    return max((stage.micro_batches_in_flight for stage in plan.stages), default=1.0)


def _memory_pairs(before: Plan, after: Plan) -> list[tuple[str, int, int]]:
    """(what, bytes before, bytes after) that must not grow with a degree: the model
    states and buffers always; the total and the allocated peak of the step
    (`training.memory_peak.allocated_bytes`) too, unless a GPU now holds more
    micro-batches in flight (1F1B's first stage holds one per stage, so its embedding
    activations grow with the pipeline degree: Narayanan et al. 2021, arXiv:2104.04473,
    Sec. 2.2.1). Not the device peak: NCCL's buffers grow with the process groups a
    degree adds."""
    def states(plan: Plan) -> int:
        return max((s.total_bytes - (s.activations_bytes or 0) for s in plan.stages),
                   default=plan.total_bytes - (plan.activations_bytes or 0))

    pairs = [("model states and buffers (busiest stage)", states(before), states(after))]
    if _in_flight(after) <= _in_flight(before):
        pairs.append(("total_bytes", before.total_bytes, after.total_bytes))
        peaks = (before.training.memory_peak if before.training else None,
                 after.training.memory_peak if after.training else None)
        if peaks[0] is not None and peaks[1] is not None:
            pairs.append(("allocated peak", peaks[0].allocated_bytes,
                          peaks[1].allocated_bytes))
    return pairs


def _collectives(plan: Plan) -> list[tuple[Any, ...]]:
    return sorted((c.strategy, c.operation, c.buffer_bytes, c.group_size, c.tier,
                   c.calls_per_step, c.seconds) for c in plan.collectives)


def check_strategy_contract(strategy: Strategy[Any] | str, *, session: Session | None = None,
                            specs: Iterable[Mapping[str, Any]] | Any = None) -> dict[str, int]:
    """Run every contract check on `strategy` (an object or a loaded strategy's name).

    `specs`: spec tables for the spec checks, or a Hypothesis strategy drawing them
    (run under the active Hypothesis settings); default `REFERENCE_SPECS`. Raises
    ContractViolation naming every broken check; returns the cases each spec check
    exercised. A spec check that applies to the strategy but that no spec exercised
    is a violation too: the strategy's own checks rejected every config tried.
    """
    contract = StrategyContract(strategy, session)
    failures: list[str] = []
    for check in STRATEGY_CHECKS:
        try:
            contract.check(check)
        except ContractViolation as error:
            failures.append(str(error))
    counts = dict.fromkeys(SPEC_CHECKS, 0)

    def run(table: Mapping[str, Any]) -> None:
        for check in SPEC_CHECKS:
            counts[check] += contract.check(check, table)

    try:
        if specs is not None and hasattr(specs, "example"):  # a Hypothesis strategy
            from hypothesis import given

            given(cast("SearchStrategy[Mapping[str, Any]]", specs))(run)()
        else:
            for table in REFERENCE_SPECS if specs is None else specs:
                run(table)
    except ContractViolation as error:
        failures.append(str(error))
    else:
        failures += [f"strategy {contract.name!r}: no spec exercised {check!r} (its checks "
                     "rejected every config tried, or it named no neutral config)"
                     for check, count in counts.items()
                     if count == 0 and contract.applies(check)]
    if failures:
        raise ContractViolation("\n".join(failures))
    return counts


__all__ = ["DEGREES", "IDENTITY_FIELDS", "MALFORMED_VALUES", "ROUNDING_BYTES", "SPEC_CHECKS",
           "STRATEGY_CHECKS", "TOML_KEY", "ContractViolation", "StrategyContract",
           "check_strategy_contract"]
