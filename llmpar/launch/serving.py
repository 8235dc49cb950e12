"""What the serving targets (vLLM, SGLang) share: the serving-spec check, the settings
that describe the workload rather than the engine, and reading a server's command line
back (`--flag value` words after the launcher and the model)."""

from __future__ import annotations

import shlex
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.launch.settings import Ledger
from llmpar.spec import Spec
from llmpar.spec.inference import Inference

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


def is_continuous(base: Spec | None) -> bool:
    """Whether the base serves continuously (its batch is the engine's, not a setting)."""
    return base is not None and base.inference is not None and base.inference.continuous


def kv_cache_format(base: Spec | None, dtype: str | None, kv: str | None) -> str:
    """The KV cache's format from an engine's cache dtype option: `kv`, or for "auto"
    (None) the model's: the engine's `dtype`, else the base's activations (bf16)."""
    return kv or dtype or (base.precision.activations if base is not None else "bf16")


def engine_chunk_tokens(inference: Inference) -> int | None:
    """The prefill chunk an engine's command line states: `prefill_chunk_tokens`, or under
    continuous batching the engine profile's `max_num_batched_tokens`; None: whole prompts."""
    chunk = inference.prefill_chunk_tokens
    if chunk is None and inference.continuous and inference.engine is not None:
        chunk = inference.engine.max_num_batched_tokens
    return chunk


def prefill_chunk_setting(base: Spec | None, tokens: int) -> int | None:
    """`inference.prefill_chunk_tokens` for an engine's chunk of `tokens`: None (the engine
    profile's own, which a continuous plan takes) where a continuous base's engine states
    that size, else `tokens`."""
    engine = base.inference.engine if base is not None and base.inference else None
    default = engine.max_num_batched_tokens if engine is not None else None
    return None if is_continuous(base) and tokens == default else tokens
