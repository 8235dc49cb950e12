"""Reading a Hugging Face config.json and its values, with errors that name the key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.loading.limits import MAX_LAYERS, load_json, plain_table, read_text

HfSource = str | PathLike[str] | Mapping[str, Any]
"""A path to a config.json, or its contents as a mapping."""


COUNTS: dict[str, int | None] = {"num_hidden_layers": MAX_LAYERS, **dict.fromkeys((
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "interleave_moe_layer_step", "no_rope_layer_interval", "full_attention_interval",
    "sliding_window_pattern", "mamba_n_heads", "mamba_expand"), None)}
"""Values the importer divides by or counts layers with: at least 1 (and at most this,
where one is given), or a SpecError naming the key."""


@attrs.frozen(kw_only=True)
class HfConfig:
    """The values of one config.json (or of its `text_config`), and where they came from."""

    values: Mapping[str, Any]
    model_type: str
    label: str | None = None
    """The file, for error messages; None for a mapping."""
    prefix: str = "$"
    """Key path of `values` inside the file ("$.text_config" for a nested config)."""
    repo: str | None = None
    """The Hugging Face repository it was published in, when the file says."""

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}"

    def error(self, key: str, message: str) -> SpecError:
        """A SpecError at `key` that names the model_type."""
        return SpecError([Problem(self.path(key), f"{message} (model_type {self.model_type!r})")],
                         self.label)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key`; `default` when it is missing or null."""
        value = self.values.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None) -> int | None:
        """An integer value; a SpecError naming `key` for anything else."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {value!r}")
        if key in COUNTS:
            most = COUNTS[key]
            if value < 1 or (most is not None and value > most):
                limit = "" if most is None else f" and at most {most:,}"
                raise self.error(key, f"expected an integer of at least 1{limit}, "
                                      f"got {value!r}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        """A boolean value; a SpecError naming `key` for anything else."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def nested(self, key: str, model_type: str) -> HfConfig:
        """The sub-config under `key` (a multimodal model's `text_config`)."""
        values = self.values.get(key)
        if not isinstance(values, Mapping):
            raise self.error(key, "required: a table with the language model's config")
        return attrs.evolve(self, values=values, model_type=model_type,
                            prefix=self.path(key))


def missing_problems(config: HfConfig, required: Iterable[str]) -> list[Problem]:
    """A problem for every required key that is missing, null or not an integer; "a|b"
    requires either (a key that transformers renamed: the first present is checked)."""
    problems = []
    for names in required:
        first, *others = names.split("|")
        key = next((name for name in (first, *others) if config.values.get(name) is not None),
                   first)
        value = config.values.get(key)
        if value is None:
            also = "".join(f" (or {other})" for other in others)
            message = f"required for model_type {config.model_type!r}{also}"
        elif isinstance(value, bool) or not isinstance(value, int):
            message = f"expected an integer, got {value!r} (model_type {config.model_type!r})"
        else:
            continue
        problems.append(Problem(config.path(key), message))
    return problems


def _repo(values: Mapping[str, Any]) -> str | None:
    for key in ("_source", "_name_or_path"):
        value = values.get(key)
        if isinstance(value, str) and value and not value.startswith(("/", ".")):
            return value
    return None


def read_config(source: HfSource) -> HfConfig:
    """The config of `source`; unreadable files, bad JSON and a missing model_type are
    SpecErrors."""
    label = None
    if isinstance(source, Mapping):
        values: Any = dict(source)
    else:
        label = str(source)
        values = _load_json(Path(source), label)
    if not isinstance(values, Mapping):
        raise SpecError([Problem("$", f"expected a JSON object, got {type(values).__name__}")],
                        label)
    model_type = values.get("model_type")
    if not isinstance(model_type, str):
        raise SpecError([Problem("$.model_type", "required: the Hugging Face model_type, "
                                 f"a string; got {model_type!r}")], label)
    return HfConfig(values=values, model_type=model_type, label=label, repo=_repo(values))


def _load_json(path: Path, label: str) -> Any:
    """The JSON of a config file, within llmpar's limits on size and nesting."""
    values = load_json(read_text(path, label), label)
    return plain_table(values, label) if isinstance(values, Mapping) else values
