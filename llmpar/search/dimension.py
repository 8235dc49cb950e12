"""Search dimensions: the settings layout search varies, as plugins declare them.

A strategy plugin declares its dimensions through the `llmpar_search_dimensions`
hook (see `llmpar.hookspecs`); llmpar's own strategies do the same. Degrees are
special: the degrees of the strategies that multiply the GPU count are chosen
together so that they multiply to `hardware.num_gpus`, and the strategy whose
degree defaults to -1 (data) takes what the others leave.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.search.arithmetic import divisors as divisors  # where plugins import it from

if TYPE_CHECKING:
    from llmpar.spec import Spec

DEGREE = "degree"
"""The field name of a strategy's degree."""


@attrs.frozen(kw_only=True)
class Point:
    """Where the enumeration stands when a dimension's values are asked for: the
    spec searched, every strategy's degree, the fields of this strategy that
    its earlier dimensions set, and the choices made so far of the dimensions it sees
    (`SearchDimension.sees`)."""

    spec: Spec
    degrees: Mapping[str, int]
    fields: Mapping[str, Any] = attrs.field(factory=dict)
    choices: Mapping[str, Any] = attrs.field(factory=dict)
    """Keys chosen so far in this dimension's group ("data.zero": 3), its own
    strategy's and those of the dimensions it sees."""

    def degree(self, strategy: str) -> int:
        """`strategy`'s degree; 1 when it takes no part."""
        return self.degrees.get(strategy, 1)


Values = tuple[Any, ...] | Callable[[Point], Iterable[Any]] | None


@attrs.frozen(kw_only=True)
class SearchDimension:
    """One setting of a strategy that layout search tries several values of.

    `field` names a field of the strategy's config (`[parallel.<strategy>]`);
    "degree" is its degree; None means whether the strategy's table is in the spec
    at all (values True and False: sequence parallelism). `values` is a tuple, or a
    function of the `Point` (degrees and this strategy's earlier fields) that
    returns them; for a degree, None means every divisor of the GPU count. Values
    that break a rule need not be left out: the strategy's `check` rejects them
    and search counts the rejections by reason.
    """

    strategy: str
    field: str | None
    values: Values = None
    description: str = ""
    """What the values are and why, for `llmpar search --help`-style listings."""
    sees: tuple[str, ...] = ()
    """Keys of dimensions of strategies applied before this one (a lower phase:
    "data.zero") whose chosen values `values` reads from `Point.choices`: they are
    enumerated together with it, before it."""
    vectorised: bool = True
    """Whether the strategy's fast form takes this field as an array; False for a field
    that changes the transform's structure (how many pipeline stages hold which
    layers): the search then evaluates each of its values apart."""

    @property
    def key(self) -> str:
        """`<strategy>.<field>`, or `<strategy>` for the table's presence."""
        return self.strategy if self.field is None else f"{self.strategy}.{self.field}"

    @property
    def is_degree(self) -> bool:
        return self.field == DEGREE

    def values_at(self, point: Point) -> tuple[Any, ...]:
        """The values to try at `point` (a degree's None is left to the caller)."""
        if self.values is None:
            return ()
        found = self.values(point) if callable(self.values) else self.values
        return tuple(dict.fromkeys(found))

