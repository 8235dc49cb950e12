"""The space of layouts: every combination of the dimensions' values.

A node fixes every strategy's degree (those that multiply the GPU count multiply
to it; the strategy whose degree defaults to -1 takes the rest). Under a node, each
strategy's option dimensions give a list of combinations, and the training
dimensions (micro-batch size, recomputation) one more; the node's layouts are the
product of those lists, numbered in mixed radix with the last list fastest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.search.arithmetic import DegreeProducts
from llmpar.search.dimension import DEGREE, Point, SearchDimension, divisors
from llmpar.spec.search import Search

if TYPE_CHECKING:
    from llmpar.spec import Spec
    from llmpar.strategy import Strategy

MICRO_BATCH = "training.micro_batch_size"
RECOMPUTE = "training.recompute"
TRAINING_KEYS = (MICRO_BATCH, RECOMPUTE)

Choice = dict[str, Any]
"""One layout: a value for every dimension key ("tensor.degree", "data.zero",
"sequence", "training.micro_batch_size", ...), the filled degree included."""


@attrs.frozen(kw_only=True)
class Node:
    """Every strategy's degree, and the option combinations under them."""

    degrees: Mapping[str, int]
    groups: tuple[tuple[Choice, ...], ...]
    """Per strategy with options, then the training options: the combinations."""

    @property
    def size(self) -> int:
        return math.prod(len(group) for group in self.groups)

    @property
    def radices(self) -> tuple[int, ...]:
        return tuple(len(group) for group in self.groups)

    def choice(self, index: int) -> Choice:
        """The layout numbered `index` under this node."""
        found: Choice = {f"{name}.{DEGREE}": degree for name, degree in self.degrees.items()}
        for group, radix in zip(reversed(self.groups), reversed(self.radices)):
            index, digit = divmod(index, radix)
            found.update(group[digit])
        return found

    def choices(self) -> Iterator[Choice]:
        for index in range(self.size):
            yield self.choice(index)


@attrs.frozen(kw_only=True)
class Space:
    """The nodes of one spec's search, and what building a layout's spec needs."""

    spec: Spec
    dimensions: tuple[SearchDimension, ...]
    fill: str | None
    """The strategy whose degree takes the GPUs the others leave (data)."""
    pins: Mapping[str, Any]
    nodes: tuple[Node, ...]

    @property
    def considered(self) -> int:
        return sum(node.size for node in self.nodes)


def settings_of(spec: Spec, changes: Mapping[str, Any]) -> Search:
    """The spec's `[search]` (or the defaults) with `changes` applied."""
    base = spec.search or Search()
    return attrs.evolve(base, **{k: v for k, v in changes.items() if v is not None})


def fill_strategy(strategies: Mapping[str, Strategy[Any]]) -> str | None:
    """The strategy that multiplies the GPU count and whose degree defaults to -1."""
    for name, strategy in strategies.items():
        if strategy.multiplies_gpus and strategy.degree(strategy.config_type()) == -1:
            return name
    return None


def build_space(spec: Spec, strategies: Mapping[str, Strategy[Any]],
                dimensions: tuple[SearchDimension, ...], pins: Mapping[str, Any],
                settings: Search) -> Space:
    """Every node of the space (`settings` checked: `llmpar.search.settings`); SpecError
    when the space is larger than `[search] max_degree_combinations` or `max_layouts`
    allow, found before the excess is laid out."""
    fill = fill_strategy(strategies)
    products = _degree_products(spec, strategies, dimensions, pins, settings, fill)
    if products.count > settings.max_degree_combinations:
        raise SpecError([_too_many_degrees(spec, products, settings, fill)])
    nodes = []
    layouts = 0
    interned: dict[tuple[tuple[tuple[str, Any], ...], ...], tuple[Choice, ...]] = {}
    side = [d.strategy for d in dimensions
            if d.is_degree and not strategies[d.strategy].multiplies_gpus]
    for number, degrees in enumerate(_degree_nodes(spec, dimensions, pins, settings, fill,
                                                   products, side), 1):
        if number > settings.max_degree_combinations:
            raise SpecError([_too_many_degrees(spec, products, settings, fill, side)])
        point = Point(spec=spec, degrees=degrees)
        room = settings.max_layouts - layouts
        groups = [_options(point, dims, pins, settings, room)
                  for dims in _by_strategy(dimensions)]
        groups.append(_training_options(pins, settings))
        # Equal groups become one object, so that work per group is shared by nodes.
        groups = [interned.setdefault(tuple(tuple(c.items()) for c in g), g) for g in groups]
        node = Node(degrees=degrees, groups=tuple(g for g in groups if g != ({},)))
        layouts += node.size
        if layouts > settings.max_layouts:
            raise SpecError([_too_many_layouts(layouts, number, settings)])
        if node.size:
            nodes.append(node)
    return Space(spec=spec, dimensions=dimensions, fill=fill, pins=dict(pins),
                 nodes=tuple(nodes))


