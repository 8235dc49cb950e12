"""`[training] framework`: a framework profile by name or table, and the defaults it sets
for the strategies' tables."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs

from llmpar.errors import Problem, did_you_mean
from llmpar.footprint.activations import ACTIVATION_MODELS
from llmpar.spec import Spec
from llmpar.spec.framework import Framework, profile_gpu

FRAMEWORK_PATH = "$.training.framework"
PROFILE_EFFICIENCIES = ("matmul_efficiency", "fp8_matmul_efficiency")
"""The GPU's efficiencies a profile can state by GPU (`Framework.matmul_efficiency`)."""
PARALLEL_DEFAULTS = (("reshard_after_forward", "data", "reshard_after_forward"),
                     ("tensor_overlap_backward", "tensor", "overlap_backward"),
                     ("tensor_overlap_backward", "sequence", "overlap_backward"),
                     ("tensor_overlap_kernels", "sequence", "overlap_kernels"))
"""(profile field, strategy, that strategy's config field) a profile sets by default."""


def activation_model_problems(table: Mapping[str, Any],
                              names: Collection[str] | None) -> list[Problem]:
    """A profile's `activation_model` must name a model the session has."""
    framework = table.get("framework")
    name = framework.get("activation_model") if isinstance(framework, Mapping) else None
    known = ACTIVATION_MODELS if names is None else names
    if not isinstance(name, str) or name in known:
        return []
    listed = ", ".join(repr(n) for n in known)
    return [Problem(f"{FRAMEWORK_PATH}.activation_model",
                    f"must be one of {listed}, got {name!r}{did_you_mean(name, known)}")]


def profile_config(framework: Framework | None, strategy: str, config: Any,
                   given: Collection[str] = ()) -> Any:
    """`config` of `strategy` with the profile's defaults for the keys not in `given` (the
    keys a spec's `[parallel.<name>]` table states); `reshard_after_forward` only under
    ZeRO-3 / FSDP, where it means something."""
    if framework is None or not attrs.has(type(config)):
        return config
    changes = {}
    for field, owner, key in PARALLEL_DEFAULTS:
        value = getattr(framework, field)
        if owner != strategy or value is None or key in given:
            continue
        if key == "reshard_after_forward" and getattr(config, "stage", 3) != 3:
            continue
        if key in attrs.fields_dict(type(config)):
            changes[key] = value
    return attrs.evolve(config, **changes) if changes else config


def with_framework_defaults(framework: Framework | None, raw: Mapping[str, Any],
                            configs: dict[str, Any]) -> dict[str, Any]:
    """The strategies' configs with the profile's defaults where the spec's own
    `[parallel.<name>]` table leaves the key out (`profile_config`)."""
    if framework is None:
        return configs
    found = {}
    for name, config in configs.items():
        given = raw.get(name) if isinstance(raw, Mapping) else None
        found[name] = profile_config(framework, name, config,
                                     tuple(given) if isinstance(given, Mapping) else ())
    return found


def with_profile_efficiencies(spec: Spec) -> Spec:
    """`spec` with its GPU at the matrix efficiencies its framework profile was calibrated
    with, where the profile names the GPU (`Framework.matmul_efficiency`); the same object
    otherwise. Applied wherever a spec is checked, so the time model reads one GPU."""
    training = spec.training
    if training is None or training.framework is None:
        return spec
    gpu = profile_gpu(training.framework, spec.hardware.gpu)
    if gpu is spec.hardware.gpu:
        return spec
    return attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu=gpu))


def stated_efficiencies(hardware: Any) -> frozenset[str]:
    """The efficiencies (`PROFILE_EFFICIENCIES`) a spec's own `[hardware.gpu]` table states
    (inline, or set with `--set hardware.gpu.matmul_efficiency=...`), as against the ones
    its GPU preset states."""
    gpu = hardware.get("gpu") if isinstance(hardware, Mapping) else None
    if not isinstance(gpu, Mapping):
        return frozenset()
    return frozenset(key for key in PROFILE_EFFICIENCIES if key in gpu)


def without_stated_entries(training: Any, gpu: str, stated: Collection[str]) -> Any:
    """`training` with its profile's entries for `gpu` dropped from the tables of the
    efficiencies the spec states itself (`stated_efficiencies`): a value the user states
    wins over the profile's table, which wins over the GPU preset's. The spec then carries
    the profile as it applies, so checking it again (a Spec object) keeps the user's value;
    the same object where nothing is dropped."""
    framework = getattr(training, "framework", None)
    if framework is None or not stated:
        return training
    changes = {key: {name: value for name, value in getattr(framework, key).items()
                     if name != gpu}
               for key in stated if gpu in getattr(framework, key)}
    if not changes:
        return training
    return attrs.evolve(training, framework=attrs.evolve(framework, **changes))
