"""Arithmetic that serves one layout and many at once.

Evaluation runs the same formulas on plain numbers (one spec: `llmpar.evaluate`) and on
numpy arrays (every layout of a search node at once, each setting that varies an array
broadcasting over the node's grid). Plain `+ - * / //` serve both; branches on a value
that may vary are written with these helpers, which take the plain path for plain
numbers (fast, and exact as Python computes it) and numpy's elementwise one for arrays.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np

Value: TypeAlias = Any
"""A plain number (or bool, or str), or a numpy array of them."""


def is_array(value: object) -> bool:
    return isinstance(value, np.ndarray)


def where(condition: Value, yes: Value, no: Value) -> Value:
    """`yes` where `condition` holds, else `no`."""
    if isinstance(condition, np.ndarray):
        return np.where(condition, yes, no)
    return yes if condition else no


def maximum(first: Value, second: Value) -> Value:
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return np.maximum(first, second)
    return first if first >= second else second


def minimum(first: Value, second: Value) -> Value:
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return np.minimum(first, second)
    return first if first <= second else second


def largest(values: Iterable[Value]) -> Value:
    """The elementwise maximum of several values."""
    found: Value = None
    for value in values:
        if found is None:
            found = value
        elif isinstance(found, np.ndarray) or isinstance(value, np.ndarray):
            found = np.maximum(found, value)
        else:  # `maximum` of plain numbers, without a call per value
            found = found if found >= value else value
    return found


def rounded(value: Value) -> Value:
    """To the nearest whole number, halves to even (Python's round, numpy's rint)."""
    if isinstance(value, np.ndarray):
        return np.rint(value)
    return round(value)


def logical_and(first: Value, second: Value) -> Value:
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return np.logical_and(first, second)
    return bool(first) and bool(second)


def logical_or(first: Value, second: Value) -> Value:
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return np.logical_or(first, second)
    return bool(first) or bool(second)


def logical_not(value: Value) -> Value:
    if isinstance(value, np.ndarray):
        return np.logical_not(value)
    return not value


def any_of(conditions: Iterable[Value]) -> Value:
    """Whether any of several conditions holds, elementwise (False for none)."""
    found: Value = False
    for condition in conditions:
        found = logical_or(found, condition)
    return found


def anywhere(condition: Value) -> bool:
    """Whether `condition` holds for any layout."""
    return bool(np.any(condition)) if isinstance(condition, np.ndarray) else bool(condition)


def is_unset(value: Value) -> Value:
    """Whether an optional setting is None; elementwise for an array of one (a search
    node's values of it, an object array holding None and numbers)."""
    if isinstance(value, np.ndarray):
        return np.array([v is None for v in value.flat], dtype=bool).reshape(value.shape)
    return value is None


def filled(value: Value, fill: int) -> Value:
    """An optional integer setting with `fill` where it is None; an integer array for an
    array of one."""
    if isinstance(value, np.ndarray):
        return np.array([fill if v is None else v for v in value.flat],
                        dtype=np.int64).reshape(value.shape)
    return fill if value is None else value
