"""Fields of a plan built on first read: the explanatory records (derivations) that no
number of the plan needs.

`deferred(build)` stands for a field's value in a constructor; the class's field, made
`deferring(cls, name)`, calls `build` the first time it is read and keeps what it returns
in the instance, so every later read (equality, hashing, pickling, `to_dict()`) sees that
value, the one an eager construction would have stored. `build` closes over values its own
evaluation computed and nothing else: nothing is shared between evaluations. Two threads
reading the field at once may both build it; they get equal values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")
C = TypeVar("C", bound=type)


class _Deferred:
    """A field's value not built yet."""

    __slots__ = ("build",)

    def __init__(self, build: Callable[[], Any]):
        self.build = build


def deferred(build: Callable[[], T]) -> T:
    """A value for a deferring field (`deferring`), built by `build` on first read."""
    return cast(T, _Deferred(build))


class _Field:
    """A slot of a frozen attrs class that builds a deferred value on first read."""

    __slots__ = ("slot",)

    def __init__(self, slot: Any):
        self.slot = slot

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = self.slot.__get__(instance, owner)
        if type(value) is _Deferred:
            value = value.build()
            self.slot.__set__(instance, value)
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        self.slot.__set__(instance, value)

    def __delete__(self, instance: Any) -> None:
        self.slot.__delete__(instance)


def deferring(cls: C, *names: str) -> C:
    """`cls` (a slotted attrs class) with the fields `names` accepting `deferred` values."""
    for name in names:
        slot = cls.__dict__[name]
        if not hasattr(slot, "__set__") or isinstance(slot, _Field):
            raise TypeError(f"{cls.__name__}.{name} is not a slot")
        setattr(cls, name, _Field(slot))
    return cls
