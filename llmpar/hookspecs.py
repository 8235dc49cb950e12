"""The plugin contract: every hook llmpar calls, in one place.

A plugin is a module or object with functions marked `@llmpar.hookimpl`, named
after the specs below. It is found through the `llmpar` entry-point group, the
same door llmpar's own strategies come through. Hooks only *declare* what a
plugin offers, by calling the `register` function they are handed; the session
owns ordering, names, duplicate detection and calling. Hooks grow by new keyword
arguments, so plugins written against an older contract keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from llmpar.search.dimension import SearchDimension
    from llmpar.strategy import Strategy

PROJECT_NAME = "llmpar"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def llmpar_register_strategies(register: Callable[[Strategy], None]) -> None:
    """Hand over parallel strategies: call `register(strategy)` once for each.

    A strategy owns the spec table `[parallel.<strategy.name>]`, declares that
    table's schema as an attrs class, and turns its settings into a `Transform`
    of memory, compute and communication. See `llmpar.strategy.Strategy`.
    """


@hookspec
def llmpar_register_presets(register: Callable[[Path], None]) -> None:
    """Hand over preset folders: call `register(folder)` for each.

    A folder has the layout of llmpar's own `specs/`: `models/`, `gpus/`,
    `optimizers/` and `examples/`, each holding `<name>.toml` files.
    """


@hookspec
def llmpar_search_dimensions(register: Callable[[SearchDimension], None]) -> None:
    """Hand over the settings layout search may vary: call `register(dimension)` for
    each `llmpar.search.SearchDimension` (a strategy's degree, or a field of its
    table with the values to try). `llmpar.search` enumerates every combination,
    the strategies' checks reject the invalid ones, and evaluation ranks the rest.
    """
