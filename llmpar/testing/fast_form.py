"""The contract suite's "fast-form-agrees" check: a strategy that declares a fast form
(`Strategy.vectorised`) must give, in one call over a search node's arrays, what
evaluating each layout alone gives: the same first problem, the same memory (to the
byte) and the same step time (to rounding)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from llmpar.errors import PluginError
from llmpar.loading.checks import resolve_layout
from llmpar.search.prepare import prepare
from llmpar.search.vectorised import FastPath

if TYPE_CHECKING:
    from llmpar.session import Session
    from llmpar.spec import Spec

SAMPLED = 12
"""Layouts compared one by one per node (spread over the node)."""
RELATIVE = 1e-9
"""Step times may differ by summation order only."""


def disagreements(session: Session, spec: Spec) -> Iterator[str]:
    """Where the fast path and one-by-one evaluation disagree on the layouts around
    `spec`: its degrees, tables and the other settings as pinned, everything the search
    varies besides (option fields, micro-batch sizes 1 and 2, every recomputation mode)."""
    if spec.training.global_batch_size is None:
        return
    layout, problems = resolve_layout(spec, session.strategies)
    if problems:
        return
    owners = {d.strategy for d in session.search_dimensions if d.is_degree}
    values: dict[str, Any] = {f"{name}.degree": [layout.degree(name)] for name in owners}
    changes = {"micro_batch_sizes": [1, 2], "recompute": ["none", "selective", "full"],
               "values": values}
    prepared = prepare(session, spec, {}, changes)
    path = FastPath(prepared, session)
    for n, node in enumerate(prepared.space.nodes):
        result = path.evaluate(node)
        step = max(1, node.size // SAMPLED)
        for local in range(0, node.size, step):
            index = prepared.offsets[n] + local
            yield from _compare(path, result, local, index, prepared.choice(index))


def fast_form_failure(session: Session, spec: Spec, config: Any) -> str | None:
    """What the contract suites report for `config`'s spec: the first disagreements of
    the fast path with one-by-one evaluation, or the error evaluating a node raised;
    None when they agree."""
    try:
        found = list(disagreements(session, spec))
    except (PluginError, ValueError, TypeError) as error:
        return (f"{config!r}: evaluating a node of layouts at once failed: "
                f"{type(error).__name__}: {error}")
    return f"{config!r}: " + "; ".join(found[:3]) if found else None


def _compare(path: FastPath, result: Any, local: int, index: int,
             choice: Mapping[str, Any]) -> Iterator[str]:
    if result.exact[local]:
        return
    problem, score = path.judge.examine(index)
    code = int(result.codes[local])
    fast = None if code == 0 else path.paths[code - 1]
    alone = None if problem is None else problem.path
    if fast != alone:
        yield f"{choice}: first problem {fast!r} in one call, {alone!r} alone"
        return
    if score is None:
        return
    total, seconds = int(result.total_bytes[local]), float(result.step_seconds[local])
    if total != score.total_bytes:
        yield f"{choice}: {total} bytes in one call, {score.total_bytes} alone"
    alone_seconds = math.inf if score.step_seconds is None else score.step_seconds
    if not math.isclose(seconds, alone_seconds, rel_tol=RELATIVE):
        yield f"{choice}: {seconds!r} s in one call, {alone_seconds!r} s alone"
