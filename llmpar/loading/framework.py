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
