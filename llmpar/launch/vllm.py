"""vLLM: the `vllm serve` command line for a serving spec, and reading one back.

Flags follow vLLM's own engine-argument parser (`AsyncEngineArgs.add_cli_args`,
vllm/engine/arg_utils.py, whose flags come from the fields of vllm/config/parallel.py,
cache.py, scheduler.py and model.py) of the version recorded in
`validation/data/launch/vllm.json`, against which the tests check every line written.
Layout (vllm/config/parallel.py): tensor x pipeline GPUs serve one engine replica, data
is the number of replicas; with --enable-expert-parallel the routed experts are split
over the tensor x data ranks (EP = TP x DP), the attention staying data-parallel.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from llmpar.errors import Problem
from llmpar.launch import serving
from llmpar.launch.common import Argument, command_line
from llmpar.launch.flags import Words
from llmpar.launch.target import Launch, ReadSettings
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "vLLM 0.33.0"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
KV_DTYPES = {"fp8": "fp8"}
"""vLLM's `--kv-cache-dtype` (CacheDType, vllm/config/cache.py); a cache in the model's own
format is "auto"."""
DISPATCHERS = {"deepep": "deepep_high_throughput"}
"""llmpar's expert dispatcher to vLLM's `--all2all-backend`; DeepEP's low-latency kernels
are vLLM's deepep_low_latency, for decode-only deployments."""


def _speculative_method(spec: Spec) -> str:
    """vLLM's method for a draft head: a model that ships its own multi-token prediction
    module (DeepSeek-V3, arXiv:2412.19437 Sec. 2.2) runs it as "mtp", any other an EAGLE
    head (Li et al. 2024, arXiv:2401.15077)."""
    return "mtp" if serving.ships_draft_module(spec) else "eagle"


@attrs.frozen
class VllmTarget:
    """The `vllm serve` command line."""

    name: str = "vllm"
    aliases: tuple[str, ...] = ("vllm-serve",)
    description: str = "the vllm serve command line of a serving spec"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        inference, ledger, notes = serving.start(spec, self.name, "vLLM")
        tensor, pipeline, data, expert = serving.layout_degrees(layout)
        arguments: list[Argument] = [("--tensor-parallel-size", str(tensor))]
        if pipeline > 1:
            arguments.append(("--pipeline-parallel-size", str(pipeline)))
        if data > 1:
            arguments.append(("--data-parallel-size", str(data)))
        ledger.take("parallel.tensor", "parallel.pipeline", "parallel.data")
        if expert > 1:
            if expert == tensor * data:
                arguments.append(("--enable-expert-parallel", None))
                ledger.take("parallel.expert.degree")
            else:
                ledger.cannot("parallel.expert.degree", f"vLLM splits the experts over "
                              f"tensor x data ranks ({tensor * data}), not {expert}", expert)
            dispatcher = spec.parallel["expert"].dispatcher
            if dispatcher in DISPATCHERS:
                arguments.append(("--all2all-backend", DISPATCHERS[dispatcher]))
            ledger.take("parallel.expert")
        elif "expert" in spec.parallel:
            ledger.take("parallel.expert")
        serving.cannot_split_context(spec, layout, ledger, "not mapped to vLLM's context "
                                     "parallelism (--decode-context-parallel-size splits "
                                     "only the decode cache)")
        activations = spec.precision.activations
        arguments += serving.format_arguments(spec, inference, DTYPES, "vLLM", ledger, notes)
        if inference.kv_cache == activations:
            arguments.append(("--kv-cache-dtype", "auto"))
        elif inference.kv_cache in KV_DTYPES:
            arguments.append(("--kv-cache-dtype", KV_DTYPES[inference.kv_cache]))
        ledger.cannot("inference.kv_cache", "vLLM keeps the cache in the model's format "
                      "or fp8", inference.kv_cache if inference.kv_cache != activations
                      and inference.kv_cache not in KV_DTYPES else None)
        arguments.append(("--max-model-len", str(inference.context_tokens)))
        if inference.continuous:
            seqs = serving.engine_max_seqs(inference)
            if seqs is not None:
                arguments.append(("--max-num-seqs", str(seqs)))
        else:
            arguments.append(("--max-num-seqs", str(inference.batch_size)))
        ledger.take("inference.batch_size")
        chunk = serving.engine_chunk_tokens(inference)
        if chunk is not None:
            arguments.append(("--max-num-batched-tokens", str(chunk)))
        else:  # every prompt of a step prefilled whole
            arguments.append(("--disable-chunked-prefill", None))
            arguments.append(("--max-num-batched-tokens", str(max(
                inference.batch_size * inference.prompt_tokens, inference.context_tokens))))
        ledger.take("inference.prefill_chunk_tokens")
        arguments.append(("--gpu-memory-utilization", f"{inference.memory_utilization:g}"))
        ledger.take("inference.memory_utilization")
        if inference.kv_block_tokens is not None:
            arguments.append(("--block-size", str(inference.kv_block_tokens)))
        else:
            notes.append("vLLM pages the cache in blocks (16 tokens unless --block-size); "
                         "the plan counts exactly the tokens held")
        ledger.take("inference.kv_block_tokens")
        if inference.prefix_cache_hit_rate > 0:
            arguments.append(("--enable-prefix-caching", None))
        if inference.sliding_window is False and spec.model.sliding_window is not None:
            arguments.append(("--disable-sliding-window", None))
        ledger.take("inference.sliding_window")
        if not inference.cuda_graphs:
            arguments.append(("--enforce-eager", None))
        ledger.take("inference.cuda_graphs")
        if inference.two_batch_overlap:
            arguments.append(("--enable-dbo", None))
        ledger.take("inference.two_batch_overlap")
        speculative = inference.speculative
        if speculative is not None:
            config = {"method": _speculative_method(spec),
                      "num_speculative_tokens": speculative.draft_tokens}
            arguments.append(("--speculative-config", json.dumps(config)))
            serving.take_speculative(ledger, speculative.draft_layers, "vLLM's EAGLE and MTP heads")
        ledger.cannot("inference.disaggregated", "two vLLM deployments (prefill and "
                      "decode) joined by a KV connector (--kv-transfer-config): this line "
                      "serves one pool's layout")
        hardware = spec.hardware
        if tensor * pipeline > hardware.gpus_per_node:
            notes.append("a replica spans nodes: start a Ray cluster over them first")
        elif data > 1 and hardware.num_nodes > 1:
            notes.append("data-parallel replicas on several nodes: add --data-parallel-size-"
                         "local, --data-parallel-address and --data-parallel-start-rank on "
                         "each node")
        notes.append(serving.checkpoint_note(spec))
        notes += serving.prefix_cache_note(inference)
        command = command_line('vllm serve "$MODEL"', arguments)
        return serving.serve_line(self.name, VERSION, command, "the vllm serve line", ledger, notes)

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_command(text, source, base)


