"""Reading the searched spec, its pins and settings, and laying out the space."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.evaluation.timing import train_tokens
from llmpar.loading.checks import model_problems, training_problems
from llmpar.loading.dump import spec_to_dict
from llmpar.loading.framework import with_profile_efficiencies
from llmpar.loading.loader import structure_spec
from llmpar.loading.reader import SpecSource, apply_overrides, read_source
from llmpar.search.arithmetic import FACTOR_LIMIT
from llmpar.search.candidates import SpecBuilder, pins_of
from llmpar.search.dimensions import collect_dimensions
from llmpar.search.ranking import tokens_per_step
from llmpar.search.settings import checked_values, pin_problems
from llmpar.search.space import Choice, Space, build_space, fill_strategy, settings_of
from llmpar.spec import Spec

if TYPE_CHECKING:
    from llmpar.session import Session
from llmpar.spec.search import Search


@attrs.frozen(kw_only=True)
class StepLimit:
    """The step time a layout must keep within to meet `[search] train_seconds_max` or
    `tokens_per_second_min` (the tighter): the run's steps and its tokens per step are
    the same for every layout, since the global batch is fixed."""

    seconds: float
    path: str
    """The key it comes from: the rejection reason."""
    message: str


@attrs.frozen(kw_only=True)
class Prepared:
    """Everything a search of one spec needs, made once."""

    spec: Spec
    settings: Search
    space: Space
    memory_limit_bytes: int
    offsets: tuple[int, ...]
    """The enumeration number of each node's first layout."""
    step_limit: StepLimit | None = None

    def locate(self, index: int) -> tuple[int, int]:
        """(node, layout within the node) of enumeration number `index`."""
        node = bisect.bisect_right(self.offsets, index) - 1
        return node, index - self.offsets[node]

    def choice(self, index: int) -> Choice:
        node, local = self.locate(index)
        return self.space.nodes[node].choice(local)


def read_spec(session: Session, source: SpecSource | Spec,
              overrides: Mapping[str, Any]) -> tuple[Spec, Mapping[str, Any] | None]:
    """The spec (layout problems are left to the search) and its `[parallel]` as written
    (None for a Spec object)."""
    if isinstance(source, Spec):
        raw, label, given = spec_to_dict(source), source.source, None
    else:
        raw, label = read_source(source)
        given = raw.get("parallel") if isinstance(raw.get("parallel"), Mapping) else {}
    raw = apply_overrides(raw, overrides)
    spec: Spec | None
    if isinstance(source, Spec) and not overrides:
        spec = with_profile_efficiencies(source)
    else:
        spec, problems = structure_spec(raw, session.presets, session.strategies,
                                        session.converter, label, session.activation_models,
                                        session.workloads)
        if spec is None:
            raise SpecError(problems, label)
    problems = model_problems(spec.model) + training_problems(spec) + _search_problems(spec)
    if problems:
        raise SpecError(problems, label)
    return spec, given


