"""The plugin module the `llmpar` entry point names: it hands over the workload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmpar import Workload, hookimpl

from llmpar_dpo.workload import DpoWorkload


@hookimpl
def llmpar_register_workloads(register: Callable[[Workload[Any]], None]) -> None:
    register(DpoWorkload())