NARROW_DEGREES = ("narrow it with [search] max_degrees, tensor_within_node or values, or "
                  "pin degrees in [parallel.*] tables")
NARROW_LAYOUTS = ("narrow it with [search] max_degrees, tensor_within_node, values, "
                  "micro_batch_sizes or recompute, or pin degrees in [parallel.*] tables")


def _count(number: float) -> str:
    return f"{number:,.0f}" if number < 2**53 else f"about {number:.3g}"


def _too_many_degrees(spec: Spec, products: DegreeProducts, settings: Search,
                      fill: str | None, side: list[str] | None = None) -> Problem:
    """Over the limit: counted before any is laid out, or (`side`: the degrees chosen
    within each split, such as expert's) found while laying them out."""
    limit = settings.max_degree_combinations
    names = ", ".join(products.names) or "no strategy"
    rest = f"; {fill} takes the GPUs left" if fill is not None else ""
    found = (f"{_count(products.count)} combinations of degrees ({names}{rest}), over the "
             f"limit of {limit:,}" if side is None else
             f"{_count(products.count)} combinations of degrees, and more than the limit of "
             f"{limit:,} once {' and '.join(side)} degrees are chosen in each")
    return Problem("$.search.max_degree_combinations",
                   f"{spec.hardware.num_gpus:,} GPUs split into {found}; {NARROW_DEGREES}")


def _too_many_layouts(layouts: int, reached: int, settings: Search) -> Problem:
    return Problem("$.search.max_layouts",
                   f"the space holds more layouts than the limit of {settings.max_layouts:,}: "
                   f"{layouts:,} in its first {reached:,} combinations of degrees alone; "
                   + NARROW_LAYOUTS)


def nothing_left(space: Space, settings: Search) -> Problem:
    """Why a space holds no layout: the narrowing in effect."""
    spec, pins = space.spec, space.pins
    narrowing = [f"values ({', '.join(settings.values)})" if settings.values else "",
                 f"max_degrees ({', '.join(settings.max_degrees)})" if settings.max_degrees
                 else "", "tensor_within_node" if settings.tensor_within_node else ""]
    said = [f"[search] {item}" for item in narrowing if item]
    keys = {d.key for d in space.dimensions}
    pinned = [f"{key} = {value!r}" for key, value in pins.items()
              if key in keys or key.endswith(f".{DEGREE}")]
    if pinned:
        said.append("the [parallel.*] tables' " + ", ".join(pinned))
    why = " and ".join(said) or "the dimensions' values"
    return Problem("$.search", f"no layout is left to search on {spec.hardware.num_gpus:,} "
                               f"GPUs: {why} leave no combination; `llmpar search SPEC "
                               "--dimensions` lists what each key takes")


def _allowed(key: str, values: tuple[Any, ...], pins: Mapping[str, Any],
             settings: Search) -> tuple[Any, ...]:
    """`values` narrowed by a pin or by `[search] values`."""
    if key in pins:
        return (pins[key],)
    if key in settings.values:
        allowed = settings.values[key]
        return tuple(v for v in values if v in allowed)
    return values


def _degree_values(name: str, dimension: SearchDimension | None, point: Point,
                   num_gpus: int, settings: Search, pins: Mapping[str, Any]) -> tuple[int, ...]:
    spec = point.spec
    if dimension is None or dimension.values is None:
        values = divisors(num_gpus)
    else:
        values = dimension.values_at(point)
    limit = settings.max_degrees.get(name)
    if limit is not None:
        values = tuple(v for v in values if v <= limit)
    if name == "tensor" and settings.tensor_within_node:
        per_node = spec.hardware.gpus_per_node
        values = tuple(v for v in values if v <= per_node and per_node % v == 0)
    return _allowed(f"{name}.{DEGREE}", values, pins, settings)


