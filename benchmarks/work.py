"""The interpreter's work in one call: the bytecodes it runs and the Python frames it
enters, counted with `sys.settrace` (opcode events).

Times on a shared machine move by 5 to 30% between runs of the same code; these counts
move only when the code does, so they show a change of a few percent that no timing
resolves. They are not times: a bytecode of a C call (numpy, `dict.get`, an attrs
`__init__`'s `object.__setattr__`) counts as one, whatever it costs. Count on CPython 3.11:
other versions compile other bytecodes, and 3.12 and 3.13 report opcode events to
`sys.settrace` only in part (3.12.1 none; 3.13.0 fewer, and not the same number for two
copies of the same code), so their counts compare with nothing.
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
    """Bytecodes by function, as `file:line(name)`, with the root taken off the file."""

    def bytecodes_under(self, folder: str) -> int:
        """The bytecodes of the functions whose file lies in `folder` (as `by_function`
        names it: "llmpar/" for the package, with its parent as the root)."""
        return sum(count for key, count in self.by_function.items() if key.startswith(folder))


def work_of(function: Callable[[], Any], roots: Sequence[str] = ()) -> Work:
    """Count what `function()` runs (its result dropped); the first of `roots` a file's
    path starts with is taken off it in `by_function`. A tracer already set (a coverage
    tool's) is set again afterwards."""
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

    before = sys.gettrace()
    sys.settrace(enter)
    try:
        function()
    finally:
        sys.settrace(before)
    if calls and not by_function:
        raise RuntimeError(f"Python {sys.version.split()[0]} reported no opcode events to "
                           "sys.settrace: count on CPython 3.11")
    return Work(bytecodes=sum(by_function.values()), calls=calls, by_function=by_function)