def _search_problems(spec: Spec) -> list[Problem]:
    problems = []
    if getattr(spec, "inference", None) is not None:
        problems.append(Problem("$.inference", "search ranks training layouts; this spec "
                                               "describes serving (`llmpar search` on the "
                                               "command line, or llmpar.search.serving."
                                               "search_serving)"))
    for key in ("ttft_seconds_max", "tpot_seconds_max"):
        if spec.search is not None and getattr(spec.search, key) is not None:
            problems.append(Problem(f"$.search.{key}", "limits serving layouts (a spec with "
                                                       "[inference]); this spec trains"))
    if spec.training.global_batch_size is None:
        problems.append(Problem("$.training.global_batch_size",
                                "search needs a fixed global batch: without one it grows with "
                                "the data degree and step times do not compare (set it: "
                                "--global-batch N on the command line)"))
    moe = spec.model.moe
    # Search lists their divisors (degrees, experts per rank, virtual stages).
    for path, count in (("$.hardware.num_gpus", spec.hardware.num_gpus),
                        ("$.model.num_layers", spec.model.num_layers),
                        ("$.model.moe.num_experts", moe.num_experts if moe else None)):
        if count is not None and count >= FACTOR_LIMIT:
            problems.append(Problem(path, "search splits this count into divisors and takes "
                                          f"counts below 2**63, got {count}"))
    if (spec.search is not None and spec.search.train_seconds_max is not None
            and spec.training.tokens is None and spec.training.tokens_per_parameter is None):
        problems.append(Problem("$.search.train_seconds_max",
                                "a deadline needs the run's length: [training] tokens or "
                                "tokens_per_parameter"))
    counts = spec.search.num_gpus if spec.search is not None else None
    if counts and counts[-1] >= FACTOR_LIMIT:
        problems.append(Problem("$.search.num_gpus", "search splits each count into divisors "
                                                     f"and takes counts below 2**63, got "
                                                     f"{counts[-1]}"))
    objective = spec.search.objective if spec.search else "step_time"
    if objective == "cost" and spec.hardware.gpu_hour_cost is None:
        problems.append(Problem("$.hardware.gpu_hour_cost",
                                "the cost objective needs dollars per GPU-hour"))
    return problems


def prepare(session: Session, source: SpecSource | Spec, overrides: Mapping[str, Any],
            changes: Mapping[str, Any]) -> Prepared:
    """Read the spec, apply the search settings `changes`, and enumerate the space."""
    search_overrides = {f"search.{key}": value for key, value in changes.items()
                        if value is not None}
    spec, given = read_spec(session, source, {**overrides, **search_overrides})
    dimensions = collect_dimensions(session)
    settings, problems = checked_values(settings_of(spec, {}), spec, dimensions,
                                        session.strategies, fill_strategy(session.strategies),
                                        session.converter)
    pins = pins_of(spec, given, session.strategies, dimensions)
    problems += pin_problems(settings, pins)
    if problems:
        raise SpecError(problems, spec.source)
    try:
        space = build_space(spec, session.strategies, dimensions, pins, settings)
    except SpecError as error:
        raise error.with_source(spec.source) from None
    limit = settings.memory_limit_bytes or spec.hardware.capacity_bytes
    offsets = tuple(itertools.accumulate((n.size for n in space.nodes), initial=0))[:-1]
    return Prepared(spec=spec, settings=settings, space=space, memory_limit_bytes=limit,
                    offsets=offsets, step_limit=step_limit(session, spec, settings))


def step_limit(session: Session, spec: Spec, settings: Search) -> StepLimit | None:
    """The longest step that meets the run's deadline and throughput floor, if any."""
    tokens = tokens_per_step(spec)
    found = []
    if settings.tokens_per_second_min is not None:
        rate = settings.tokens_per_second_min
        found.append(StepLimit(seconds=tokens / rate, path="$.search.tokens_per_second_min",
                               message=f"trains fewer than {rate:,.6g} tokens/s (a step of "
                                       f"{tokens:,} tokens over {tokens / rate:,.6g} s)"))
    if settings.train_seconds_max is not None:
        parameters = session.cache.footprint(spec).parameters.total
        run = train_tokens(spec, parameters)
        assert run is not None  # _search_problems requires it
        steps = run[0] / tokens
        deadline = settings.train_seconds_max
        found.append(StepLimit(seconds=deadline / steps, path="$.search.train_seconds_max",
                               message=f"takes longer than {deadline:,.6g} s for the run's "
                                       f"{steps:,.6g} steps (a step over "
                                       f"{deadline / steps:,.6g} s)"))
    return min(found, key=lambda limit: limit.seconds, default=None)


def builder_of(session: Session, prepared: Prepared) -> SpecBuilder:
    return SpecBuilder(prepared.spec, session.strategies, prepared.space.dimensions)