def _degree_products(spec: Spec, strategies: Mapping[str, Strategy[Any]],
                     dimensions: tuple[SearchDimension, ...], pins: Mapping[str, Any],
                     settings: Search, fill: str | None) -> DegreeProducts:
    """The degrees of the strategies that multiply the GPU count (values at a point with
    no degrees), the fill's taking the rest."""
    num_gpus = spec.hardware.num_gpus
    degree_dims = {d.strategy: d for d in dimensions if d.is_degree}
    multiplying = [n for n in degree_dims if strategies[n].multiplies_gpus and n != fill]
    empty = Point(spec=spec, degrees={})
    options = {n: _degree_values(n, degree_dims[n], empty, num_gpus, settings, pins)
               for n in multiplying}
    # A table's degree that no dimension varies still takes its GPUs.
    for name, config in spec.parallel.items():
        strategy = strategies[name]
        if (name not in degree_dims and name != fill and strategy.multiplies_gpus
                and hasattr(config, DEGREE) and strategy.degree(config) != -1):
            options[name] = (strategy.degree(config),)
    rest = None if fill is None else _degree_values(fill, None, empty, num_gpus, settings, pins)
    return DegreeProducts(num_gpus, options, rest)


def _degree_nodes(spec: Spec, dimensions: tuple[SearchDimension, ...],
                  pins: Mapping[str, Any], settings: Search, fill: str | None,
                  products: DegreeProducts, side: list[str]) -> Iterator[dict[str, int]]:
    """Every degree of every strategy: the products' choices, the fill's rest, and the
    `side` strategies' degrees (which do not multiply the GPU count) within each."""
    num_gpus = spec.hardware.num_gpus
    degree_dims = {d.strategy: d for d in dimensions if d.is_degree}
    for degrees in products.choices():
        if fill is not None:
            degrees = {**degrees, fill: num_gpus // math.prod(degrees.values())}
        yield from _with_side_degrees(degrees, side, degree_dims, spec, num_gpus, settings,
                                      pins)


def _with_side_degrees(degrees: dict[str, int], side: list[str],
                       degree_dims: Mapping[str, SearchDimension], spec: Spec, num_gpus: int,
                       settings: Search, pins: Mapping[str, Any]) -> Iterator[dict[str, int]]:
    if not side:
        yield degrees
        return
    name, rest = side[0], side[1:]
    point = Point(spec=spec, degrees=degrees)
    for value in _degree_values(name, degree_dims[name], point, num_gpus, settings, pins):
        yield from _with_side_degrees({**degrees, name: value}, rest, degree_dims, spec,
                                      num_gpus, settings, pins)


def _by_strategy(dimensions: tuple[SearchDimension, ...]) -> list[list[SearchDimension]]:
    """The option dimensions in groups enumerated together: one per strategy, and the
    strategies a dimension `sees` joined with its own (in the dimensions' order)."""
    options = [d for d in dimensions if not d.is_degree]
    owner = {d.key: d.strategy for d in options}
    joined = {d.strategy: d.strategy for d in options}

    def root(name: str) -> str:
        while joined[name] != name:
            name = joined[name]
        return name

    for dimension in options:
        for key in dimension.sees:
            if key in owner:
                joined[root(owner[key])] = root(dimension.strategy)
    grouped: dict[str, list[SearchDimension]] = {}
    for dimension in options:
        grouped.setdefault(root(dimension.strategy), []).append(dimension)
    return list(grouped.values())


def _options(point: Point, dims: list[SearchDimension], pins: Mapping[str, Any],
             settings: Search, room: int) -> tuple[Choice, ...]:
    """Every combination of one group's option dimensions at `point`: each dimension's
    values see its own strategy's earlier fields and every earlier choice of the group.
    Past `room` combinations the rest are not made: the node is over the limit."""
    combos: list[Choice] = [{}]
    for dimension in dims:
        if len(combos) > room:
            break
        grown = []
        for choice in combos:
            fields = {d.field: choice[d.key] for d in dims
                      if d.strategy == dimension.strategy and d.field is not None
                      and d.key in choice}
            here = attrs.evolve(point, fields=fields, choices=choice)
            values = _allowed(dimension.key, dimension.values_at(here), pins, settings)
            grown += [{**choice, dimension.key: value} for value in values]
        combos = grown
    return tuple(combos)


def _training_options(pins: Mapping[str, Any], settings: Search) -> tuple[Choice, ...]:
    sizes = _allowed(MICRO_BATCH, settings.micro_batch_sizes, pins, settings)
    modes = _allowed(RECOMPUTE, settings.recompute, pins, settings)
    return tuple({MICRO_BATCH: b, RECOMPUTE: r} for b in sizes for r in modes)
