"""Collecting the search dimensions plugins declare, and checking them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from llmpar.errors import PluginError
from llmpar.search.dimension import DEGREE, SearchDimension
from llmpar.session import call_each

if TYPE_CHECKING:
    from llmpar.session import Session
    from llmpar.strategy import Strategy


def collect_dimensions(session: Session) -> tuple[SearchDimension, ...]:
    """Every dimension the session's plugins declare, by strategy phase, then name,
    then the order each plugin registered them in."""
    found: list[SearchDimension] = []
    owners: dict[str, str] = {}

    def registrar(plugin: str) -> Callable[[SearchDimension], None]:
        def register(dimension: SearchDimension) -> None:
            _check_dimension(dimension, plugin, session.strategies)
            if dimension.key in owners:
                raise PluginError(f"search dimension {dimension.key!r} declared by both "
                                  f"{owners[dimension.key]!r} and {plugin!r}")
            owners[dimension.key] = plugin
            found.append(dimension)

        return register

    call_each(session.plugin_manager.hook.llmpar_search_dimensions, registrar)
    strategies = session.strategies
    return tuple(sorted(found, key=lambda d: (strategies[d.strategy].phase, d.strategy)))


def _check_dimension(dimension: object, plugin: str,
                     strategies: Mapping[str, Strategy]) -> None:
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
