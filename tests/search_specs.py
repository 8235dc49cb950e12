"""Small specs whose layout spaces are searched in a second (shared by test_search*)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from llmpar.search.prepare import prepare
from llmpar.search.vectorised import FastPath

SMALL_MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
               "ffn_hidden_size": 1024, "ffn_activation": "swiglu", "vocab_size": 1000}
"""Four layers, so that every pipeline degree up to 4 splits them evenly."""

MOE_MODEL = {**SMALL_MODEL, "moe": {"num_experts": 4, "experts_per_token": 2,
                                    "expert_ffn_hidden_size": 256, "dense_layers": 1}}


def small_spec(num_gpus: int = 8, **sections: Any) -> dict[str, Any]:
    """A tiny model on A100s (whose step time is modelled), a fixed global batch, and
    a narrowed space; `sections` replace whole tables."""
    spec: dict[str, Any] = {
        "model": SMALL_MODEL,
        "hardware": {"cluster": "dgx-a100", "num_gpus": num_gpus, "gpus_per_node": 4},
        "training": {"sequence_length": 512, "global_batch_size": 24},
        "search": {"micro_batch_sizes": [1, 2], "recompute": ["none", "full"]},
    }
    spec.update(sections)
    return spec


@attrs.frozen
class LayoutPair:
    """One layout of a search space, judged in one call over its node (`fast_*`) and
    evaluated alone (`alone_*`); the totals and times are None where it does not fit or
    breaks a rule."""

    choice: Any
    degrees: Any
    fast_problem: str | None
    alone_problem: str | None
    fast_total_bytes: int | None
    alone_total_bytes: int | None
    fast_step_seconds: float | None
    alone_step_seconds: float | None
    fast_device_bytes: int | None = None
    alone_device_bytes: int | None = None


def layout_pairs(session: Any, spec: Any, every: int = 1) -> Iterator[LayoutPair]:
    """Every `every`-th layout of each node of `spec`'s search space, both ways."""
    prepared = prepare(session, spec, {}, {})
    path = FastPath(prepared, session)
    for n, node in enumerate(prepared.space.nodes):
        result = path.evaluate(node)
        for local in range(0, node.size, every):
            index = prepared.offsets[n] + local
            problem, score = path.judge.examine(index)
            code = int(result.codes[local])
            scored = score is not None
            yield LayoutPair(
                choice=prepared.choice(index), degrees=node.degrees,
                fast_problem=None if code == 0 else path.paths[code - 1],
                alone_problem=None if problem is None else problem.path,
                fast_total_bytes=result.total_bytes[local] if scored else None,
                alone_total_bytes=score.total_bytes if scored else None,
                fast_step_seconds=result.step_seconds[local] if scored else None,
                alone_step_seconds=score.step_seconds if scored else None,
                fast_device_bytes=result.device_bytes[local] if scored else None,
                alone_device_bytes=score.device_bytes if scored else None)


def agreeing_pairs(session: Any, spec: Any, every: int = 1) -> list[LayoutPair]:
    """`layout_pairs`, each checked: the fast path and the layout alone break the same rule
    (or none), and where it is scored they give the same total and device bytes and the
    same step time; returns the scored pairs."""
    scored = []
    for pair in layout_pairs(session, spec, every):
        assert pair.fast_problem == pair.alone_problem, pair.choice
        if pair.alone_total_bytes is None:
            continue
        assert pair.fast_total_bytes == pair.alone_total_bytes, pair.choice
        assert pair.fast_device_bytes == pair.alone_device_bytes, pair.choice
        assert pair.fast_step_seconds == pytest.approx(pair.alone_step_seconds, rel=1e-12)
        scored.append(pair)
    return scored
