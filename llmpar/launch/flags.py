"""Reading `--flag value` arguments into spec settings, shared by the launch targets'
import: each problem names its flag, and every problem is collected before one SpecError."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from llmpar.errors import Problem, SpecError


@attrs.define
class Words:
    """Reads one command line's flags (a server's, Megatron's), collecting every problem
    (each names its flag) instead of stopping at the first."""

    found: dict[str, list[str]]
    source: str
    problems: list[Problem] = attrs.field(factory=list)
    read: set[str] = attrs.field(factory=set)

    def switch(self, flag: str) -> bool:
        self.read.add(flag)
        if flag not in self.found:
            return False
        if self.found[flag]:
            self.problems.append(Problem(f"$.{flag}", f"is a switch and takes no value, got "
                                                      f"{' '.join(self.found[flag])!r}"))
        return True

    def text(self, flag: str) -> str | None:
        self.read.add(flag)
        values = self.found.get(flag)
        if values is None:
            return None
        if len(values) != 1:
            self.problems.append(Problem(f"$.{flag}", f"expected one value, got {values!r}"))
            return None
        return values[0]

    def integer(self, flag: str, least: int = 1) -> int | None:
        value = self.text(flag)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            self.problems.append(Problem(f"$.{flag}", f"expected an integer, got {value!r}"))
            return None
        if number < least:
            self.problems.append(Problem(f"$.{flag}", f"must be >= {least}, got {number}"))
            return None
        return number

    def fraction(self, flag: str) -> float | None:
        return self._number_within(flag, lambda x: 0 < x <= 1, "(0, 1]")

    def probability(self, flag: str) -> float | None:
        """A probability in [0, 1), such as a dropout's."""
        return self._number_within(flag, lambda x: 0 <= x < 1, "[0, 1)")

    def _number_within(self, flag: str, inside: Callable[[float], bool],
                       interval: str) -> float | None:
        value = self.text(flag)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            self.problems.append(Problem(f"$.{flag}", f"expected a number, got {value!r}"))
            return None
        if not inside(number):
            self.problems.append(Problem(f"$.{flag}", f"must be in {interval}, got {number}"))
            return None
        return number

    def choice(self, flag: str, choices: Mapping[str, str | None]) -> str | None:
        value = self.text(flag)
        if value is not None and value not in choices:
            self.problems.append(Problem(f"$.{flag}", f"must be one of "
                                         f"{', '.join(choices)}, got {value!r}"))
            return None
        return None if value is None else choices[value]

    def ignored(self) -> tuple[str, ...]:
        """The flags given that llmpar does not model (a note, not an error)."""
        rest = sorted(set(self.found) - self.read)
        return (f"ignored: {', '.join(rest)} (not modelled)",) if rest else ()

    def done(self) -> None:
        if self.problems:
            raise SpecError(self.problems, self.source)
