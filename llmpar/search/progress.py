"""A progress line on a terminal's stderr for long searches; nothing when not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from llmpar.search.exhaustive import Progress

INTERVAL_SECONDS = 0.2


def terminal_progress(stream: TextIO | None = None) -> Progress | None:
    """A progress callback drawing on `stream` (stderr) when it is a terminal, else None."""
    out = stream or sys.stderr
    if not out.isatty():
        return None
    last = [0.0]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < INTERVAL_SECONDS and done < total:
            return
        last[0] = now
        share = min(1.0, done / total) if total else 1.0
        bar = "#" * int(share * 30)
        out.write(f"\r\033[K{stage} [{bar:<30}] {done:,}/{total:,} layouts")
        out.flush()

    return show


def clear(stream: TextIO | None = None) -> None:
    """Erase the progress line."""
    out = stream or sys.stderr
    if out.isatty():
        out.write("\r\033[K")
        out.flush()
