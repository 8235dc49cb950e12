"""What the serving targets (vLLM, SGLang, TensorRT-LLM) share: the serving-spec check,
the settings that describe the workload rather than the engine, the arguments and notes
they write alike, and reading a server's command line back (`--flag value` words after
the launcher and the model)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import Argument
from llmpar.launch.flags import Words
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile
from llmpar.spec import Spec
from llmpar.spec.inference import Inference
from llmpar.strategy import Layout

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


def ships_draft_module(spec: Spec) -> bool:
    """Whether the model ships its own multi-token prediction modules (`[model]
    mtp_layers`), which the engines run as its draft (DeepSeek-V3, arXiv:2412.19437
    Sec. 2.2); any other model drafts with an EAGLE head (Li et al. 2024,
    arXiv:2401.15077)."""
    return spec.model.mtp_layers > 0


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


def start(spec: Spec, target: str, framework: str) -> tuple[Inference, Ledger, list[str]]:
    """What every serving launch starts from: the spec's `[inference]` (`serving_only`),
    a ledger with the workload's facts taken (`take_workload`) and no notes yet."""
    inference = serving_only(spec, target)
    ledger = Ledger(spec, framework)
    take_workload(ledger)
    return inference, ledger, []


def layout_degrees(layout: Layout) -> tuple[int, int, int, int]:
    """The tensor, pipeline, data and expert degrees of a serving layout."""
    tensor, pipeline, data = (layout.degree(n) for n in ("tensor", "pipeline", "data"))
    return tensor, pipeline, data, layout.degree("expert")


def cannot_split_context(spec: Spec, layout: Layout, ledger: Ledger, reason: str) -> None:
    """Mark context and sequence parallelism, where the spec has either, as not mapped
    (`reason`): no engine's context split is the training one llmpar models."""
    for name in ("context", "sequence"):
        if layout.degree(name) > 1 or name in spec.parallel:
            ledger.cannot(f"parallel.{name}", reason)


def format_arguments(spec: Spec, inference: Inference, dtypes: Mapping[str, str],
                     framework: str, ledger: Ledger, notes: list[str]) -> list[Argument]:
    """`--dtype` (the activations' format, by the engine's `dtypes`) and `--quantization
    fp8` for fp8 weights, as vLLM's and SGLang's parsers spell them; other quantized
    weights a note: `framework` reads their quantization from the checkpoint's config."""
    arguments: list[Argument] = []
    if spec.precision.activations in dtypes:
        arguments.append(("--dtype", dtypes[spec.precision.activations]))
    if inference.weights == "fp8":
        arguments.append(("--quantization", "fp8"))
    elif inference.weights not in dtypes:
        notes.append(f"{inference.weights} weights: {framework} reads the quantization from "
                     "the checkpoint's config (serve an AWQ/GPTQ, NVFP4 or MXFP4 "
                     "checkpoint)")
    ledger.take("inference.weights")
    return arguments


def engine_max_seqs(inference: Inference) -> int | None:
    """The engine profile's `max_num_seqs` (None without a profile)."""
    return inference.engine.max_num_seqs if inference.engine is not None else None


def take_speculative(ledger: Ledger, draft_layers: int, heads: str) -> None:
    """Mark the draft as written; a draft of other than one layer is not mapped: the
    engine's draft `heads` are the checkpoint's own."""
    ledger.take("inference.speculative")
    if draft_layers != 1:
        ledger.cannot("inference.speculative.draft_layers", f"{heads} are the checkpoint's "
                      "own", draft_layers)


def checkpoint_note(spec: Spec) -> str:
    """What `$MODEL` in a serving line stands for."""
    return (f"$MODEL is the checkpoint of {spec.model.name or 'the model'} (a Hugging Face "
            "repository or a path)")


def prefix_cache_note(inference: Inference, after: str = "") -> list[str]:
    """A note that the prefix cache's hit rate describes the requests (where it is above
    zero), `after` appended."""
    if inference.prefix_cache_hit_rate <= 0:
        return []
    return [f"the prefix cache's hit rate ({inference.prefix_cache_hit_rate:g}) is the "
            f"requests', not a setting{after}"]


def serve_line(target: str, version: str, command: str, about: str, ledger: Ledger,
               notes: list[str]) -> Launch:
    """The launch of a server started by one command line (`serve.sh`, `about` it)."""
    return Launch(target=target, framework_version=version,
                  files=(LaunchFile("serve.sh", f"#!/bin/sh\n{command}\n", about,
                                    in_command=True),),
                  command=command, unmapped=ledger.unmapped(), notes=tuple(notes))


def set_precision(settings: dict[str, Any], dtype: str | None) -> None:
    """The weights', activations' and compute's format from an engine's one dtype."""
    if dtype is not None:
        for key in ("weights", "activations", "compute"):
            settings[f"precision.{key}"] = dtype


def read_quantization(words: Words, settings: dict[str, Any]) -> None:
    """`inference.weights` from vLLM's or SGLang's `--quantization`: fp8, or int4 for
    AWQ and GPTQ (and their Marlin kernels); anything else a Problem."""
    quantization = words.text("--quantization")
    if quantization == "fp8":
        settings["inference.weights"] = "fp8"
    elif quantization in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        settings["inference.weights"] = "int4"
    elif quantization is not None:
        words.problems.append(Problem("$.--quantization", "llmpar reads fp8, awq, "
                                      f"awq_marlin, gptq or gptq_marlin, got {quantization!r}"))


def read_kv_cache(words: Words, settings: dict[str, Any], base: Spec | None,
                  dtype: str | None, choices: dict[str, str | None]) -> None:
    """`inference.kv_cache` from `--kv-cache-dtype` (read by the engine's `choices`;
    "auto", None, is the model's format: `kv_cache_format`)."""
    kv = words.choice("--kv-cache-dtype", choices)
    if "--kv-cache-dtype" in words.found:
        settings["inference.kv_cache"] = kv_cache_format(base, dtype, kv)
