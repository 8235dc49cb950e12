"""The plugin module the `llmpar` entry point names: it hands over the strategy."""

from __future__ import annotations

from collections.abc import Callable

from llmpar import Strategy, hookimpl

from llmpar_offload.strategy import OffloadStrategy


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy], None]) -> None:
    register(OffloadStrategy())
