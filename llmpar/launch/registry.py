"""Launch targets from plugins (`llmpar_launch_targets`), found by name or alias."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import attrs

from llmpar.errors import PluginError, Problem, SpecError, did_you_mean
from llmpar.launch.target import LaunchTarget
from llmpar.plugins import PluginSet


@attrs.frozen
class LaunchTargets:
    """The targets plugins registered, by name, and the aliases that lead to them."""

    targets: Mapping[str, LaunchTarget]
    aliases: Mapping[str, str]
    owners: Mapping[str, str]
    """The plugin that registered each target."""

    def find(self, name: str, path: str = "$.--for") -> LaunchTarget:
        """The target called `name` (or an alias of it); a SpecError listing them else."""
        found = self.targets.get(self.aliases.get(name, name))
        if found is None:
            names = [*self.targets, *self.aliases]
            listed = ", ".join(f"{n!r}" for n in self.targets)
            raise SpecError([Problem(path, f"no launch target {name!r}"
                                           f"{did_you_mean(name, names)}; known: {listed}")])
        return found


def gather_launch_targets(plugins: PluginSet) -> LaunchTargets:
    """Every target plugins register; a name or alias taken twice sets the second
    plugin aside, as a strategy's does."""
    found: dict[str, LaunchTarget] = {}
    aliases: dict[str, str] = {}
    owners: dict[str, str] = {}

    def registrar(plugin: str) -> Callable[[LaunchTarget], None]:
        def register(target: LaunchTarget) -> None:
            if not isinstance(target, LaunchTarget):
                raise PluginError(f"plugin {plugin!r} registered {target!r}, not a launch "
                                  "target (name, aliases, description, launch(spec, layout))")
            for name in (target.name, *target.aliases):
                if name in found or name in aliases:
                    owner = owners[aliases.get(name, name)]
                    raise PluginError(f"launch target {name!r} registered by both "
                                      f"{owner!r} and {plugin!r}")
            found[target.name], owners[target.name] = target, plugin
            aliases.update({alias: target.name for alias in target.aliases})

        return register

    plugins.call_registering("llmpar_launch_targets", registrar, "to register launch targets")
    kept = {name: t for name, t in found.items() if owners[name] not in plugins.broken}
    return LaunchTargets(targets=MappingProxyType(kept),
                         aliases=MappingProxyType({a: n for a, n in aliases.items()
                                                   if n in kept}),
                         owners=MappingProxyType({n: owners[n] for n in kept}))
