"""Field validators for spec classes.

Each raises ValueError with the bad value quoted; the loader adds the key path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from llmpar.dtypes import BYTES_PER_ELEMENT
from llmpar.errors import did_you_mean

Number = TypeVar("Number", bound=float | None)
"""The type of the field a number validator checks (int, float, a NewType of one, or
None), so that the field keeps its own type under attrs."""


class FieldError(ValueError):
    """A bad value of one field; `field` extends the key path in error messages."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def positive(_instance: Any, attribute: Any, value: Number) -> None:
    """A finite number above zero (None passes: the field is optional)."""
    if value is None:
        return
    if not math.isfinite(value) or value <= 0:
        raise FieldError(attribute.name, f"must be a finite number > 0, got {value!r}")


def non_negative(_instance: Any, attribute: Any, value: Number) -> None:
    """A finite number at or above zero (None passes)."""
    if value is None:
        return
    if not math.isfinite(value) or value < 0:
        raise FieldError(attribute.name, f"must be a finite number >= 0, got {value!r}")


def fraction(_instance: Any, attribute: Any, value: Number) -> None:
    """A number in (0, 1], such as a utilization (None passes)."""
    if value is None:
        return
    if not math.isfinite(value) or not 0 < value <= 1:
        raise FieldError(attribute.name, f"must be in (0, 1], got {value!r}")


def share_below_one(_instance: Any, attribute: Any, value: Number) -> None:
    """A share in [0, 1), such as the part of a GPU a communication kernel takes while it
    hides: one that took the whole GPU would hide nothing."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise FieldError(attribute.name, f"must be a number in [0, 1), got {value!r}")


def one_of(*choices: str) -> Callable[[Any, Any, str], None]:
    """A validator that accepts only `choices`."""

    def check(_instance: Any, attribute: Any, value: str) -> None:
        if value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            raise FieldError(
                attribute.name,
                f"must be one of {listed}, got {value!r}{did_you_mean(str(value), choices)}",
            )

    check.choices = choices  # type: ignore[attr-defined]
    """What the contract suite draws a field's values from."""
    return check


def dtype(_instance: Any, attribute: Any, value: str) -> None:
    """A numeric format llmpar knows the size of."""
    if value not in BYTES_PER_ELEMENT:
        listed = ", ".join(repr(c) for c in BYTES_PER_ELEMENT)
        raise FieldError(
            attribute.name,
            f"must be one of {listed}, got {value!r}{did_you_mean(str(value), BYTES_PER_ELEMENT)}",
        )


def optional_pattern(letters: str) -> Callable[[Any, Any, str | None], None]:
    """A validator of a non-empty string of `letters` (None passes)."""

    def check(_instance: Any, attribute: Any, value: str | None) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not value or set(value) - set(letters):
            raise FieldError(attribute.name, f"must be a string of the letters "
                                             f"{', '.join(letters)}, got {value!r}")

    return check
