"""The hooks a session calls while it evaluates: activation models, a collective cost
model, the finished plan and report sections (`llmpar.hookspecs`). Every call goes
through pluggy; a plugin whose implementation raises is named and set aside, and the
call is made again without it."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmpar.communication.collectives import seconds_of
from llmpar.errors import PluginError
from llmpar.footprint.activations import ACTIVATION_MODELS, ActivationModel
from llmpar.plugins import PluginSet, describe

if TYPE_CHECKING:
    from llmpar.plan import Plan
    from llmpar.report.tables import Table
    from llmpar.spec import Hardware
    from llmpar.strategy import Collective

ATTEMPTS = 4
"""How many plugins one call may set aside before it gives up."""


def gather_activation_models(plugins: PluginSet) -> dict[str, ActivationModel]:
    """llmpar's activation models and those plugins register, by name."""
    found: dict[str, ActivationModel] = dict(ACTIVATION_MODELS)
    owners: dict[str, str] = {name: "llmpar" for name in found}

    def registrar(plugin: str) -> Callable[[str, ActivationModel], None]:
        def register(name: str, model: ActivationModel) -> None:
            if not isinstance(name, str) or not callable(model):
                raise PluginError(f"plugin {plugin!r} registered {name!r}: {model!r}, not a "
                                  "name and a callable activation model")
            if name in found:
                raise PluginError(f"activation model {name!r} registered by both "
                                  f"{owners[name]!r} and {plugin!r}")
            found[name], owners[name] = model, plugin

        return register

    plugins.call_registering("llmpar_register_activation_models", registrar,
                             "to register activation models")
    return {name: model for name, model in found.items()
            if owners[name] not in plugins.broken}


def culprit(plugins: PluginSet, hook: str, error: BaseException) -> str | None:
    """The plugin whose implementation of `hook` raised `error`: the innermost frame of
    the traceback that is one of the hook's implementations."""
    functions = {impl.function.__code__: impl.plugin_name
                 for impl in getattr(plugins.manager.hook, hook).get_hookimpls()}
    names = [functions[frame.f_code] for frame, _ in traceback.walk_tb(error.__traceback__)
             if frame.f_code in functions]
    return names[-1] if names else None


def isolated(plugins: PluginSet, hook: str, call: Callable[[], Any]) -> Any:
    """`call()`, setting aside each plugin whose implementation of `hook` raises and
    calling again; each one set aside is added to `plugins.failures`."""
    for _ in range(ATTEMPTS):
        try:
            return call()
        except Exception as error:
            name = culprit(plugins, hook, error)
            if name is None:
                raise
            plugins.set_aside(name, f"failed in {hook}: {describe(error)}")
            plugins.failures.append(f"plugin {name!r} failed in {hook} and was set aside: "
                                    f"{describe(error)}")
    raise PluginError(f"{hook}: {ATTEMPTS} plugins failed in one call")


def collective_model(plugins: PluginSet) -> Callable[[Collective, Hardware, Any],
                                                     tuple[Any, str]] | None:
    """The plugins' collective cost model, falling back to llmpar's; None when no plugin
    has one (then evaluation calls llmpar's directly)."""
    hook = plugins.manager.hook.llmpar_collective_seconds
    if not hook.get_hookimpls():
        return None

    def seconds(collective: Collective, hardware: Hardware, buffer: Any) -> tuple[Any, str]:
        found = isolated(plugins, "llmpar_collective_seconds",
                         lambda: hook(collective=collective, hardware=hardware,
                                      buffer_bytes=buffer))
        return seconds_of(collective, hardware, buffer) if found is None else found

    return seconds


def report_sections(plugins: PluginSet, plan: Plan) -> tuple[Table, ...]:
    """Every section plugins add to a plan's report."""
    hook = plugins.manager.hook.llmpar_report_sections
    if not hook.get_hookimpls():
        return ()
    found = isolated(plugins, "llmpar_report_sections", lambda: hook(plan=plan))
    return tuple(table for tables in found for table in (tables or ()))
