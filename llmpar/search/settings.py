"""Checking `[search]` against the dimensions the session's strategies declare.

`[search] values` narrows dimensions by key; a key that names none, or a value its
field cannot take, would otherwise leave a dimension with nothing to try and the
search with no layout, silently. Each value is structured as its strategy's config
field (or `[training]`'s) would be, so the same validators judge it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, did_you_mean
from llmpar.loading.converter import structure
from llmpar.search.dimension import DEGREE, SearchDimension
from llmpar.search.space import MICRO_BATCH, RECOMPUTE, TRAINING_KEYS
from llmpar.spec.search import Search
from llmpar.spec.workload import Training

if TYPE_CHECKING:
    import cattrs

    from llmpar.spec import Spec
    from llmpar.strategy import Strategy


@attrs.frozen(kw_only=True)
class Key:
    """A key `[search] values` may name: the config class and field its values are
    structured as (field None: a table's presence, true or false)."""

    config_type: type
    field: str | None
    degree_of: str | None = None
    """For a degree: the strategy's name."""


def searchable_keys(dimensions: tuple[SearchDimension, ...],
                    strategies: Mapping[str, Strategy[Any]],
                    fill: str | None) -> dict[str, Key]:
    """Every key `[search] values` may name, sorted: the dimensions', the fill's degree
    and the training options."""
    keys = {d.key: Key(config_type=strategies[d.strategy].config_type, field=d.field,
                       degree_of=d.strategy if d.is_degree else None)
            for d in dimensions}
    if fill is not None:
        keys[f"{fill}.{DEGREE}"] = Key(config_type=strategies[fill].config_type, field=DEGREE,
                                       degree_of=fill)
    for key in TRAINING_KEYS:
        keys[key] = Key(config_type=Training, field=key.split(".", 1)[1])
    return dict(sorted(keys.items()))


def checked_values(settings: Search, spec: Spec, dimensions: tuple[SearchDimension, ...],
                   strategies: Mapping[str, Strategy[Any]], fill: str | None,
                   converter: cattrs.Converter) -> tuple[Search, list[Problem]]:
    """`settings` with each `values` list structured (arrays as tuples, as the fields hold
    them), and every problem of `values` and `max_degrees`."""
    keys = searchable_keys(dimensions, strategies, fill)
    problems: list[Problem] = []
    structured: dict[str, tuple[Any, ...]] = {}
    for key, values in settings.values.items():
        where = f"$.search.values.{key}"
        known = keys.get(key)
        if known is None:
            problems.append(Problem(where, f"no search dimension has this key"
                                           f"{did_you_mean(key, keys)}; known: "
                                           + ", ".join(keys)))
            continue
        items, found = _structured(known, values, where, converter)
        problems += found or _reach_problems(key, known, items, where, settings, spec,
                                             strategies)
        structured[key] = items
    degrees = sorted(k.degree_of for k in keys.values() if k.degree_of is not None)
    problems += [Problem(f"$.search.max_degrees.{name}",
                         f"no searched degree has this name{did_you_mean(name, degrees)}; "
                         "known: " + ", ".join(degrees))
                 for name in settings.max_degrees if name not in degrees]
    return attrs.evolve(settings, values=structured), problems


def _structured(key: Key, values: tuple[Any, ...], where: str,
                converter: cattrs.Converter) -> tuple[tuple[Any, ...], list[Problem]]:
    """Each value as its field holds it, or the problems of those that are not one."""
    items: list[Any] = []
    problems: list[Problem] = []
    for index, value in enumerate(values):
        at = f"{where}[{index}]"
        if key.field is None:
            if not isinstance(value, bool):
                problems.append(Problem(at, f"expected true or false, got {value!r}"))
            items.append(value)
            continue
        config, found = structure(converter, {key.field: value}, key.config_type, "$")
        # Only the field's own problems: a class check across fields judges combinations,
        # which the search leaves to the strategies' rules.
        own = f"$.{key.field}"
        problems += [Problem(at + p.path[len(own):], p.message) for p in found
                     if p.path == own or p.path.startswith((own + ".", own + "["))]
        if config is not None:
            value = getattr(config, key.field)
            if key.degree_of is not None and value < 1:
                problems.append(Problem(at, f"a searched degree must be >= 1, got {value!r}"))
        items.append(value)
    return tuple(items), problems


def _reach_problems(key: str, known: Key, items: tuple[Any, ...], where: str,
                    settings: Search, spec: Spec,
                    strategies: Mapping[str, Strategy[Any]]) -> list[Problem]:
    """Lists no layout could take: degrees that divide no share of the GPUs, training
    options outside the lists they narrow."""
    if known.degree_of is not None and strategies[known.degree_of].multiplies_gpus:
        num_gpus = spec.hardware.num_gpus
        if not any(num_gpus % degree == 0 for degree in items):
            return [Problem(where, f"no degree of {list(items)!r} divides hardware.num_gpus "
                                   f"({num_gpus})")]
    lists = {MICRO_BATCH: ("micro_batch_sizes", settings.micro_batch_sizes),
             RECOMPUTE: ("recompute", settings.recompute)}
    if key in lists:
        name, offered = lists[key]
        if not set(items) & set(offered):
            return [Problem(where, f"none of {list(items)!r} is in [search] {name} "
                                   f"{list(offered)!r}, the list these values narrow")]
    return []


def pin_problems(settings: Search, pins: Mapping[str, Any]) -> list[Problem]:
    """`values` lists that leave out what a `[parallel.*]` table pins: the pin would win
    and the list be ignored."""
    return [Problem(f"$.search.values.{key}",
                    f"the spec's [parallel] tables pin {key} = {pins[key]!r}, which this list "
                    f"{list(values)!r} leaves out")
            for key, values in settings.values.items()
            if key in pins and pins[key] not in values]
