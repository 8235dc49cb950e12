"""A Session owns a plugin manager, the strategies, presets and search dimensions its
plugins registered, and a converter: a hermetic planner. `llmpar.evaluate` uses a
default one made on first use; embedders make their own, e.g.
`Session(load_entry_points=False, plugins=[my_plugin])`. Loading plugins, blocking them
and setting aside broken ones is `llmpar.plugins`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from llmpar import plugins as plugin_loading
from llmpar.errors import PluginError, Problem, SpecError, did_you_mean
from llmpar.evaluation.cache import EvaluationCache
from llmpar.evaluation.evaluate import build_plan, memory_timeline
from llmpar.evaluation.peak import MemoryMoment
from llmpar.extensions import (
    collective_model,
    gather_activation_models,
    isolated,
    report_sections,
)
from llmpar.footprint.activations import ActivationModel
from llmpar.inference.evaluate import build_inference_plan
from llmpar.launch.registry import LaunchTargets, gather_launch_targets
from llmpar.launch.target import Launch, PlannedLaunchTarget
from llmpar.loading.checks import checked_layout, nested_axes
from llmpar.loading.converter import make_converter
from llmpar.loading.dump import spec_to_dict
from llmpar.loading.framework import with_profile_efficiencies
from llmpar.loading.loader import load
from llmpar.loading.presets import PresetCatalog, catalog_of
from llmpar.loading.reader import SpecSource, with_text
from llmpar.placement import Axis
from llmpar.plan import Plan
from llmpar.plugins import PluginInfo
from llmpar.report.tables import Table
from llmpar.search.dimension import SearchDimension
from llmpar.search.dimensions import gather_dimensions
from llmpar.spec import Spec
from llmpar.strategies import BUILTIN_PLUGINS
from llmpar.strategy import Layout, Strategy
from llmpar.workload import Workload

ENTRY_POINT_GROUP = plugin_loading.ENTRY_POINT_GROUP
__all__ = ["ENTRY_POINT_GROUP", "PluginInfo", "Session"]


class Session:
    """Plugins, strategies, presets and the spec converter, made once.

    `load_entry_points` None follows `LLMPAR_DISABLE_PLUGIN_AUTOLOAD`; `blocked` adds to
    `LLMPAR_BLOCK_PLUGINS`; `environ` (default `os.environ`) is where both are read, so
    `environ={}` ignores them. A plugin that breaks is set aside (`plugins()` lists it
    as broken); `strict=True` raises PluginError instead, for plugin authors' tests.
    """

    def __init__(self, *, plugins: Iterable[object] = (), load_entry_points: bool | None = None,
                 blocked: Iterable[str] = (), environ: Mapping[str, str] | None = None,
                 strict: bool = False):
        environ = os.environ if environ is None else environ
        if load_entry_points is None:
            load_entry_points = not plugin_loading.autoload_disabled(environ)
        self._plugins = plugin_loading.PluginSet(
            builtins=BUILTIN_PLUGINS, plugins=plugins, load_entry_points=load_entry_points,
            blocked=plugin_loading.blocked_names(environ, blocked))
        self.plugin_manager = self._plugins.manager
        self._strategy_owners: dict[str, str] = {}
        self.strategies: Mapping[str, Strategy[Any]] = MappingProxyType(
            self._collect_strategies())
        self.presets: PresetCatalog = self._collect_presets()
        self.search_dimensions: tuple[SearchDimension, ...] = gather_dimensions(
            self._plugins, self.strategies)
        self.activation_models: Mapping[str, ActivationModel] = MappingProxyType(
            gather_activation_models(self._plugins))
        """llmpar's activation models and those plugins registered, by name."""
        self._workload_owners: dict[str, str] = {}
        self.workloads: Mapping[str, Workload[Any]] = MappingProxyType(
            self._collect_workloads())
        """The workloads plugins registered (`[workload.<name>]`), by name."""
        self._drop_strategies_of_broken_plugins()
        self.axes: Mapping[str, Axis] = MappingProxyType(
            {name: s.axis for name, s in self.strategies.items() if s.axis is not None})
        """Where each strategy's ranks may sit (`[parallel] order`)."""
        self.nested_axes = nested_axes(self.strategies)
        if strict and self._plugins.broken:
            raise PluginError("; ".join(f"plugin {name!r}: {error}"
                                        for name, error in self._plugins.broken.items()))
        self.converter = make_converter()
        self.cache = EvaluationCache(activation_models=self.activation_models,
                                     collective_seconds=collective_model(self._plugins))
        """The plugins' models, and footprints and training facts of earlier evaluations
        (pure; bounded)."""

    def _collect_strategies(self) -> dict[str, Strategy[Any]]:
        found: dict[str, Strategy[Any]] = {}
        owners = self._strategy_owners

        def registrar(plugin: str) -> Callable[[Strategy[Any]], None]:
            def register(strategy: Strategy[Any]) -> None:
                _check_strategy(strategy, plugin)
                if strategy.name in found:
                    raise PluginError(f"strategy {strategy.name!r} registered by both "
                                      f"{owners[strategy.name]!r} and {plugin!r}")
                found[strategy.name] = strategy
                owners[strategy.name] = plugin

            return register

        self._plugins.call_registering("llmpar_register_strategies", registrar,
                                       "to register strategies")
        self._forget_broken(found)
        return dict(sorted(found.items(), key=lambda item: (item[1].phase, item[0])))

    def _collect_workloads(self) -> dict[str, Workload[Any]]:
        found: dict[str, Workload[Any]] = {}
        owners = self._workload_owners

        def registrar(plugin: str) -> Callable[[Workload[Any]], None]:
            def register(workload: Workload[Any]) -> None:
                _check_workload(workload, plugin)
                taken = owners.get(workload.name) or self._strategy_owners.get(workload.name)
                if taken is not None:
                    raise PluginError(f"workload {workload.name!r} of {plugin!r}: the name is "
                                      f"taken by {taken!r}")
                found[workload.name] = workload
                owners[workload.name] = plugin

            return register

        self._plugins.call_registering("llmpar_register_workloads", registrar,
                                       "to register workloads")
        for name in [w for w, owner in owners.items() if owner in self._plugins.broken]:
            found.pop(name, None)
            del owners[name]
        return dict(sorted(found.items()))

    def _forget_broken(self, found: dict[str, Strategy[Any]]) -> None:
        """A plugin set aside keeps none of the strategies it registered."""
        for name in [s for s, owner in self._strategy_owners.items()
                     if owner in self._plugins.broken]:
            found.pop(name, None)
            del self._strategy_owners[name]

    def _drop_strategies_of_broken_plugins(self) -> None:
        """A plugin set aside after its strategies were taken (its search dimensions
        broke) takes them, and every dimension of theirs, with it."""
        kept = dict(self.strategies)
        self._forget_broken(kept)
        if len(kept) != len(self.strategies):
            self.strategies = MappingProxyType(kept)
            self.search_dimensions = tuple(d for d in self.search_dimensions
                                           if d.strategy in kept)

    def _collect_presets(self) -> PresetCatalog:
        folders: list[tuple[str, Path]] = []

        def registrar(plugin: str) -> Callable[[Path], None]:
            def register(folder: Path) -> None:
                if not isinstance(folder, (str, Path)):
                    raise PluginError(f"plugin {plugin!r} registered {folder!r} as a preset "
                                      "folder, not a path")
                folders.append((plugin, Path(folder)))

            return register

        self._plugins.call_registering("llmpar_register_presets", registrar,
                                       "to register presets")
        kept = [folder for plugin, folder in folders if plugin not in self._plugins.broken]
        # Built-ins first, so a plugin cannot shadow a shipped preset by accident.
        builtin = [f for f in kept if f.resolve().name in ("specs", "_specs")]
        return catalog_of(builtin[:1] + [f for f in kept if f not in builtin[:1]])

    def plugins(self) -> list[PluginInfo]:
        """Every plugin offered to the session, with its distribution, version and
        strategies, and whether it is loaded, broken (with the error) or blocked."""
        return self._plugins.info(self._strategy_owners, self._workload_owners)

    def unavailable(self, name: str) -> str | None:
        """Why the plugin `name` offers nothing here (broken, blocked), or None."""
        return self._plugins.unavailable(name)

    def load_spec(self, source: SpecSource | Spec | None = None,
                  overrides: Mapping[str, Any] | None = None, *,
                  text: str | None = None) -> Spec:
        """Read, structure and check a spec; raise SpecError naming every problem.

        The spec is `source` (a Spec, a path or a mapping) or `text`, TOML text: the
        explicit form for a spec held in a string. `overrides` sets dotted keys before
        structuring: {"hardware.num_gpus": 8}.
        """
        return self._checked(with_text(source, text), overrides)[0]

    def _checked(self, source: SpecSource | Spec,
                 overrides: Mapping[str, Any] | None) -> tuple[Spec, Layout]:
        """The checked spec and its resolved layout."""
        try:
            if isinstance(source, Spec) and not overrides:
                # A spec object this session checked before (frozen) checks the same.
                spec = with_profile_efficiencies(source)
                return spec, self.cache.checked(spec, lambda: self._layout_of(spec))
            table = spec_to_dict(source) if isinstance(source, Spec) else source
            spec = load(table, self.presets, self.strategies, self.converter, overrides,
                        self.activation_models, self.workloads)
            layout = self.cache.checked(spec, lambda: self._layout_of(spec))
        except SpecError as error:
            raise self._name_missing_plugins(error) from None
        return spec, layout

    def _layout_of(self, spec: Spec) -> Layout:
        """The resolved layout of `spec`; SpecError naming every cross-field problem."""
        layout, problems = checked_layout(spec, self.strategies)
        problems += self._activation_model_problems(spec)
        if problems or layout is None:
            raise SpecError(problems, spec.source)
        return layout

    def _activation_model_problems(self, spec: Spec) -> list[Problem]:
        name = spec.training.activation_model
        if spec.inference is not None or name in self.activation_models:
            return []
        listed = ", ".join(repr(n) for n in self.activation_models)
        return [Problem("$.training.activation_model", f"must be one of {listed}, got "
                        f"{name!r}{did_you_mean(name, self.activation_models)}")]

    def _name_missing_plugins(self, error: SpecError) -> SpecError:
        """Say which broken or blocked plugin an unknown `[parallel.<name>]` or
        `[workload.<name>]` needs."""
        problems = []
        for problem in error.problems:
            name = problem.path.removeprefix("$.parallel.").removeprefix("$.workload.")
            why = self.unavailable(name) if problem.path.count(".") == 2 else None
            problems.append(Problem(problem.path, f"{problem.message}; {why}") if why and
                            problem.path.startswith(("$.parallel.", "$.workload."))
                            else problem)
        return SpecError(problems, error.source)

    def emit_spec(self, spec: Spec) -> str:
        """The spec as TOML to save and change: its presets by name with only the fields
        that differ from them (`llmpar.loading.emit`), so that a later override of a
        preset (`hardware.cluster`, `model`) brings that preset's numbers; fully resolved
        where names cannot reproduce it. `load_spec` reads it back to an equal Spec."""
        from llmpar.loading.dump import toml_text
        from llmpar.loading.emit import emitted_table

        table = emitted_table(spec, spec_to_dict(spec, self.axes), self.presets,
                              self.load_spec)
        return toml_text(table)

    def evaluate(self, source: SpecSource | Spec | None = None,
                 overrides: Mapping[str, Any] | None = None, *,
                 text: str | None = None) -> Plan:
        """The Plan of a spec: `source` (a Spec, a path or a mapping) or `text`, TOML
        text (see `load_spec`)."""
        spec, layout = self._checked(with_text(source, text), overrides)
        failed_before = len(self._plugins.failures)
        hook = self.plugin_manager.hook.llmpar_plan
        plan: Plan
        if not hook.get_hookimpls():
            plan = self._build(spec, layout)
        else:
            plan = isolated(self._plugins, "llmpar_plan", lambda: hook.call_extra(
                [self._build], {"spec": spec, "layout": layout}))
        # Any hook of this evaluation (the plan's, a collective cost model's) may have set
        # a plugin aside; its numbers then come from llmpar's own model, and the plan says so.
        set_aside = tuple(self._plugins.failures[failed_before:])
        return plan.evolve(warnings=plan.warnings + set_aside) if set_aside else plan

    def memory_timeline(self, source: SpecSource | Spec,
                        overrides: Mapping[str, Any] | None = None) -> tuple[MemoryMoment, ...]:
        """Every pipeline stage's allocated memory at each modelled moment of one
        training step (`llmpar.evaluation.peak`); empty for a serving spec or without an
        activation estimate."""
        spec, layout = self._checked(source, overrides)
        if spec.inference is not None:
            return ()
        return memory_timeline(spec, layout, self.strategies, self.cache)

    def _build(self, spec: Spec, layout: Layout) -> Plan:
        """llmpar's own answer to `llmpar_plan`."""
        if spec.inference is not None:
            return build_inference_plan(spec, layout, self.strategies, cache=self.cache)
        return build_plan(spec, layout, self.strategies, self.cache)

    @functools.cached_property
    def launch_targets(self) -> LaunchTargets:
        """The launch targets plugins registered (`llmpar_launch_targets`), gathered on
        first use: a session that never launches pays nothing for them."""
        return gather_launch_targets(self._plugins)

    def launch(self, source: SpecSource | Spec, target: str | None = None,
               overrides: Mapping[str, Any] | None = None) -> Launch:
        """What framework `target` (a name or alias; default: the spec's `[training]
        framework`, else megatron-core; a serving spec's `[inference] engine`, else vllm)
        needs to run the spec's plan."""
        spec, layout = self._checked(source, overrides)
        if target is None and spec.inference is not None:
            engine = spec.inference.engine
            target = engine.name if engine is not None else "vllm"
        chosen = self.launch_targets.find(target or spec.training.profile.name)
        if isinstance(chosen, PlannedLaunchTarget):
            return chosen.launch_planned(spec, layout, self.evaluate(spec))
        return chosen.launch(spec, layout)

    def report_sections(self, plan: Plan) -> tuple[Table, ...]:
        """The sections plugins add to the report of `plan` (`llmpar_report_sections`)."""
        return report_sections(self._plugins, plan)


def _check_workload(workload: Workload[Any], plugin: str) -> None:
    for attribute in ("name", "config_type", "transform", "check"):
        if not hasattr(workload, attribute):
            raise PluginError(f"plugin {plugin!r} registered a workload without {attribute!r}")
    if not attrs.has(workload.config_type):
        raise PluginError(f"plugin {plugin!r}: workload {workload.name!r} config_type must be "
                          "an attrs class")


def _check_strategy(strategy: Strategy[Any], plugin: str) -> None:
    for attribute in ("name", "config_type"):
        if not hasattr(strategy, attribute):
            raise PluginError(f"plugin {plugin!r} registered a strategy without {attribute!r}")
    if not attrs.has(strategy.config_type):
        raise PluginError(f"plugin {plugin!r}: strategy {strategy.name!r} config_type must be "
                          "an attrs class")
