"""What the launch round-trip tests share: whether an example can round-trip at all."""

from __future__ import annotations

from collections.abc import Iterable

from llmpar.launch import Launch


def decides_unmapped(launch: Launch, keys: Iterable[str]) -> bool:
    """Whether a setting `launch` listed as not mapped is one the import decides (a key of
    `keys`, a table above one, or a key inside one): the example then cannot come back
    the same, and the round trip leaves it out."""
    keys = set(keys)
    return any(path == k or path.startswith(k + ".") or k.startswith(path + ".")
               for path in (u.path.removeprefix("$.") for u in launch.unmapped) for k in keys)
