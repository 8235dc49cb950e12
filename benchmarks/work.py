"""The interpreter's work in one call: the bytecodes it runs and the Python frames it
enters, counted with `sys.settrace` (opcode events).

Times on a shared machine move by 5 to 30% between runs of the same code; these counts
move only when the code does, so they show a change of a few percent that no timing
resolves. They are not times: a bytecode of a C call (numpy, `dict.get`, an attrs
`__init__`'s `object.__setattr__`) counts as one, whatever it costs, and another Python
version compiles other bytecodes. Compare counts of one Python version only.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import attrs


@attrs.frozen
class Work:
    """What one call ran."""

    bytecodes: int
    calls: int
    """Python frames entered (generators' resumptions included)."""
    by_function: Counter[str] = attrs.field(eq=False, repr=False)
    """Bytecodes by function, as `file:line(name)`, the repository's paths relative."""


def work_of(function: Callable[[], Any], roots: Sequence[str] = ()) -> Work:
    """Count what `function()` runs (its result dropped); the first of `roots` a file's
    path starts with is taken off it in `by_function`."""
    by_function: Counter[str] = Counter()
    calls = 0

    def enter(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal calls
        calls += 1
        frame.f_trace_opcodes = True
        code = frame.f_code
        path = next((code.co_filename.removeprefix(root) for root in roots
                     if code.co_filename.startswith(root)), code.co_filename)
        key = f"{path}:{code.co_firstlineno}({code.co_name})"

        def step(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                by_function[key] += 1
            return step

        return step

    sys.settrace(enter)
    try:
        function()
    finally:
        sys.settrace(None)
    return Work(bytecodes=sum(by_function.values()), calls=calls, by_function=by_function)
