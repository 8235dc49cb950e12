"""Named presets: TOML files under `specs/<kind>/<name>.toml`, from llmpar and plugins."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from llmpar.errors import did_you_mean
from llmpar.loading.limits import plain_table, read_text
from llmpar.loading.reader import parse_toml

PRESET_KINDS = ("models", "gpus", "clusters", "optimizers", "frameworks", "examples",
                "engines")
ALIASED_KINDS = ("models", "gpus", "clusters", "optimizers", "frameworks", "engines")
"""Kinds whose presets a short name may reach (see `alias_candidates`); an example spec is
named in full, as a misspelt file name must not run some other spec."""
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


SHOWN_CANDIDATES = 8
"""Candidates an ambiguous short name's message lists at most."""


def _plain(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _boundaries(name: str) -> set[int]:
    """Lengths of the plain prefixes of `name` that a separator follows ("h100-sxm": 4)."""
    ends, count = set(), 0
    for ch in name:
        if ch.isalnum():
            count += 1
        else:
            ends.add(count)
    return ends


def alias_candidates(name: str, names: Iterable[str], variants: bool = False) -> list[str]:
    """The presets among `names` that the short name `name` stands for, sorted.

    Case and separators ('-', '.', '_') do not count ("Llama3.1-70B" is llama-3.1-70b); a
    name also stands for every preset it begins up to a separator ("h100" for h100-sxm and
    h100-pcie, "qwen3-30b" for qwen3-30b-a3b, never "h10" for h100-sxm). A name that spells
    a preset in full stands for that one only. With `variants` (framework profiles, whose
    variants are the same stack: megatron-core-legacy, llmpar calibrate's "-calibrated"), a
    name whose presets are one preset and names that begin with it up to a separator stands
    for that preset ("megatron" for megatron-core).
    """
    key = _plain(name)
    if len(key) < 2:
        return []
    same = sorted(other for other in names if _plain(other) == key)
    if same:
        return same
    found = sorted(other for other in names
                   if _plain(other).startswith(key) and len(key) in _boundaries(other))
    base = min(found, key=len, default=None)
    if variants and base is not None and len(found) > 1 and all(
            _plain(other).startswith(_plain(base)) and len(_plain(base)) in _boundaries(other)
            for other in found if other != base):
        return [base]
    return found


@attrs.frozen
class PresetNotFound(Exception):
    """No preset of `kind` is called `name`; `known` lists those that exist and
    `candidates` the presets the name could stand for (two or more: ambiguous)."""

    kind: str
    name: str
    known: tuple[str, ...]
    candidates: tuple[str, ...] = ()

    def message(self) -> str:
        """What a SpecError says: the candidates of an ambiguous short name, else the
        nearest names."""
        what = f"no {self.kind[:-1]} preset named {self.name!r}"
        if self.candidates:
            listing = f"llmpar presets {self.kind}"
            return f"{what}: {candidates_message(self.name, self.candidates, listing)}"
        return f"{what}{did_you_mean(self.name, self.known)}"


def candidates_message(name: str, candidates: Iterable[str], listing: str) -> str:
    """"a short name of N presets; give one (did you mean 'x' or 'y'?)", the candidates
    ranked as did-you-mean ranks names that start with the word: nearest in length first."""
    key = len(_plain(name))
    ranked = sorted(candidates, key=lambda other: (abs(len(_plain(other)) - key), other))
    shown = ranked[:SHOWN_CANDIDATES]
    listed = " or ".join(repr(other) for other in shown)
    more = len(ranked) - len(shown)
    if more:
        listed += f" or {more} more (`{listing}`)"
    return f"a short name of {len(ranked)} presets; give one (did you mean {listed}?)"


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
        """The file of preset `name`, or of the one preset a short name stands for
        (`alias_candidates`; models, GPUs, clusters and optimizers); raises PresetNotFound,
        with the candidates when the short name stands for several."""
        if not is_preset_name(name):
            raise PresetNotFound(kind, name, tuple(self.names(kind)))
        found = self._file(kind, name)
        if found is not None:
            return found
        known = tuple(self.names(kind))
        candidates = (tuple(alias_candidates(name, known, variants=kind == "frameworks"))
                      if kind in ALIASED_KINDS else ())
        if len(candidates) == 1:
            found = self._file(kind, candidates[0])
            if found is not None:
                return found
        raise PresetNotFound(kind, name, known, candidates)

    def _file(self, kind: str, name: str) -> Path | None:
        for folder in self.folders:
            candidate = folder / kind / f"{name}.toml"
            if candidate.is_file():
                return candidate
        return None

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
            table.setdefault("name", path.stem)  # a short name reads as the preset's own
        return table

    def find(self, name: str) -> list[tuple[str, Path]]:
        """Every (kind, path) of presets called `name` (or that it alone stands for),
        across kinds."""
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
