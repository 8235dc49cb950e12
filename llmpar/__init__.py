"""llmpar: plans parallelism for training and serving large language models.

    import llmpar
    plan = llmpar.evaluate("specs/examples/qwen3-4b-activations.toml")
    print(plan.total_bytes, plan.fits)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from llmpar.errors import PluginError, Problem, SpecError
from llmpar.hf import model_from_hf
from llmpar.hookspecs import hookimpl
from llmpar.loading.dump import dump_spec, spec_to_dict
from llmpar.loading.reader import SpecSource
from llmpar.plan import Derivation, Plan
from llmpar.search import SearchResult, search, sweep
from llmpar.session import PluginInfo, Session
from llmpar.spec import Spec
from llmpar.strategy import (
    ActivationSplit,
    Collective,
    HostWork,
    Layout,
    Offload,
    Shard,
    Strategy,
    StrategyContext,
    Transform,
)

__all__ = [
    "ActivationSplit",
    "Collective",
    "Derivation",
    "HostWork",
    "Layout",
    "Offload",
    "Plan",
    "PluginError",
    "PluginInfo",
    "Problem",
    "SearchResult",
    "Session",
    "Shard",
    "Spec",
    "SpecError",
    "Strategy",
    "StrategyContext",
    "Transform",
    "default_session",
    "dump_spec",
    "evaluate",
    "hookimpl",
    "load_spec",
    "model_from_hf",
    "search",
    "spec_to_dict",
    "sweep",
]


@functools.cache
def default_session() -> Session:
    """The session `evaluate` and `load_spec` use: built-ins and installed plugins."""
    return Session()


def load_spec(source: SpecSource | Spec, overrides: Mapping[str, Any] | None = None) -> Spec:
    """Read and check a spec with the default session (see `Session.load_spec`)."""
    return default_session().load_spec(source, overrides)


def evaluate(source: SpecSource | Spec, overrides: Mapping[str, Any] | None = None) -> Plan:
    """The Plan of a spec with the default session (see `Session.evaluate`)."""
    return default_session().evaluate(source, overrides)
