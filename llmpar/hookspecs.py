"""The plugin contract: every hook llmpar calls, in one place.

A plugin is a module or object with functions marked `@llmpar.hookimpl`, named
after the specs below. It is found through the `llmpar` entry-point group, the
same door llmpar's own strategies come through. Hooks only *declare* what a
plugin offers, by calling the `register` function they are handed; the session
owns ordering, names, duplicate detection and calling. Hooks grow by new keyword
arguments, so plugins written against an older contract keep working.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from llmpar.footprint.activations import ActivationModel
    from llmpar.launch.target import LaunchTarget
    from llmpar.plan import Plan
    from llmpar.report.tables import Table
    from llmpar.search.dimension import SearchDimension
    from llmpar.spec import Hardware, Spec
    from llmpar.strategy import Collective, Layout, Strategy
    from llmpar.workload import Workload

PROJECT_NAME = "llmpar"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def llmpar_register_strategies(register: Callable[[Strategy[Any]], None]) -> None:
    """Hand over parallel strategies: call `register(strategy)` once for each.

    A strategy owns the spec table `[parallel.<strategy.name>]`, declares that
    table's schema as an attrs class, and turns its settings into a `Transform`
    of memory, compute and communication. See `llmpar.strategy.Strategy`.
    """


@hookspec
def llmpar_register_workloads(register: Callable[[Workload[Any]], None]) -> None:
    """Hand over workloads: call `register(workload)` once for each.

    A workload owns the spec table `[workload.<workload.name>]`, declares its schema as
    an attrs class, checks it with `rules`, and turns it into a `Transform` of what it
    runs beside the trained model: other models' weights (`FrozenWeights`), their
    forward FLOPs, working memory and collectives. See `llmpar.workload.Workload`. A
    name another workload or a strategy already has is refused.
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


@hookspec
def llmpar_register_activation_models(register: Callable[[str, ActivationModel], None]
                                      ) -> None:
    """Hand over activation models: call `register(name, model)` for each, `model(spec)`
    returning the `ActivationInventory` of one micro-batch of one unsplit replica (see
    `llmpar.footprint.activations`); `[training] activation_model = "<name>"` selects it.
    A name llmpar already has is refused."""


@hookspec(firstresult=True)
def llmpar_collective_seconds(collective: Collective, hardware: Hardware,
                              buffer_bytes: Any) -> tuple[Any, str] | None:
    """Cost one call of a collective: (seconds, link tier), or None to leave it to llmpar's
    alpha-beta model (`llmpar.communication.collectives.seconds_of`). `buffer_bytes` may be
    a numpy array (the search costs a node of layouts at once): compute with it as with a
    number. A topology-aware model (a fat tree, a rail-optimized network, NVLink domains)
    goes here; the first implementation that answers wins."""


@hookspec
def llmpar_report_sections(plan: Plan) -> Sequence[Table] | None:
    """Sections to add to the text and markdown reports of a plan: `llmpar.report.tables.
    Table`s (title, columns, rows, notes), shown after llmpar's own."""


@hookspec(firstresult=True)
def llmpar_plan(spec: Spec, layout: Layout) -> Plan | None:
    """The finished plan of a spec. llmpar's evaluation answers it; wrap it with
    `@hookimpl(wrapper=True)` to see or change the plan (`plan = yield`, then return it,
    e.g. `plan.evolve(warnings=...)`), or answer first (`tryfirst=True`) to replace
    llmpar's evaluation of the specs you return a Plan for (None: llmpar's)."""


@hookspec
def llmpar_launch_targets(register: Callable[[LaunchTarget], None]) -> None:
    """Hand over launch targets: call `register(target)` for each `llmpar.launch.
    LaunchTarget` (a `name`, `aliases`, a `description` and `launch(spec, layout)`
    returning a `llmpar.launch.Launch`: files, the launcher line, and every setting it
    could not map). `llmpar launch --for NAME` picks one; a target with `read(text,
    source, base)` also serves `llmpar import --from NAME`. A name or alias llmpar
    already has is refused."""
