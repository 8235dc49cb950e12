"""A Session owns a plugin manager, the strategies and presets it found, and a
converter: a hermetic planner. `llmpar.evaluate` uses a default one made on
first use; embedders make their own, e.g. `Session(load_entry_points=False,
plugins=[my_plugin])`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import pluggy

from llmpar import hookspecs
from llmpar.errors import PluginError, SpecError
from llmpar.evaluation.evaluate import build_plan
from llmpar.inference.evaluate import build_inference_plan
from llmpar.loading.checks import resolve_layout, spec_problems
from llmpar.loading.converter import make_converter
from llmpar.loading.dump import spec_to_dict
from llmpar.loading.loader import load
from llmpar.loading.presets import PresetCatalog, catalog_of
from llmpar.loading.reader import SpecSource
from llmpar.plan import Plan
from llmpar.spec import Spec
from llmpar.strategies import BUILTIN_PLUGINS
from llmpar.strategy import Strategy

ENTRY_POINT_GROUP = "llmpar"


@attrs.frozen
class PluginInfo:
    """A loaded plugin: its name, where it came from, and what it registered."""

    name: str
    distribution: str
    version: str
    strategies: tuple[str, ...] = ()


def _own_version() -> str:
    try:
        return importlib.metadata.version("llmpar")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Session:
    """Plugins, strategies, presets and the spec converter, made once."""

    def __init__(self, *, plugins: Iterable[object] = (), load_entry_points: bool = True):
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)
        self._origins: dict[str, tuple[str, str]] = {}
        self._register_builtins()
        if load_entry_points:
            self._load_entry_points()
        for plugin in plugins:
            name = self.plugin_manager.register(plugin)
            if name is not None:
                self._origins[name] = ("(registered in code)", "")
        try:
            self.plugin_manager.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
        self.strategies: Mapping[str, Strategy] = MappingProxyType(self._collect_strategies())
        self.presets: PresetCatalog = self._collect_presets()
        self.converter = make_converter()

    def _register_builtins(self) -> None:
        version = _own_version()
        for name, module in BUILTIN_PLUGINS:
            self.plugin_manager.register(importlib.import_module(module), name=name)
            self._origins[name] = ("llmpar", version)

    def _load_entry_points(self) -> None:
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self.plugin_manager.get_plugin(entry_point.name) is not None:
                continue  # llmpar's own, registered above under the same name
            dist = entry_point.dist
            label = f"{dist.name} {dist.version}" if dist else "unknown distribution"
            try:
                plugin = entry_point.load()
            except Exception as exc:
                raise PluginError(f"error importing plugin {entry_point.name!r} ({label}): "
                                  f"{type(exc).__name__}: {exc}") from exc
            self.plugin_manager.register(plugin, name=entry_point.name)
            self._origins[entry_point.name] = (dist.name, dist.version) if dist else ("?", "?")

    def _collect_strategies(self) -> dict[str, Strategy]:
        found: dict[str, Strategy] = {}
        owners: dict[str, str] = {}

        def registrar(plugin: str) -> Callable[[Strategy], None]:
            def register(strategy: Strategy) -> None:
                _check_strategy(strategy, plugin)
                if strategy.name in found:
                    raise PluginError(f"strategy {strategy.name!r} registered by both "
                                      f"{owners[strategy.name]!r} and {plugin!r}")
                found[strategy.name] = strategy
                owners[strategy.name] = plugin

            return register

        call_each(self.plugin_manager.hook.llmpar_register_strategies, registrar,
                  "to register strategies")
        self._strategy_owners = owners
        return dict(sorted(found.items(), key=lambda item: (item[1].phase, item[0])))

    def _collect_presets(self) -> PresetCatalog:
        folders: list[Path] = []
        call_each(self.plugin_manager.hook.llmpar_register_presets,
                  lambda _plugin: lambda folder: folders.append(Path(folder)))
        # Built-ins first, so a plugin cannot shadow a shipped preset by accident.
        builtin = [f for f in folders if f.resolve().name in ("specs", "_specs")]
        return catalog_of(builtin[:1] + [f for f in folders if f not in builtin[:1]])

    def plugins(self) -> list[PluginInfo]:
        """Loaded plugins with their distributions, versions and strategies."""
        infos = []
        for name, _plugin in self.plugin_manager.list_name_plugin():
            dist, version = self._origins.get(name, ("?", "?"))
            strategies = tuple(s for s, owner in self._strategy_owners.items() if owner == name)
            infos.append(PluginInfo(name=name, distribution=dist, version=version,
                                    strategies=strategies))
        return sorted(infos, key=lambda info: info.name)

    def load_spec(self, source: SpecSource | Spec,
                  overrides: Mapping[str, Any] | None = None) -> Spec:
        """Read, structure and check a spec; raise SpecError naming every problem.

        `overrides` sets dotted keys before structuring: {"hardware.num_gpus": 8}.
        """
        if isinstance(source, Spec) and not overrides:
            spec = source
        else:
            table = spec_to_dict(source) if isinstance(source, Spec) else source
            spec = load(table, self.presets, self.strategies, self.converter, overrides)
        problems = spec_problems(spec, self.strategies)
        if problems:
            raise SpecError(problems, spec.source)
        return spec

    def evaluate(self, source: SpecSource | Spec,
                 overrides: Mapping[str, Any] | None = None) -> Plan:
        """The Plan of a spec (a Spec, a path, TOML text or a mapping)."""
        spec = self.load_spec(source, overrides)
        layout, problems = resolve_layout(spec, self.strategies)
        if problems:
            raise SpecError(problems, spec.source)
        if spec.inference is not None:
            return build_inference_plan(spec, layout, self.strategies)
        return build_plan(spec, layout, self.strategies)


def call_each(hook: Any, registrar: Callable[[str], Callable[[Any], None]],
              doing: str = "") -> None:
    """Call every implementation of a registering hook with `register =
    registrar(plugin name)`, naming the plugin (and what it was `doing`) when one
    fails. Plugins only declare; the caller's registrar owns duplicates and ordering."""
    for impl in hook.get_hookimpls():
        try:
            impl.function(register=registrar(impl.plugin_name))
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {impl.plugin_name!r} failed {doing or 'in ' + hook.name}: "
                              f"{type(exc).__name__}: {exc}") from exc


def _check_strategy(strategy: Strategy, plugin: str) -> None:
    for attribute in ("name", "config_type"):
        if not hasattr(strategy, attribute):
            raise PluginError(f"plugin {plugin!r} registered a strategy without {attribute!r}")
    if not attrs.has(strategy.config_type):
        raise PluginError(f"plugin {plugin!r}: strategy {strategy.name!r} config_type must be "
                          "an attrs class")
