"""The cattrs converter that structures spec tables, and its error paths.

Scalars are strict: TOML's `true` is not an integer, "12" is not a number and
12.5 is not an integer, so nothing is silently coerced. Sizes and rates also
accept strings with units (`llmpar.units`).
"""

from __future__ import annotations

import math
import typing
import unicodedata
from collections.abc import Callable
from typing import Any, Literal

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from llmpar import units
from llmpar.errors import Problem, did_you_mean, join_path
from llmpar.loading.limits import magnitude_problem
from llmpar.spec.quantities import ByteRate, Bytes, Count, FlopRate, MemorySize, Seconds
from llmpar.spec.search import GpuCounts, gpu_counts
from llmpar.spec.validators import FieldError


def _in_range(value: float | int) -> float | int:
    """`value`, if it lies within llmpar's range for numbers (`limits.MAX_MAGNITUDE`)."""
    problem = magnitude_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(_in_range(value))


def _integer(value: Any, _type: Any = int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(_in_range(value))


PRINTED_CONTROLS = "\n\t"
"""The only control characters a spec's strings may hold (a long source may wrap): any
other (an escape, a carriage return, a bell) would act on the terminal when a report
prints the string."""


def _string(value: Any, _type: Any = str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    if not value.isprintable() and any(  # the common case, all printable, checked at once
            unicodedata.category(ch) in ("Cc", "Cf") and ch not in PRINTED_CONTROLS
            for ch in value):  # control and format (bidirectional override) characters
        raise ValueError(f"control characters are not allowed in a string, got {value!r}")
    return value


def _boolean(value: Any, _type: Any = bool) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


@attrs.frozen
class BareNumberFloor:
    """Below `floor`, a bare number (no unit) of a quantity is a unit left out: memory
    `80` meant "80 GB", a bandwidth `400` meant "400 Gb/s" or "400 GB/s". A string with
    its unit is taken as written, however small."""

    floor: float
    unit: str
    """The unit suggested: the number with it is what was likely meant."""

    def problem(self, value: float) -> str | None:
        if value == 0 or abs(value) >= self.floor:
            return None
        return (f"{value:g} as a bare number is implausibly small for this quantity; give "
                f"the unit, e.g. \"{value:g} {self.unit}\" (or write the small value with "
                "its unit)")


BARE_FLOORS = {MemorySize: BareNumberFloor(2**30, "GB"),
               ByteRate: BareNumberFloor(1e9, "GB/s"),
               FlopRate: BareNumberFloor(1e12, "TFLOP/s")}
"""A device's or a node's memory under 1 GiB, a link or memory rate under 1 GB/s and a
peak under 1 TFLOP/s, as bare numbers: every such field is a GPU's or a node's, far
beyond those values (sizes of other kinds, such as a search's memory limit, are Bytes
and have no floor)."""


def _with_units(parse: Callable[[str], float], integral: bool = False,
                floor: BareNumberFloor | None = None) -> Callable[[Any, Any], float | int]:
    """A hook taking a number in base units or a string that `parse` reads."""

    def structure(value: Any, _type: Any) -> float | int:
        if isinstance(value, str):
            number = _in_range(parse(value))
        else:
            number = _number(value)
            bare = None if floor is None else floor.problem(number)
            if bare is not None:
                raise ValueError(bare)
        return round(number) if integral else number

    return structure


def _is_choice(kind: Any) -> bool:
    """Whether a field's type is a Literal of strings (a choice)."""
    origin: Any = typing.get_origin(kind)
    return origin is Literal


def _is_array(kind: Any) -> bool:
    """Whether a field's type is a homogeneous tuple (`tuple[int, ...]`), a TOML array."""
    args = typing.get_args(kind)
    return typing.get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis


def _array_hook(converter: cattrs.Converter) -> Callable[[Any, Any], tuple[Any, ...]]:
    """Structure an array item by item; a table or a string is not an array (cattrs would
    iterate it, reporting "[0]: got 'a'" for `{ a = 1 }`)."""

    def structure(value: Any, kind: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected an array, got {value!r}")
        inner = typing.get_args(kind)[0]
        items, errors = [], []
        for index, item in enumerate(value):
            try:
                items.append(converter.structure(item, inner))
            except Exception as exc:  # noqa: BLE001 - each is reported with its index
                exc.__notes__ = [*getattr(exc, "__notes__", []), IterableValidationNote(
                    f"Structuring {kind!r} @ index {index}", index, inner)]
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {kind!r}", errors, kind)
        return tuple(items)

    return structure


def _switch_or_number(value: Any, _kind: Any) -> bool | float:
    return value if isinstance(value, bool) else _number(value)


def make_converter() -> cattrs.Converter:
    """A converter for spec tables: strict scalars, units, unknown keys refused."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(int, _integer)
    converter.register_structure_hook(float, lambda v, _t: _number(v))
    converter.register_structure_hook(str, _string)
    converter.register_structure_hook(bool, _boolean)
    converter.register_structure_hook(Bytes, _with_units(units.parse_bytes, integral=True))
    converter.register_structure_hook(MemorySize, _with_units(
        units.parse_bytes, integral=True, floor=BARE_FLOORS[MemorySize]))
    converter.register_structure_hook(FlopRate, _with_units(units.parse_flop_rate,
                                                            floor=BARE_FLOORS[FlopRate]))
    converter.register_structure_hook(ByteRate, _with_units(units.parse_byte_rate,
                                                            floor=BARE_FLOORS[ByteRate]))
    converter.register_structure_hook(Seconds, _with_units(units.parse_seconds))
    converter.register_structure_hook(Count, lambda v, _t: _number(v))
    converter.register_structure_hook(GpuCounts, lambda v, _t: gpu_counts(v, _integer))
    # A choice (a Literal) is a string here; the field's one_of validator names the choices
    # and suggests the nearest, as for every other field.
    converter.register_structure_hook_func(_is_choice, lambda value, _kind: _string(value))
    converter.register_structure_hook_func(_is_array, _array_hook(converter))
    # A switch or a probability (`[finetune] dropout`): the field's validator checks it.
    converter.register_structure_hook(bool | float, _switch_or_number)
    return converter


def _unknown_keys(exc: ForbiddenExtraKeysError, path: str) -> list[Problem]:
    known = [f.name for f in getattr(exc.cl, "__attrs_attrs__", ())]
    return [Problem(join_path(path, key), f"unknown key{did_you_mean(key, known)}")
            for key in sorted(exc.extra_fields)]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "required key missing"
    if isinstance(exc, TypeError) and ("iterable" in str(exc) or "mapping" in str(exc)):
        return "expected a table"
    if isinstance(exc, (ValueError, TypeError)) and str(exc):
        return str(exc)
    if isinstance(exc, AttributeError):
        return "expected a table"
    return f"invalid value ({type(exc).__name__}: {exc})"


def problems_from(exc: BaseException, path: str = "$") -> list[Problem]:
    """Every problem inside a cattrs structuring error, each with its key path."""
    problems: list[Problem] = []
    if isinstance(exc, IterableValidationError):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            problems += problems_from(sub, join_path(path, note.index))
        problems += [Problem(path, _describe(sub)) for sub in without]
    elif isinstance(exc, ClassValidationError):
        with_names, without = exc.group_exceptions()
        for sub, named in with_names:
            problems += problems_from(sub, join_path(path, named.name))
        for sub in without:
            if isinstance(sub, ForbiddenExtraKeysError):
                problems += _unknown_keys(sub, path)
                continue
            where = join_path(path, sub.field) if isinstance(sub, FieldError) else path
            problems.append(Problem(where, _describe(sub)))
    else:
        where = join_path(path, exc.field) if isinstance(exc, FieldError) else path
        problems.append(Problem(where, _describe(exc)))
    return problems


def _nested_attrs_class(field_type: Any) -> tuple[type | None, bool]:
    """(the attrs class inside `field_type`, whether it is a tuple of them)."""
    if attrs.has(field_type):
        return field_type, False
    args = [a for a in typing.get_args(field_type) if a is not Ellipsis]
    optional = [a for a in args if a is not type(None)]
    if len(optional) == 1 and len(args) == 2 and attrs.has(optional[0]):
        return optional[0], False  # `X | None`
    if typing.get_origin(field_type) is tuple and len(args) == 1 and attrs.has(args[0]):
        return args[0], True
    return None, False


def validator_problems(converter: cattrs.Converter, raw: Any, cls: type,
                       path: str) -> list[Problem]:
    """Run every field validator of `cls` (and nested classes) on `raw`'s values.

    attrs stops at the first failing validator of a class; running each one
    alone reports them all. Values that do not even structure are left to cattrs.
    """
    if not isinstance(raw, dict) or not attrs.has(cls):
        return []
    attrs.resolve_types(cls)
    problems: list[Problem] = []
    for field in attrs.fields(cls):
        if field.name not in raw:
            continue
        value, where = raw[field.name], join_path(path, field.name)
        nested, many = _nested_attrs_class(field.type)
        if nested is not None:
            items = enumerate(value) if many and isinstance(value, list) else [(None, value)]
            for index, item in items:
                item_path = where if index is None else join_path(where, index)
                problems += validator_problems(converter, item, nested, item_path)
            continue
        if field.validator is None:
            continue
        try:
            structured = converter.structure(value, field.type)
            field.validator(None, field, structured)
        except FieldError as exc:  # its field may name a key below the field's own
            problems.append(Problem(join_path(path, exc.field), str(exc)))
        except Exception:  # a type error: cattrs reports it with its path
            continue
    return problems


def structure(
    converter: cattrs.Converter, raw: Any, cls: type, path: str
) -> tuple[Any, list[Problem]]:
    """Structure `raw` as `cls`; on failure return None and the problems found."""
    if not isinstance(raw, dict):
        return None, [Problem(path, f"expected a table, got {raw!r}")]
    try:
        return converter.structure(raw, cls), []
    except (ClassValidationError, IterableValidationError, ValueError, TypeError, KeyError) as exc:
        problems = validator_problems(converter, raw, cls, path) + problems_from(exc, path)
        return None, list(dict.fromkeys(problems))
