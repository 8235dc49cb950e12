"""A framework configuration back into a spec (`llmpar import`): the settings a reading
target finds, set over a base spec (or a bare one built from the cluster and GPU count)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.launch.target import ReadingTarget, ReadSettings
from llmpar.loading.dump import spec_to_dict
from llmpar.plan import Plan
from llmpar.spec import Spec


def _drop(table: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        table = table.get(key)  # type: ignore[assignment]
        if not isinstance(table, dict):
            return
    table.pop(last, None)


def _set(table: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        table = table.setdefault(key, {})
    if value is None:
        table.pop(last, None)
    elif isinstance(value, dict):
        table[last] = {k: v for k, v in value.items() if v is not None}
    else:
        table[last] = value


def spec_table(read: ReadSettings, base: Spec | None,
               bare: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The spec table: the base's (fully resolved) with the format's owned keys dropped
    and its settings set; without a base, `bare` (the hardware) with the settings."""
    table = spec_to_dict(base) if base is not None else {}
    if base is not None:
        table.pop("version", None)
    before = {name for name, t in table.get("parallel", {}).items() if t}
    for key in read.owned:
        _drop(table, key)
    parallel = table.get("parallel", {})
    for name in [n for n in before if not parallel.get(n)]:
        parallel.pop(name, None)  # a table the format emptied: the strategy is off
    for key, value in (bare or {}).items():
        _set(table, key, value)
    for key, value in read.settings.items():
        _set(table, key, value)
    return table


def read_file(target: object, name: str, text: str, source: str,
              base: Spec | None) -> ReadSettings:
    """`target.read(...)`, or a SpecError if the target cannot read its format back."""
    if not isinstance(target, ReadingTarget):
        raise SpecError([Problem("$.--from", f"launch target {name!r} writes its format "
                                             "but cannot read it back")], source)
    return target.read(text, source, base)


def imported_spec(read: ReadSettings, table: dict[str, Any],
                  load: Callable[[dict[str, Any]], Spec],
                  evaluate: Callable[[Spec], Plan]) -> tuple[dict[str, Any], Spec]:
    """The spec of `table` (`spec_table`'s), with the settings that need its plan
    (`ReadSettings.planned`) set over it: the table and the spec, loaded with `load`."""
    spec = load(table)
    if read.planned is None:
        return table, spec
    for key, value in read.planned(spec, evaluate(spec)).items():
        _set(table, key, value)
    return table, load(table)
