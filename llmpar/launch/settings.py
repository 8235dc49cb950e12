"""Which settings a spec states, and a ledger of what a target did with each.

A target marks every setting it writes (`take`) or cannot write (`cannot`); whatever
else the spec states is listed as unmapped at the end (`Ledger.unmapped`), so no
setting is dropped silently. A setting is a leaf of the spec that differs from its
default (attrs field defaults, factories included), or the presence of a
`[parallel.<name>]` table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from llmpar.launch.target import Unmapped
from llmpar.placement import RANK_ORDER
from llmpar.spec import Spec

DESCRIPTIVE = (
    "version", "search", "hardware.gpu", "hardware.cluster", "hardware.source",
    "hardware.intra_node_bandwidth_bytes_per_s", "hardware.intra_node_latency_seconds",
    "hardware.inter_node_bandwidth_bytes_per_s", "hardware.inter_node_latency_seconds",
    "hardware.host_bandwidth_bytes_per_s", "hardware.host_memory_bytes",
    "hardware.collective_efficiency", "hardware.memory_headroom_bytes",
    "hardware.gpu_hour_cost", "model.name", "model.source", "optimizer.name",
    "optimizer.source", "training.framework", "training.activation_model",
    "training.activation_coefficient", "training.attention_flops", "training.mfu",
    "parallel.expert.imbalance", "parallel.sequence.overlap_compute_share",
    "training.goodput.storage_bandwidth_bytes_per_s", "training.goodput.restart_seconds",
    "training.goodput.interruptions_per_gpu_day",
)
"""What the spec says about the machine, the model's provenance, the stack's costs and
llmpar's own accounting: facts for the plan, not settings a framework takes."""


def _default(instance: Any, field: attrs.Attribute[Any]) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        factory: Any = default
        return factory.factory(instance) if factory.takes_self else factory.factory()
    return default


def _leaves(instance: Any, path: str) -> Iterator[tuple[str, Any]]:
    for field in attrs.fields(type(instance)):
        if field.eq is False:
            continue  # where the spec was read from: not part of it
        value = getattr(instance, field.name)
        where = f"{path}.{field.name}" if path else field.name
        if attrs.has(type(value)):
            yield from _leaves(value, where)
        elif value != _default(instance, field):
            yield where, value


def stated_settings(spec: Spec) -> dict[str, Any]:
    """Every setting `spec` states, by dotted path (no `$.`): leaves that differ from
    their defaults, and `parallel.<name>` for each strategy table present."""
    found: dict[str, Any] = {}
    for field in attrs.fields(Spec):
        value = getattr(spec, field.name)
        if field.name == "parallel":
            for name, config in value.items():
                found[f"parallel.{name}"] = "(table present)"
                found.update(_leaves(config, f"parallel.{name}"))
        elif field.name == "rank_order":
            if value != RANK_ORDER:
                found["parallel.order"] = "-".join(value)
        elif field.eq is not False and attrs.has(type(value)):
            found.update(_leaves(value, field.name))
        elif field.eq is not False and value != _default(spec, field):
            found[field.name] = value
    return found


def _text(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@attrs.define
class Ledger:
    """What one target did with each setting of one spec (made per call, never shared)."""

    spec: Spec
    target: str
    stated: dict[str, Any] = attrs.field(init=False)
    handled: set[str] = attrs.field(init=False, factory=set)
    skipped: list[Unmapped] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        self.stated = stated_settings(self.spec)

    def take(self, *paths: str) -> None:
        """Mark settings (or whole tables) as written."""
        self.handled.update(paths)

    def cannot(self, path: str, reason: str, value: Any = None) -> None:
        """Mark a setting as not expressible, with the reason; listed when the spec
        states it (or `value` is given)."""
        self.handled.add(path)
        stated = [p for p in self.stated if p == path or p.startswith(path + ".")]
        if value is None and not stated:
            return
        shown = _text(value) if value is not None else ", ".join(
            f"{p.removeprefix(path + '.')}={_text(self.stated[p])}" if p != path
            else _text(self.stated[p]) for p in stated)
        self.skipped.append(Unmapped(f"$.{path}", shown, reason))

    def _covered(self, path: str) -> bool:
        if any(path == h or path.startswith(h + ".") for h in (*self.handled, *DESCRIPTIVE)):
            return True
        # a table's presence is handled when any of its settings is
        return path.startswith("parallel.") and path.count(".") == 1 and any(
            h.startswith(path + ".") for h in self.handled)

    def unmapped(self) -> tuple[Unmapped, ...]:
        """What the target could not write: the settings it declined, then every other
        setting the spec states that it did not mark."""
        rest = [Unmapped(f"$.{path}", _text(value), f"{self.target} has no setting "
                         "llmpar maps this to")
                for path, value in self.stated.items() if not self._covered(path)]
        return (*self.skipped, *rest)
