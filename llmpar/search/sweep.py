"""`llmpar.sweep`: evaluate or search many specs, optionally on an executor.

`executor` is any `concurrent.futures.Executor`: a local
`ProcessPoolExecutor`, or a Dask cluster's through
`distributed.Client(...).get_executor()`. Each task loads the default session of
the process it runs in, so plugins must be installed there too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

from llmpar.loading.reader import SpecSource
from llmpar.plan import Plan
from llmpar.search.result import SearchResult
from llmpar.spec import Spec

MODES = ("search", "evaluate")


def sweep(specs: Iterable[SpecSource | Spec], executor: Executor | None = None, *,
          mode: str = "search", overrides: Mapping[str, Any] | None = None,
          **options: Any) -> list[SearchResult | Plan]:
    """`llmpar.search` (mode "search", with `options` such as top, objective,
    constraints) or `llmpar.evaluate` (mode "evaluate") of each spec, in order.

    Without an executor the specs run here, one after another; with one, each is a
    task (`executor.submit`), and the results come back in the order of `specs`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tasks = [(spec, dict(overrides or {})) for spec in specs]
    if executor is None:
        return [run_one(mode, spec, changes, options) for spec, changes in tasks]
    futures = [executor.submit(run_one, mode, spec, changes, options)
               for spec, changes in tasks]
    return [future.result() for future in futures]


def run_one(mode: str, spec: SpecSource | Spec, overrides: Mapping[str, Any],
            options: Mapping[str, Any]) -> SearchResult | Plan:
    """One task of a sweep, with the default session of the process it runs in."""
    import llmpar

    if mode == "evaluate":
        return llmpar.evaluate(spec, overrides)
    from llmpar.search.engine import search

    return search(spec, overrides, **options)
