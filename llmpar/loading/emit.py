"""A spec as the table a user would have written: presets by name, and only what differs.

`spec_to_dict` spells out every field a preset filled in, so a spec written from it keeps
the old GPU's numbers when a later `--set hardware.cluster=dgx-b200` renames the cluster:
its own `[hardware]` keys win over the new preset's. `emitted_table` instead names the
model, cluster (or GPU), optimizer, framework profile and serving engine presets the spec
was made of, and keeps beside each name only the fields that differ from that preset, as
an override of the preset would; `[parallel]` keys a framework profile set by default are
left to the profile. Loading the table gives back an equal Spec, which is checked: a spec
that the names cannot reproduce (a model table that happens to carry a preset's name, a
field a preset sets and the spec clears) is written fully resolved instead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from llmpar.errors import SpecError
from llmpar.loading.framework import PARALLEL_DEFAULTS
from llmpar.loading.presets import PresetCatalog, PresetNotFound
from llmpar.spec import Spec

Loader = Callable[[dict[str, Any]], Spec]
"""Structures and checks a spec table (a session's `load_spec`)."""

_USABLE = ("usable_memory_bytes", "usable_memory_source")
"""A GPU's reported memory: dropped by the loader when `memory_bytes` is given alone."""


def _preset(catalog: PresetCatalog, kind: str, name: Any) -> dict[str, Any] | None:
    """The preset `name` of `kind` as its file holds it, or None."""
    if not isinstance(name, str):
        return None
    try:
        return catalog.read(kind, name)
    except (PresetNotFound, SpecError):
        return None


def _differences(given: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any] | None:
    """The keys of `given` whose values `base` does not have; None when `base` has a key
    `given` lacks (a preset's value the spec cleared, which no override can write)."""
    if set(base) - set(given):
        return None
    return {key: value for key, value in given.items() if base.get(key) != value}


def _gpu_differences(given: Mapping[str, Any], base: Mapping[str, Any]
                     ) -> dict[str, Any] | None:
    """A GPU's differences; a `memory_bytes` of its own carries its reported memory, or
    none, as the loader reads a `memory_bytes` given alone without the preset's."""
    if given.get("memory_bytes") == base.get("memory_bytes"):
        return _differences(given, base)
    own = given.get("usable_memory_bytes") is not None
    changed = _differences({k: v for k, v in given.items() if own or k not in _USABLE},
                           {k: v for k, v in base.items() if k not in _USABLE})
    if changed is not None and own:
        changed.update({k: given[k] for k in _USABLE if k in given})
    return changed


def _named(table: dict[str, Any], catalog: PresetCatalog) -> dict[str, Any]:
    """`table` (a fully resolved spec table) with its presets named, nothing overridden."""
    named = copy.deepcopy(table)
    if _preset(catalog, "models", table["model"].get("name")) is not None:
        named["model"] = table["model"]["name"]
    if _preset(catalog, "optimizers", table["optimizer"].get("name")) is not None:
        named["optimizer"] = table["optimizer"]["name"]
    hardware, gpu = table["hardware"], table["hardware"]["gpu"].get("name")
    cluster = _preset(catalog, "clusters", hardware.get("cluster"))
    if cluster is not None:
        named["hardware"] = {"cluster": hardware["cluster"], "num_gpus": hardware["num_gpus"]}
        if cluster.get("gpu") != gpu and _preset(catalog, "gpus", gpu) is not None:
            named["hardware"]["gpu"] = gpu
    elif _preset(catalog, "gpus", gpu) is not None:
        named["hardware"] = {"gpu": gpu, "num_gpus": hardware["num_gpus"]}
    for section, key, kind in (("training", "framework", "frameworks"),
                               ("inference", "engine", "engines")):
        part = named.get(section, {}).get(key)
        if isinstance(part, Mapping) and _preset(catalog, kind, part.get("name")) is not None:
            named[section][key] = part["name"]
    return named


def _overridden(full: dict[str, Any], named: dict[str, Any], base: dict[str, Any]
                ) -> dict[str, Any] | None:
    """`named` with, beside each preset name, the fields of `full` that differ from what
    the names alone load to (`base`); None where a difference cannot be written."""
    out = copy.deepcopy(named)
    for section in ("model", "optimizer"):
        if isinstance(named[section], str):
            changed = _differences(full[section], base[section])
            if changed is None:
                return None
            if changed:
                out[section] = {"preset": named[section], **changed}
    hardware = named["hardware"]
    if "num_gpus" in hardware and len(hardware) <= 3:  # named: cluster and/or gpu
        given = {k: v for k, v in full["hardware"].items() if k != "gpu"}
        changed = _differences(given, {k: v for k, v in base["hardware"].items()
                                       if k != "gpu"})
        gpu = _gpu_differences(full["hardware"]["gpu"], base["hardware"]["gpu"])
        if changed is None or gpu is None:
            return None
        out["hardware"] = {**hardware, **changed}
        if gpu:
            name = hardware.get("gpu")
            out["hardware"]["gpu"] = {"preset": name, **gpu} if name else gpu
    for section, key in (("training", "framework"), ("inference", "engine")):
        name = named.get(section, {}).get(key)
        if isinstance(name, str):
            changed = _differences(full[section][key], base[section][key])
            if changed is None:
                return None
            if changed:
                out[section][key] = {"preset": name, **changed}
    return out


def _without_profile_defaults(table: dict[str, Any], spec: Spec) -> dict[str, Any]:
    """`[parallel]` keys that hold what the framework profile sets by default, left out
    so that the profile (or another, set later) sets them."""
    if spec.training is None or spec.inference is not None:
        return table
    framework = spec.training.profile
    out = copy.deepcopy(table)
    for field, owner, key in PARALLEL_DEFAULTS:
        config = out.get("parallel", {}).get(owner)
        value = getattr(framework, field)
        if isinstance(config, dict) and value is not None and config.get(key) == value:
            del config[key]
    return out


def emitted_table(spec: Spec, full: dict[str, Any], catalog: PresetCatalog,
                  load: Loader) -> dict[str, Any]:
    """The table to write for `spec`: presets by name with only the fields that differ
    from them, when it loads back to an equal Spec; else `full` (`spec_to_dict(spec)`)."""
    named = _named(full, catalog)
    try:
        base = load(named)
    except SpecError:
        return full
    from llmpar.loading.dump import spec_to_dict

    table = _overridden(full, named, spec_to_dict(base))
    if table is None:
        return full
    for candidate in (_without_profile_defaults(table, spec), table):
        try:
            if load(copy.deepcopy(candidate)) == spec:
                return candidate
        except SpecError:
            continue
    return full

