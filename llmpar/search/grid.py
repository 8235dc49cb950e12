"""A node's layouts as a numpy grid: one axis per option group, in enumeration order.

Flattening an array of the grid's full shape (C order) numbers the layouts as
`Node.choice` does, so index i of a flattened estimate is layout i of the node.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llmpar.search.space import Node


class Grid:
    """Where each dimension key lives in a node's grid, and arrays along it."""

    def __init__(self, node: Node, shared: dict[tuple[Any, ...], Any] | None = None):
        """`shared` keeps work on option groups (which equal nodes share) across grids."""
        self.node = node
        self.shape = node.radices
        self._where: dict[str, tuple[int, list[Any]]] = {}
        self._shared = {} if shared is None else shared
        for axis, group in enumerate(node.groups):
            for key in group[0]:
                self._where[key] = (axis, [combo[key] for combo in group])

    @property
    def size(self) -> int:
        return self.node.size

    def has(self, key: str) -> bool:
        return key in self._where

    def axis(self, key: str) -> int | None:
        """The axis `key` varies along; None when the node has no such dimension."""
        return self._where[key][0] if key in self._where else None

    def values(self, key: str, default: Any = None) -> list[Any]:
        return self._where[key][1] if key in self._where else [default]

    def along(self, axis: int | None, items: Sequence[Any], dtype: Any = float) -> np.ndarray:
        """`items` as an array that varies along `axis` and broadcasts along the others."""
        if axis is None:
            return np.asarray(items[0], dtype=dtype).reshape((1,) * len(self.shape))
        shape = [1] * len(self.shape)
        shape[axis] = len(items)
        return np.asarray(items, dtype=dtype).reshape(shape)

    def array(self, key: str, convert: Callable[[Any], Any] = lambda v: v,
              default: Any = None, dtype: Any = float) -> np.ndarray:
        """The values of `key` (converted) along its axis; `default` where it has none."""
        return self.along(self.axis(key), [convert(v) for v in self.values(key, default)], dtype)

    def _projection(self, axis: int, keys: tuple[str, ...]) -> tuple[list[tuple[Any, ...]],
                                                                      np.ndarray]:
        """The distinct values of `keys` along `axis`, and each combination's position."""
        group = self.node.groups[axis]
        key = ("projection", id(group), keys)
        found = self._shared.get(key)
        if found is None:
            seen: dict[tuple[Any, ...], int] = {}
            inverse = np.array([seen.setdefault(tuple(combo[k] for k in keys), len(seen))
                                for combo in group])
            found = self._shared[key] = (list(seen), inverse, group)
        return found[0], found[1]

    def table(self, keys: Sequence[str], function: Callable[..., Any],
              defaults: Sequence[Any] = (), width: int | None = None,
              cache: tuple[Any, ...] | None = None) -> np.ndarray:
        """`function(*values of keys)` over the axes `keys` live on, called once per
        distinct combination of the values (defaults for keys the node lacks). With
        `width`, the function returns that many values, along a last extra axis. With
        `cache` (what else the function depends on), grids with the same option groups
        share the result."""
        axes = sorted({self._where[k][0] for k in keys if k in self._where})
        if cache is None:
            return self._table(keys, function, defaults, width, axes)
        groups = tuple(self.node.groups[a] for a in axes)
        key = ("table", cache, tuple(keys), tuple(axes), len(self.shape),
               tuple(id(g) for g in groups))
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = (self._table(keys, function, defaults, width, axes),
                                         groups)
        return found[0]

    def _table(self, keys: Sequence[str], function: Callable[..., Any],
               defaults: Sequence[Any], width: int | None, axes: list[int]) -> np.ndarray:
        defaults = tuple(defaults) + (None,) * (len(keys) - len(defaults))
        projections = [self._projection(a, tuple(k for k in keys if self.axis(k) == a))
                       for a in axes]
        slots: list[tuple[int | None, int, Any]] = []
        for key, default in zip(keys, defaults):
            axis = self.axis(key)
            if axis is None:
                slots.append((None, 0, default))
                continue
            here = [k for k in keys if self.axis(k) == axis]
            slots.append((axes.index(axis), here.index(key), None))
        extra = [] if width is None else [width]
        small = np.empty([len(p[0]) for p in projections] + extra, dtype=float)
        for position in itertools.product(*(range(len(p[0])) for p in projections)):
            parts = [p[0][digit] for p, digit in zip(projections, position)]
            small[position] = function(*(default if j is None else parts[j][i]
                                         for j, i, default in slots))
        shape = [1] * len(self.shape)
        for axis in axes:
            shape[axis] = self.shape[axis]
        if axes:
            small = small[np.ix_(*(p[1] for p in projections))]
        return small.reshape(shape + extra)

    def full(self, array: np.ndarray) -> np.ndarray:
        """`array` broadcast to the grid and flattened in enumeration order."""
        return np.broadcast_to(array, self.shape).reshape(-1)
