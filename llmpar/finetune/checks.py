"""Checks of `[finetune]` against the model: every named group, layer and module exists."""

from __future__ import annotations

from llmpar.errors import Problem, did_you_mean
from llmpar.finetune.targets import known_targets
from llmpar.footprint.parameters import parameter_groups
from llmpar.spec import Spec
from llmpar.spec.finetune import ADAPTER_METHODS, LAYER_RANGE, MODULE_ALIASES


def _range_problems(entry: str, layers: int) -> list[Problem]:
    match = LAYER_RANGE.match(entry)
    if match is None:
        return []
    start = int(match.group(1)) if match.group(1) else 0
    stop = int(match.group(2)) if match.group(2) else layers
    if stop > layers or start >= stop:
        return [Problem("$.finetune.frozen", f"{entry!r} must name blocks a < b <= num_layers "
                        f"({layers}), got a = {start}, b = {stop}")]
    return []


def finetune_problems(spec: Spec) -> list[Problem]:
    """What `[finetune]` names must exist in `spec`'s model."""
    finetune = spec.finetune
    if finetune is None:
        return []
    method, model = finetune.method, spec.model
    problems = []
    if method == "full" and finetune.frozen:
        problems.append(Problem("$.finetune.frozen", 'method = "full" trains every parameter; '
                                'write method = "frozen" to keep some fixed'))
    if method == "frozen" and not finetune.frozen:
        problems.append(Problem("$.finetune.frozen", 'method = "frozen" needs the groups or '
                                'layer ranges to keep fixed, e.g. ["embedding", "layers[0:8]"]'))
    if method in ADAPTER_METHODS and finetune.frozen:
        problems.append(Problem("$.finetune.frozen", f"method = {method!r} keeps the whole base "
                                "model fixed already; `frozen` is for method = \"frozen\""))
    if finetune.modules_to_save and method not in ADAPTER_METHODS:
        problems.append(Problem("$.finetune.modules_to_save", "trains copies beside adapters: "
                                f"only with method = {' / '.join(ADAPTER_METHODS)}"))
    if method == "full" or problems:
        return problems
    if not model.has_architecture or model.num_layers is None:
        return [Problem("$.finetune.method", f"method = {method!r} needs the model's "
                        "architecture (layers, widths, heads), not only its parameter count")]
    groups = parameter_groups(model)
    present = {g for g, count in groups.items() if count}
    for entry in finetune.frozen:
        if LAYER_RANGE.match(entry):
            problems += _range_problems(entry, model.num_layers)
        elif entry not in present:
            problems.append(Problem("$.finetune.frozen", f"{model.name} has no {entry!r} "
                                    f"parameters; it has {', '.join(sorted(present))}"))
    for entry in finetune.modules_to_save:
        group = MODULE_ALIASES.get(entry, entry)
        if group not in present:
            problems.append(Problem("$.finetune.modules_to_save", f"{model.name} has no "
                                    f"{entry!r} parameters (tied embeddings have no separate "
                                    "output layer)"))
    if finetune.adapters:
        known = known_targets(model)
        for entry in () if finetune.all_linear else finetune.targets:
            if entry not in known:
                problems.append(Problem("$.finetune.target_modules", f"{model.name}'s blocks "
                                        f"have no {entry!r}; they have "
                                        f"{', '.join(sorted(known))}"
                                        f"{did_you_mean(entry, known)}"))
    return problems
