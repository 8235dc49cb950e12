"""Plugin that contributes llmpar's own preset folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmpar.hookspecs import hookimpl
from llmpar.loading.presets import builtin_specs_dir


@hookimpl
def llmpar_register_presets(register: Callable[[Path], None]) -> None:
    register(builtin_specs_dir())
