"""What a launch target is and what it hands back.

A launch target turns a spec (and the layout the session resolved for it) into what a
framework needs to run that plan: argument lists, configuration files, the launcher
line. Whatever the spec sets that the target cannot express is listed as `Unmapped`,
with the reason, never dropped. A target that can also read its format back
(`ReadingTarget`) turns a framework configuration into spec settings (`llmpar import`).
Targets come from plugins (`llmpar_launch_targets`); llmpar's own are registered the
same way (`llmpar.launch.builtin`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from llmpar.spec import Spec
from llmpar.strategy import Layout

if TYPE_CHECKING:
    from llmpar.plan import Plan


@attrs.frozen
class LaunchFile:
    """One file of a launch: its name (relative to the output folder) and text."""

    name: str
    text: str
    description: str = ""
    in_command: bool = False
    """The file holds what `Launch.command` already shows (the arguments, the launcher
    script): `Launch.text` does not repeat it."""


@attrs.frozen
class Unmapped:
    """A setting of the spec the target could not express, and why."""

    path: str
    """Key path of the setting, e.g. `$.parallel.pipeline.schedule`."""
    value: str
    """Its value as the spec states it."""
    reason: str


@attrs.frozen(kw_only=True)
class Launch:
    """What a target made of a spec: files, the launcher line, and what it left out."""

    target: str
    framework_version: str
    """The framework version whose arguments the target writes (and the committed
    argument data under validation/data/launch/ was read from)."""
    files: tuple[LaunchFile, ...]
    command: str = ""
    """The launcher line (torchrun, deepspeed), with the first file's arguments."""
    unmapped: tuple[Unmapped, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """The launch as a reader sees it: the command, each file, then what was not
        mapped and the notes, as shell comments."""
        parts = []
        if self.command:
            parts.append(self.command)
        for file in self.files:
            if file.in_command and self.command:
                continue
            parts.append(f"# --- {file.name}" + (f": {file.description}"
                                                 if file.description else ""))
            parts.append(file.text.rstrip("\n"))
        if self.unmapped:
            parts.append(f"# Not mapped to {self.target} ({len(self.unmapped)}):")
            parts.extend(f"#   {u.path} = {u.value}: {u.reason}" for u in self.unmapped)
        if self.notes:
            parts.append("# Notes:")
            parts.extend(f"#   {note}" for note in self.notes)
        return "\n".join(parts) + "\n"


@attrs.frozen(kw_only=True)
class ReadSettings:
    """A framework configuration read back: dotted spec keys and their values.

    `settings` are set over the base spec (`--base`); `owned` are the keys (and tables,
    e.g. `parallel.sequence`) the format decides, so the base's own value of one of them
    is dropped when the configuration leaves it unset (the framework's default holds).
    """

    settings: Mapping[str, Any]
    owned: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    planned: Callable[[Spec, Plan], Mapping[str, Any]] | None = None
    """Settings that depend on the plan of the spec the others make (TensorRT-LLM's
    free_gpu_memory_fraction is a share of the memory its weights and activations leave):
    called with that spec and its plan, the settings it returns are set over them
    (`llmpar.launch.importing.imported_spec`). None when there are none."""


@runtime_checkable
class LaunchTarget(Protocol):
    """A framework llmpar can write a launch for.

    `name` is what `llmpar launch --for` takes (a framework profile's name where there is
    one); `aliases` are shorter names for it."""

    @property
    def name(self) -> str: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...

    @property
    def description(self) -> str: ...

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        """The files and launcher line that run `spec` under `layout`, a pure function."""
        ...


@runtime_checkable
class PlannedLaunchTarget(LaunchTarget, Protocol):
    """A target whose files need the plan's numbers, not only the spec (TensorRT-LLM
    sizes its KV cache as a share of the memory the weights and activations leave): the
    session evaluates the spec and passes its plan."""

    def launch_planned(self, spec: Spec, layout: Layout, plan: Plan) -> Launch:
        """`launch`, with the plan of `spec` under `layout` at hand."""
        ...


@runtime_checkable
class ReadingTarget(LaunchTarget, Protocol):
    """A target that also reads its format back into spec settings."""

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        """The settings `text` (the contents of `source`) states; a SpecError naming the
        argument (`$.--num-layers`) for one that is unknown or malformed. `base`, the spec
        the settings go over, may resolve what the format leaves open (the run's exact
        tokens where the format counts steps)."""
        ...
