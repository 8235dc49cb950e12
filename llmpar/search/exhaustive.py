"""Evaluating layouts one by one with the strategies' own checks and evaluation's
scorer: with `exact=True` every layout, else the layouts a strategy without a fast form
takes part in."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.evaluation.cache import EvaluationCache
from llmpar.evaluation.evaluate import score
from llmpar.loading.checks import resolve_layout, spec_problems
from llmpar.search.candidates import SpecBuilder
from llmpar.search.ranking import Entry
from llmpar.search.result import REJECTED_MEMORY
from llmpar.search.tally import Tally

if TYPE_CHECKING:
    from llmpar.search.prepare import Prepared
    from llmpar.strategy import Strategy


@attrs.frozen(kw_only=True)
class Score:
    """What ranking needs of a layout's plan."""

    total_bytes: int
    device_bytes: int
    """Device memory at the step's peak: what the layout is kept or rejected on."""
    step_seconds: float | None
    time_model: str

Progress = Callable[[str, int, int], None]
"""Called with (what is being done, how many done, how many in all): "estimating"
layouts, or "evaluating" them exactly."""


class Judge:
    """Checks and scores single layouts of one prepared search."""

    def __init__(self, prepared: Prepared, strategies: Mapping[str, Strategy[Any]],
                 cache: EvaluationCache | None = None):
        self.prepared = prepared
        self.strategies = strategies
        self.builder = SpecBuilder(prepared.spec, strategies, prepared.space.dimensions)
        self.cache = cache if cache is not None else EvaluationCache()

    def examine(self, index: int) -> tuple[Problem | None, Score | None]:
        """The layout's first problem, or its exact score."""
        spec = self.builder.build(self.prepared.choice(index))
        problems = spec_problems(spec, self.strategies)
        if problems:
            return problems[0], None
        layout, _ = resolve_layout(spec, self.strategies)
        try:
            total, device, seconds, model = score(spec, layout, self.strategies, self.cache)
        except SpecError as error:  # a layout the spec's assumed MFU cannot time
            return error.problems[0], None
        return None, Score(total_bytes=total, device_bytes=device, step_seconds=seconds,
                           time_model=model)

    def judge(self, index: int, tally: Tally) -> Entry | None:
        """The layout's entry if it is valid and fits; else count why not."""
        return self.count(index, *self.examine(index), tally)

    def count(self, index: int, problem: Problem | None, score: Score | None,
              tally: Tally) -> Entry | None:
        """Count an examined layout; its entry if it is valid and fits."""
        if problem is not None or score is None:
            assert problem is not None
            tally.reject(problem.path, example=problem.message)
            return None
        tally.evaluated += 1
        tally.time_models.add(score.time_model)
        limit = self.prepared.memory_limit_bytes
        if score.device_bytes > limit:
            tally.reject(REJECTED_MEMORY, example=f"needs {score.device_bytes / 2**30:,.2f} GiB "
                                                  f"per GPU at its peak, has "
                                                  f"{limit / 2**30:,.2f} GiB")
            return None
        step = self.prepared.step_limit
        if step is not None and (score.step_seconds is None
                                 or score.step_seconds > step.seconds):
            tally.reject(step.path, example=step.message)
            return None
        return Entry(index=index, total_bytes=score.total_bytes,
                     step_seconds=score.step_seconds)


def run_exhaustive(judge: Judge, indices: Iterable[int], total: int,
                   progress: Progress | None = None) -> Tally:
    """Judge every layout in `indices`."""
    tally = Tally()
    for done, index in enumerate(indices, 1):
        entry = judge.judge(index, tally)
        if entry is not None:
            tally.fitting += 1
            tally.entries.append(entry)
        if progress is not None and done % 256 == 0:
            progress("evaluating", done, total)
    return tally
