"""Loading plugins into a pluggy plugin manager, and setting aside the ones that break.

Plugins come in three ways, in this order: llmpar's own (the modules its entry points
name, registered directly), the `llmpar` entry-point group of every installed
distribution, and plugins handed over in code. As pytest does:
- `LLMPAR_DISABLE_PLUGIN_AUTOLOAD=1` loads no entry point (llmpar's own still load);
- `LLMPAR_BLOCK_PLUGINS=name,...` and `--no-plugin NAME` block plugins by name
  (pluggy's `set_blocked`), llmpar's own included.

A plugin that fails to import, implements an unknown hook, or raises or hands over
something the contract does not allow while registering is set aside: unregistered,
listed by `llmpar plugins` as broken with its error, and named in the error of a spec
that needs it. Everything else keeps working.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping

import attrs
import pluggy

from llmpar import hookspecs
from llmpar.errors import PluginError

ENTRY_POINT_GROUP = "llmpar"
AUTOLOAD_ENV = "LLMPAR_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "LLMPAR_BLOCK_PLUGINS"
LOADED, BROKEN, BLOCKED = "loaded", "broken", "blocked"
IN_CODE = "(registered in code)"


@attrs.frozen
class PluginInfo:
    """A plugin: its name, where it came from, what it registered, and whether it works."""

    name: str
    distribution: str
    version: str
    strategies: tuple[str, ...] = ()
    status: str = LOADED
    """"loaded", "broken" (set aside: see `error`) or "blocked" (by name)."""
    error: str | None = None
    """Why a broken plugin was set aside."""
    workloads: tuple[str, ...] = ()
    """The workloads it registered (`[workload.<name>]`)."""


def autoload_disabled(environ: Mapping[str, str]) -> bool:
    """Whether `LLMPAR_DISABLE_PLUGIN_AUTOLOAD` asks for no entry points."""
    return environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def blocked_names(environ: Mapping[str, str], blocked: Iterable[str] = ()) -> frozenset[str]:
    """Plugin names blocked by `LLMPAR_BLOCK_PLUGINS` and by the caller."""
    listed = environ.get(BLOCK_ENV, "").split(",")
    return frozenset(name.strip() for name in [*listed, *blocked] if name.strip())


def own_version() -> str:
    try:
        return importlib.metadata.version("llmpar")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def describe(exc: BaseException) -> str:
    """`Type: message`, one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class PluginSet:
    """The plugin manager and a record of every plugin it was offered."""

    def __init__(self, *, builtins: Iterable[tuple[str, str]], plugins: Iterable[object],
                 load_entry_points: bool, blocked: frozenset[str]):
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.origins: dict[str, tuple[str, str]] = {}
        self.broken: dict[str, str] = {}
        self.blocked: dict[str, tuple[str, str]] = {}
        self.failures: list[str] = []
        """Plugins set aside while evaluating, in order, worded as a plan's warnings."""
        for name in blocked:
            self.manager.set_blocked(name)
        version = own_version()
        for name, module in builtins:
            self._add(name, ("llmpar", version), functools.partial(importlib.import_module,
                                                                   module))
        if load_entry_points:
            self._load_entry_points()
        for plugin in plugins:
            def load(p: object = plugin) -> object:
                return p

            self._add(self._code_name(plugin), (IN_CODE, ""), load)

    def _code_name(self, plugin: object) -> str:
        """A plugin handed over in code is named by its module's `__name__` or its class
        name (a second one of the same name gets "-2", and so on)."""
        base = getattr(plugin, "__name__", None) or type(plugin).__name__
        name, count = base, 1
        while name in self.origins or name in self.blocked:
            count += 1
            name = f"{base}-{count}"
        return name

    def _load_entry_points(self) -> None:
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        for entry_point in sorted(found, key=lambda ep: ep.name):
            if entry_point.name in self.origins or entry_point.name in self.blocked:
                continue  # llmpar's own, registered above under the same name
            dist = entry_point.dist
            origin = (dist.name, dist.version) if dist else ("unknown distribution", "?")
            self._add(entry_point.name, origin, entry_point.load)

    def _add(self, name: str, origin: tuple[str, str], load: Callable[[], object]) -> None:
        """Import and register one plugin; set it aside if either fails."""
        if self.manager.is_blocked(name):
            self.blocked[name] = origin
            return
        self.origins[name] = origin
        try:
            plugin = load()
        except Exception as exc:
            self.broken[name] = f"failed to import: {describe(exc)}"
            return
        try:
            self.manager.register(plugin, name=name)
            self._check_hooks(name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self.set_aside(name, describe(exc) if "unknown hook" not in str(exc)
                           else f"implements an unknown hook: {exc}")

    def _check_hooks(self, name: str) -> None:
        """An implementation of a hook that no spec declares is an error (a typo)."""
        plugin = self.manager.get_plugin(name)
        for caller in self.manager.get_hookcallers(plugin) or []:
            if caller.spec is None:
                raise pluggy.PluginValidationError(
                    plugin, f"unknown hook {caller.name!r} in plugin {name!r}")

    def set_aside(self, name: str, error: str) -> None:
        """Unregister a plugin and record why."""
        self.broken[name] = error
        plugin = self.manager.get_plugin(name)
        if plugin is not None:
            self.manager.unregister(plugin, name=name)

    def names(self) -> list[str]:
        """Registered (working) plugins, in registration order."""
        return [name for name, _ in self.manager.list_name_plugin()]

    def call_registering(self, hook: str, registrar: Callable[[str], Callable[..., None]],
                         doing: str) -> None:
        """Call a registering hook once per plugin, through pluggy, with `register =
        registrar(plugin name)`; a plugin whose implementation raises is set aside
        (the registrar's own PluginError too: the plugin handed over something the
        contract does not allow)."""
        for name in self.names():
            others = [p for n, p in self.manager.list_name_plugin() if n != name]
            caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
            if not caller.get_hookimpls():
                continue
            try:
                caller(register=registrar(name))
            except PluginError as exc:
                self.set_aside(name, str(exc))
            except Exception as exc:
                self.set_aside(name, f"failed {doing}: {describe(exc)}")

    def info(self, strategies: Mapping[str, str],
             workloads: Mapping[str, str] | None = None) -> list[PluginInfo]:
        """Every plugin offered: loaded, broken or blocked; `strategies` (and
        `workloads`) map each to the plugin that owns it."""
        found = []
        for name, (dist, version) in {**self.origins, **self.blocked}.items():
            owned = tuple(s for s, owner in strategies.items() if owner == name)
            run = tuple(w for w, owner in (workloads or {}).items() if owner == name)
            status = BLOCKED if name in self.blocked else BROKEN if name in self.broken \
                else LOADED
            found.append(PluginInfo(name=name, distribution=dist, version=version,
                                    strategies=owned, status=status,
                                    error=self.broken.get(name), workloads=run))
        return sorted(found, key=lambda info: info.name)

    def unavailable(self, name: str) -> str | None:
        """Why a plugin of this name is not loaded, when one was offered."""
        if name in self.broken:
            dist, version = self.origins.get(name, ("?", "?"))
            return f"plugin {name!r} ({dist} {version}) is broken: {self.broken[name]}"
        if name in self.blocked:
            return f"plugin {name!r} is blocked ({BLOCK_ENV} or --no-plugin)"
        return None

