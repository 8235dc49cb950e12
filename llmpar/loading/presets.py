"""Named presets: TOML files under `specs/<kind>/<name>.toml`, from llmpar and plugins."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from llmpar.loading.limits import plain_table, read_text
from llmpar.loading.reader import parse_toml

PRESET_KINDS = ("models", "gpus", "clusters", "optimizers", "frameworks", "examples",
                "engines")
PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
"""What a preset name looks like: a file stem inside a preset folder, never a path (no
`/`, no leading `.`), so that a name cannot reach a file outside the folders."""


def is_preset_name(name: str) -> bool:
    """Whether `name` can name a preset (see PRESET_NAME)."""
    return PRESET_NAME.fullmatch(name) is not None and ".." not in name


def builtin_specs_dir() -> Path:
    """llmpar's own presets: inside the installed package, or the source tree's `specs/`."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "_specs"
    return installed if installed.is_dir() else package.parent / "specs"


@attrs.frozen
class PresetNotFound(Exception):
    """No preset of `kind` is called `name`; `known` lists those that exist."""

    kind: str
    name: str
    known: tuple[str, ...]


@attrs.frozen
class PresetCatalog:
    """Preset folders in order; the first folder that has a name wins."""

    folders: tuple[Path, ...]
    _parsed: dict[tuple[Path, int, int], dict[str, Any]] = attrs.field(
        factory=dict, eq=False, repr=False)
    """Tables already parsed, by file, modification time and size (a preset edited while
    a session runs is read again); the catalogue's own, as a session owns its catalogue."""

    def names(self, kind: str) -> list[str]:
        """Every preset name of `kind` ("models", "gpus", ...), sorted."""
        found = {path.stem for folder in self.folders for path in (folder / kind).glob("*.toml")}
        return sorted(found)

    def path(self, kind: str, name: str) -> Path:
        """The file of preset `name`; raises PresetNotFound."""
        if not is_preset_name(name):
            raise PresetNotFound(kind, name, tuple(self.names(kind)))
        for folder in self.folders:
            candidate = folder / kind / f"{name}.toml"
            if candidate.is_file():
                return candidate
        raise PresetNotFound(kind, name, tuple(self.names(kind)))

    def read(self, kind: str, name: str) -> dict[str, Any]:
        """The preset's table, with its `name` filled in from the file name."""
        path = self.path(kind, name)
        try:
            status = path.stat()
            key = (path, status.st_mtime_ns, status.st_size)
        except OSError:  # reported by read_text below
            key = None
        table = self._parsed.get(key) if key is not None else None
        if table is None:
            table = parse_toml(read_text(path, str(path)), str(path))
            if key is not None:
                self._parsed[key] = table
        table = plain_table(table, str(path))  # a copy: callers change what they get
        if kind != "examples":
            table.setdefault("name", name)
        return table

    def find(self, name: str) -> list[tuple[str, Path]]:
        """Every (kind, path) of presets called `name`, across kinds."""
        hits = []
        for kind in PRESET_KINDS:
            try:
                hits.append((kind, self.path(kind, name)))
            except PresetNotFound:
                continue
        return hits


def catalog_of(folders: Iterable[Path]) -> PresetCatalog:
    """A catalogue of existing folders, duplicates removed, order kept."""
    seen: list[Path] = []
    for folder in folders:
        folder = Path(folder)
        if folder.is_dir() and folder not in seen:
            seen.append(folder)
    return PresetCatalog(tuple(seen))