def read_command(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from a `vllm serve` line (or its flags): the layout, the formats, the
    batch, the prefill chunk, the cache's blocks and the memory share; a malformed value is
    a Problem naming its flag, a flag llmpar does not model a note."""
    words = Words(serving.server_words(text, source), source)
    settings: dict[str, Any] = {}
    tensor = words.integer("--tensor-parallel-size") or 1
    pipeline = words.integer("--pipeline-parallel-size") or 1
    data = words.integer("--data-parallel-size") or 1
    serving.set_degree(settings, base, "tensor", tensor)
    serving.set_degree(settings, base, "pipeline", pipeline)
    if not serving.keep_filled_data(base, data, tensor * pipeline):
        serving.set_degree(settings, base, "data", data)
    if words.switch("--enable-expert-parallel"):
        settings["parallel.expert.degree"] = tensor * data
        backend = words.choice("--all2all-backend", {
            **{v: k for k, v in DISPATCHERS.items()}, "deepep_low_latency": "deepep"})
        if backend is not None:
            settings["parallel.expert.dispatcher"] = backend
    elif base is not None and "expert" in base.parallel:
        settings["parallel.expert"] = None
    dtype = words.choice("--dtype", {v: k for k, v in DTYPES.items()})
    serving.set_precision(settings, dtype)
    serving.read_quantization(words, settings)
    serving.read_kv_cache(words, settings, base, dtype, {
        "auto": None, "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bfloat16": "bf16",
        "float16": "fp16"})
    words.integer("--max-model-len")  # the requests' lengths are the workload's
    seqs = words.integer("--max-num-seqs")
    if seqs is not None and not serving.is_continuous(base):
        settings["inference.batch_size"] = seqs
    tokens = words.integer("--max-num-batched-tokens")
    if words.switch("--disable-chunked-prefill"):
        settings["inference.prefill_chunk_tokens"] = None
    elif tokens is not None:
        settings["inference.prefill_chunk_tokens"] = serving.prefill_chunk_setting(base, tokens)
    memory = words.fraction("--gpu-memory-utilization")
    if memory is not None:
        settings["inference.memory_utilization"] = memory
    block = words.integer("--block-size")
    if block is not None:
        settings["inference.kv_block_tokens"] = block
    if words.switch("--enforce-eager"):
        settings["inference.cuda_graphs"] = False
    settings["inference.two_batch_overlap"] = words.switch("--enable-dbo") or None
    if words.switch("--disable-sliding-window"):
        settings["inference.sliding_window"] = False
    words.switch("--enable-prefix-caching")
    speculative = words.text("--speculative-config")
    if speculative is not None:
        _read_speculative(speculative, words, settings)
    words.done()
    return ReadSettings(settings=settings, notes=words.ignored())


def _read_speculative(text: str, words: Words, settings: dict[str, Any]) -> None:
    try:
        config = json.loads(text)
        tokens = config["num_speculative_tokens"]
    except (json.JSONDecodeError, TypeError, KeyError):
        words.problems.append(Problem("$.--speculative-config", "expected JSON with "
                                      f"num_speculative_tokens, got {text!r}"))
        return
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        words.problems.append(Problem("$.--speculative-config.num_speculative_tokens",
                                      f"expected an integer >= 1, got {tokens!r}"))
        return
    settings["inference.speculative.draft_tokens"] = tokens
