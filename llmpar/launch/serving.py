"""What the serving targets (vLLM, SGLang) share: the serving-spec check, the settings
that describe the workload rather than the engine, and reading a server's command line
back (`--flag value` words after the launcher and the model)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.settings import Ledger
from llmpar.spec import Spec

WORKLOAD = ("inference.prompt_tokens", "inference.generated_tokens",
            "inference.concurrency", "inference.request_rate_per_s",
            "inference.prefix_cache_hit_rate", "inference.speculative.acceptance_rate",
            "inference.engine", "inference.runtime_overhead_bytes", "inference.weights_group_size",
            "inference.expert_weights", "model", "hardware.num_gpus", "hardware.gpus_per_node",
            "hardware.nvls", "precision", "optimizer", "parallel.expert.capacity_factor")
"""What a serving spec states about its requests (lengths, load, the prefix cache's hit
rate, the draft's acceptance), the checkpoint (its quantization groups, the experts'
format), the machine (NVLink SHARP, used by NCCL when present) and llmpar's accounting
(the engine profile's measured costs; the optimizer, which serving never steps): facts
for the plan that no server flag sets."""


def serving_only(spec: Spec, target: str) -> Any:
    """The spec's `[inference]`; a training spec is an error, not a serving launch."""
    if spec.inference is None:
        raise SpecError([Problem("$.inference", f"{target} serves models; this spec is a "
                                                "training run (it has no [inference])")],
                        spec.source)
    return spec.inference


def take_workload(ledger: Ledger) -> None:
    """Mark the workload's and the checkpoint's facts (`WORKLOAD`) as handled."""
    ledger.take(*WORKLOAD)


def server_words(text: str, source: str) -> dict[str, list[str]]:
    """A server's `--flag value` words as {flag: values}: a file of them or the whole
    command line (the launcher and the model before the first flag are skipped); `--flag=value`
    too."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise SpecError([Problem("$", f"cannot split the arguments: {exc}")], source) from None
    first = next((i for i, word in enumerate(words) if word.startswith("--")), len(words))
    found: dict[str, list[str]] = {}
    flag: str | None = None
    for word in words[first:]:
        if word.startswith("--"):
            flag, equals, value = word.partition("=")
            found[flag] = [value] if equals else []
        else:
            assert flag is not None
            found[flag].append(word)
    return found


@attrs.define
class Words:
    """Reads one server command line's flags, collecting every problem (each names its
    flag) instead of stopping at the first."""

    found: dict[str, list[str]]
    source: str
    problems: list[Problem] = attrs.field(factory=list)
    read: set[str] = attrs.field(factory=set)

    def switch(self, flag: str) -> bool:
        self.read.add(flag)
        if flag not in self.found:
            return False
        if self.found[flag]:
            self.problems.append(Problem(f"$.{flag}", f"is a switch and takes no value, got "
                                                      f"{' '.join(self.found[flag])!r}"))
        return True

    def text(self, flag: str) -> str | None:
        self.read.add(flag)
        values = self.found.get(flag)
        if values is None:
            return None
        if len(values) != 1:
            self.problems.append(Problem(f"$.{flag}", f"expected one value, got {values!r}"))
            return None
        return values[0]

    def integer(self, flag: str, least: int = 1) -> int | None:
        value = self.text(flag)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            self.problems.append(Problem(f"$.{flag}", f"expected an integer, got {value!r}"))
            return None
        if number < least:
            self.problems.append(Problem(f"$.{flag}", f"must be >= {least}, got {number}"))
            return None
        return number

    def fraction(self, flag: str) -> float | None:
        value = self.text(flag)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            self.problems.append(Problem(f"$.{flag}", f"expected a number, got {value!r}"))
            return None
        if not 0 < number <= 1:
            self.problems.append(Problem(f"$.{flag}", f"must be in (0, 1], got {number}"))
            return None
        return number

    def choice(self, flag: str, choices: Mapping[str, str | None]) -> str | None:
        value = self.text(flag)
        if value is not None and value not in choices:
            self.problems.append(Problem(f"$.{flag}", f"llmpar reads one of "
                                         f"{', '.join(choices)}, got {value!r}"))
            return None
        return None if value is None else choices[value]

    def ignored(self) -> tuple[str, ...]:
        """The flags given that llmpar does not model (a note, not an error)."""
        rest = sorted(set(self.found) - self.read)
        return (f"ignored: {', '.join(rest)} (not modelled)",) if rest else ()

    def done(self) -> None:
        if self.problems:
            raise SpecError(self.problems, self.source)


def set_degree(settings: dict[str, Any], base: Spec | None, name: str, degree: int) -> None:
    """The strategy's degree from the command line: its table's degree when above one;
    at one, the base's table is dropped (its options go with it) unless it is already off."""
    if degree > 1:
        settings[f"parallel.{name}.degree"] = degree
    elif base is not None and name in base.parallel:
        settings[f"parallel.{name}"] = None


def keep_filled_data(base: Spec | None, replicas: int, other_degrees: int) -> bool:
    """Whether the base's `data = -1` (fill the GPUs) already says `replicas`: it fills
    `num_gpus` / the other degrees, or each pool of a disaggregated spec."""
    if base is None or "data" not in base.parallel or base.parallel["data"].degree != -1:
        return False
    if base.inference is not None and base.inference.disaggregated is not None:
        return True
    return replicas * other_degrees == base.hardware.num_gpus
