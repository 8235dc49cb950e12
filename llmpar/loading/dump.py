"""From a Spec (or a Plan) back to plain data and TOML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cattrs
import tomli_w

from llmpar.placement import ORDER_KEY, RANK_ORDER, Axis, order_text
from llmpar.spec import Spec


def plain_converter() -> cattrs.Converter:
    """Unstructures attrs objects into dicts, lists and scalars."""
    return cattrs.Converter()


def _plain(value: Any, drop_none: bool) -> Any:
    if isinstance(value, dict):
        return {
            key: _plain(item, drop_none)
            for key, item in value.items()
            if not (drop_none and item is None)
        }
    if isinstance(value, (list, tuple)):
        return [_plain(item, drop_none) for item in value]
    return value


def spec_to_dict(spec: Spec, axes: Mapping[str, Axis] | None = None) -> dict[str, Any]:
    """The spec as a fully resolved table (no preset references, no None). `[parallel]
    order` is written in the axes' tokens when `axes` are given, else in strategy names
    (the loader reads both)."""
    converter = plain_converter()
    table = converter.unstructure(spec)
    table.pop("source", None)
    if spec.inference is not None:
        table.pop("training", None)  # a spec is either [training] or [inference]
    table["parallel"] = {
        name: converter.unstructure(config, unstructure_as=type(config))
        for name, config in spec.parallel.items()
    }
    table.pop("workload", None)
    if spec.workload:
        table["workload"] = {name: converter.unstructure(entry.config,
                                                         unstructure_as=type(entry.config))
                             for name, entry in spec.workload.items()}
    table.pop("rank_order", None)
    if spec.rank_order != RANK_ORDER:
        named = axes is not None and all(name in axes for name in spec.rank_order)
        table["parallel"][ORDER_KEY] = (order_text(spec.rank_order, axes) if named and axes
                                        else "-".join(spec.rank_order))
    plain: dict[str, Any] = _plain(table, drop_none=True)
    return plain


def toml_text(table: Mapping[str, Any]) -> str:
    """`table` as TOML text, the one writer of every TOML llmpar prints or saves (specs,
    presets, calibrated GPUs, imported models). None values are left out (TOML has no
    null), at any depth, and in arrays too; tuples are arrays. Written with tomli-w, which
    `tomllib` reads back to an equal table: floats exactly (0.1 + 0.2 stays
    0.30000000000000004), nested arrays of tables, and control characters escaped."""
    return tomli_w.dumps(_toml_ready(table))


def _toml_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _toml_ready(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [_toml_ready(item) for item in value if item is not None]
    return value


def dump_spec(spec: Spec, axes: Mapping[str, Axis] | None = None) -> str:
    """The spec as TOML that `llmpar.load_spec` reads back to an equal Spec."""
    return toml_text(spec_to_dict(spec, axes))
