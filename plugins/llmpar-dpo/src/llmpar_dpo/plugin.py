"""The plugin module the `llmpar` entry point names: it hands over the workload and its
example specs (`llmpar evaluate llama-3-8b-dpo-lora-h100`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmpar import Workload, hookimpl

from llmpar_dpo.workload import DpoWorkload


@hookimpl
def llmpar_register_workloads(register: Callable[[Workload[Any]], None]) -> None:
    register(DpoWorkload())


@hookimpl
def llmpar_register_presets(register: Callable[[Path], None]) -> None:
    register(Path(__file__).resolve().parent / "presets")
