"""Errors that llmpar raises on purpose.

A `SpecError` gathers every problem of one spec, each with the key path where it
was found, so a user fixes them all in one pass instead of one per run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import attrs


@attrs.frozen
class Problem:
    """One thing wrong with a spec: where (`$.parallel.data.degree`) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


MAX_SHOWN = 50
"""Problems a SpecError's message lists; the rest are counted (all stay in `problems`)."""


def printable(text: str) -> str:
    """`text` with control and format characters escaped (`\\x1b`, `\\n`), so that a key
    echoed in a message cannot move the cursor, clear the screen or forge a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


class SpecError(ValueError):
    """A spec that cannot be planned: every problem found, with file and key path."""

    def __init__(self, problems: Iterable[Problem], source: str | None = None):
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = printable(self.source or "<spec>")
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{where}: {count} {noun}:"]
        lines += [f"  {printable(str(problem))}" for problem in self.problems[:MAX_SHOWN]]
        if count > MAX_SHOWN:
            lines.append(f"  ... and {count - MAX_SHOWN:,} more (the first {MAX_SHOWN} "
                         "are shown)")
        return "\n".join(lines)

    def with_source(self, source: str | None) -> SpecError:
        """The same problems, attributed to `source` when none was known."""
        if self.source is not None or source is None:
            return self
        return SpecError(self.problems, source)


class PluginError(RuntimeError):
    """A plugin that could not be loaded or applied; the message names it."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A " (did you mean 'x'?)" suffix naming up to three close names, or ''. Names that
    start with the word or that the word starts with, ignoring case and separators
    (`a100` for `a100-sxm-80gb`, `llama3-8b` for `llama-3-8b`, `adamm` for `adam`), come
    first, the nearest in length first; then the closest by spelling."""
    names = sorted(choices)
    key = _plain(word)
    related = sorted((name for name in names if _related(_plain(name), key)),
                     key=lambda name: (abs(len(_plain(name)) - len(key)), name))
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    found = list(dict.fromkeys(related + close))[:3]
    if not found:
        return ""
    return f" (did you mean {' or '.join(repr(name) for name in found)}?)"


def _plain(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _related(name: str, word: str) -> bool:
    """One starts with the other (both at least three letters or digits)."""
    return min(len(name), len(word)) >= 3 and (name.startswith(word) or word.startswith(name))


def join_path(base: str, key: str | int) -> str:
    """Extend a `$.a.b` key path with a key or a list index."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}"
