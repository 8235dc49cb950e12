"""A model table as TOML, the format of `specs/models/*.toml`."""

from __future__ import annotations

from typing import Any

from llmpar.loading.dump import toml_text


def model_toml(table: dict[str, Any]) -> str:
    """TOML that `[model]` (or a preset file) reads back to the same table."""
    return toml_text(table)
