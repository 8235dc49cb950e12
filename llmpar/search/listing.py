"""`llmpar search SPEC --dimensions`: the keys `[search] values` takes, what each
varies, and the values each takes in the spec's space."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import SpecError
from llmpar.search.dimension import DEGREE
from llmpar.search.dimensions import collect_dimensions
from llmpar.search.prepare import prepare, read_spec
from llmpar.search.settings import searchable_keys
from llmpar.search.space import MICRO_BATCH, RECOMPUTE, Space, fill_strategy

if TYPE_CHECKING:
    from llmpar.loading.reader import SpecSource
    from llmpar.session import Session
    from llmpar.spec import Spec

_TRAINING = {MICRO_BATCH: "[search] micro_batch_sizes (the micro-batch size is not a pin)",
             RECOMPUTE: "[search] recompute (the recomputation mode is not a pin)"}


@attrs.frozen(kw_only=True)
class DimensionInfo:
    """One key of `[search] values`."""

    key: str
    description: str
    values: tuple[Any, ...] | None
    """The values layouts of the spec's space take (pins and `[search]` applied); None
    when the space could not be laid out."""


@attrs.frozen(kw_only=True)
class DimensionListing:
    dimensions: tuple[DimensionInfo, ...]
    problem: str | None = None
    """Why the space was not laid out (a SpecError's text: over a limit, say), or None."""

    def to_dict(self) -> dict[str, Any]:
        return {"dimensions": [{"key": d.key, "description": d.description,
                                "values": None if d.values is None else list(d.values)}
                               for d in self.dimensions],
                "problem": self.problem}


def list_dimensions(session: Session, source: SpecSource | Spec,
                    overrides: Mapping[str, Any]) -> DimensionListing:
    """Every key `[search] values` takes, with the values of the spec's space; a spec
    whose space is over a limit, or whose `[search]` is wrong, still gets the keys."""
    read_spec(session, source, overrides)  # a spec that cannot be searched says why
    dimensions = collect_dimensions(session)
    fill = fill_strategy(session.strategies)
    described = {d.key: d.description for d in dimensions}
    if fill is not None:
        described[f"{fill}.{DEGREE}"] = "not a dimension: the GPUs the other degrees leave"
    described.update(_TRAINING)
    taken: dict[str, tuple[Any, ...]] | None
    try:
        taken = _values_taken(prepare(session, source, overrides, {}).space)
        problem = None
    except SpecError as error:
        taken, problem = None, str(error)
    keys = searchable_keys(dimensions, session.strategies, fill)
    return DimensionListing(
        dimensions=tuple(DimensionInfo(key=key, description=described.get(key, ""),
                                       values=None if taken is None else taken.get(key, ()))
                         for key in keys),
        problem=problem)


def _values_taken(space: Space) -> dict[str, tuple[Any, ...]]:
    found: dict[str, dict[Any, None]] = {}
    groups: dict[int, tuple[dict[str, Any], ...]] = {}
    for node in space.nodes:
        for name, degree in node.degrees.items():
            found.setdefault(f"{name}.{DEGREE}", {})[degree] = None
        groups.update((id(group), group) for group in node.groups)
    for group in groups.values():
        for choice in group:
            for key, value in choice.items():
                found.setdefault(key, {})[value] = None
    return {key: _ordered(values) for key, values in found.items()}


def _ordered(values: Iterable[Any]) -> tuple[Any, ...]:
    listed = list(values)
    try:
        return tuple(sorted(listed))
    except TypeError:  # mixed kinds (an even split, None, beside explicit ones)
        return tuple(listed)
