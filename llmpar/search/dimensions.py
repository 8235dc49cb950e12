"""Collecting the search dimensions plugins declare, and checking them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import PluginError
from llmpar.search.dimension import DEGREE, SearchDimension

if TYPE_CHECKING:
    from llmpar.plugins import PluginSet
    from llmpar.session import Session
    from llmpar.strategy import Strategy


def collect_dimensions(session: Session) -> tuple[SearchDimension, ...]:
    """The search dimensions the session's plugins declared."""
    return session.search_dimensions


def gather_dimensions(plugins: PluginSet,
                      strategies: Mapping[str, Strategy[Any]]) -> tuple[SearchDimension, ...]:
    """Every dimension the plugins declare, by strategy phase, then name, then the
    order each plugin registered them in; a plugin that declares a bad one is set
    aside with all of its dimensions."""
    found: list[tuple[str, SearchDimension]] = []
    owners: dict[str, str] = {}

    def registrar(plugin: str) -> Callable[[SearchDimension], None]:
        def register(dimension: SearchDimension) -> None:
            _check_dimension(dimension, plugin, strategies)
            if dimension.key in owners:
                raise PluginError(f"search dimension {dimension.key!r} declared by both "
                                  f"{owners[dimension.key]!r} and {plugin!r}")
            owners[dimension.key] = plugin
            found.append((plugin, dimension))

        return register

    plugins.call_registering("llmpar_search_dimensions", registrar,
                             "to declare search dimensions")
    kept = [d for plugin, d in found if plugin not in plugins.broken]
    return tuple(sorted(kept, key=lambda d: (strategies[d.strategy].phase, d.strategy)))


def _check_dimension(dimension: object, plugin: str,
                     strategies: Mapping[str, Strategy[Any]]) -> None:
    if not isinstance(dimension, SearchDimension):
        raise PluginError(f"plugin {plugin!r} registered {dimension!r}, not a SearchDimension")
    strategy = strategies.get(dimension.strategy)
    if strategy is None:
        raise PluginError(f"plugin {plugin!r}: search dimension {dimension.key!r} names no "
                          "loaded strategy")
    fields = {field.name for field in attrs.fields(strategy.config_type)}
    if dimension.field is not None and dimension.field not in fields:
        raise PluginError(f"plugin {plugin!r}: search dimension {dimension.key!r}: "
                          f"{strategy.config_type.__name__} has no field {dimension.field!r}")
    if dimension.field == DEGREE and not strategy.multiplies_gpus and dimension.values is None:
        raise PluginError(f"plugin {plugin!r}: search dimension {dimension.key!r} needs values "
                          "(its degree does not divide the GPU count)")
