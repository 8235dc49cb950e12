"""llmpar: plans parallelism for training and serving large language models.

    import llmpar
    plan = llmpar.evaluate("specs/examples/qwen3-4b-activations.toml")
    print(plan.total_bytes, plan.fits)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from llmpar.calibration import Calibration
from llmpar.errors import PluginError, Problem, SpecError
from llmpar.hf import model_from_hf
from llmpar.hookspecs import hookimpl
from llmpar.loading import dump as _dump
from llmpar.loading.reader import SpecSource
from llmpar.placement import Axis
from llmpar.plan import Derivation, Plan
from llmpar.search import SearchResult, search, sweep
from llmpar.search.dimension import Point, SearchDimension
from llmpar.session import PluginInfo, Session
from llmpar.spec import Spec
from llmpar.spec.validators import FieldError
from llmpar.strategy import (
    ActivationSplit,
    Collective,
    Copy,
    FrozenWeights,
    GroupSelection,
    HostWork,
    Layout,
    Offload,
    ProductSplit,
    Rule,
    Shard,
    Stage,
    Strategy,
    StrategyContext,
    Transform,
)
from llmpar.workload import Workload

__all__ = [
    "ActivationSplit",
    "Axis",
    "Calibration",
    "Collective",
    "Copy",
    "Derivation",
    "FieldError",
    "FrozenWeights",
    "GroupSelection",
    "HostWork",
    "Layout",
    "Offload",
    "Plan",
    "PluginError",
    "PluginInfo",
    "Point",
    "Problem",
    "ProductSplit",
    "Rule",
    "SearchDimension",
    "SearchResult",
    "Session",
    "Shard",
    "Spec",
    "SpecError",
    "Stage",
    "Strategy",
    "StrategyContext",
    "Transform",
    "Workload",
    "calibrate",
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


def load_spec(source: SpecSource | Spec | None = None,
              overrides: Mapping[str, Any] | None = None, *, text: str | None = None) -> Spec:
    """Read and check a spec with the default session (see `Session.load_spec`): a
    path, a mapping or a Spec, or TOML text as `text=`."""
    return default_session().load_spec(source, overrides, text=text)


def dump_spec(spec: Spec) -> str:
    """The spec as TOML that `llmpar.load_spec` reads back to an equal Spec (`[parallel]
    order` in the default session's axis tokens)."""
    return _dump.dump_spec(spec, default_session().axes)


def spec_to_dict(spec: Spec) -> dict[str, Any]:
    """The spec as a fully resolved table (see `llmpar.loading.dump.spec_to_dict`)."""
    return _dump.spec_to_dict(spec, default_session().axes)


def calibrate(runs: SpecSource, fit: Sequence[str] | None = None) -> Calibration:
    """Fit the runs of a RUNS.toml (a path, TOML text or a table) with the default session
    (see `llmpar.calibration`)."""
    from llmpar.calibration import calibrate as fit_runs

    return fit_runs(runs, default_session(), fit)


def evaluate(source: SpecSource | Spec | None = None,
             overrides: Mapping[str, Any] | None = None, *, text: str | None = None) -> Plan:
    """The Plan of a spec with the default session (see `Session.evaluate`): a path, a
    mapping or a Spec, or TOML text as `text=` (`llmpar.evaluate(text=open(p).read())`)."""
    return default_session().evaluate(source, overrides, text=text)
