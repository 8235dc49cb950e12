"""TensorRT-LLM: the `trtllm-serve` command line and its `--extra_llm_api_options` YAML
for a serving spec, and either read back.

Options follow `trtllm-serve serve`'s click options (tensorrt_llm/commands/serve.py) and
the YAML's keys the LLM-API arguments of the PyTorch backend (`TorchLlmArgs`,
`KvCacheConfig` and the decoding configs of tensorrt_llm/llmapi/llm_args.py), which
override the command line's (serve.py: `update_llm_args_with_extra_dict`), at the commits
recorded in `validation/data/launch/trt-llm.json`, against which the tests check every
option and key written. Layout (llm_args.py `_ParallelConfig`): tensor_parallel_size GPUs
(x pipeline_parallel_size) serve one engine; with enable_attention_dp every one of them
runs the attention on its own requests (attention data-parallel), the routed experts
split moe_expert_parallel_size ways and each expert moe_tensor_parallel_size ways
(their product the tensor size). trtllm-serve runs one engine: data-parallel replicas of
a dense model are separate servers.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.inference.overhead import runtime_overhead
from llmpar.launch import serving
from llmpar.launch.common import Argument, command_line
from llmpar.launch.hf_trainer import _yaml_scalar, load_mapping, yaml_text
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.plan import Plan
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "TensorRT-LLM main (llm_args.py 00043967, serve.py 00209af1), PyTorch backend"
YAML = "extra-llm-api-config.yml"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""BaseLlmArgs.dtype's values for llmpar's number formats."""
KV_DTYPES = {"fp8": "fp8"}
"""KvCacheConfig.dtype: "auto" is the model's own format, "fp8" an FP8 cache."""
BLOCK_TOKENS = 32
"""KvCacheConfig.tokens_per_block's default (llm_args.py)."""
FLAGS = {"--tensor_parallel_size": "tensor_parallel_size", "--tp_size": "tensor_parallel_size",
         "--pipeline_parallel_size": "pipeline_parallel_size",
         "--pp_size": "pipeline_parallel_size",
         "--moe_expert_parallel_size": "moe_expert_parallel_size",
         "--ep_size": "moe_expert_parallel_size",
         "--context_parallel_size": "context_parallel_size",
         "--cp_size": "context_parallel_size", "--max_batch_size": "max_batch_size",
         "--max_num_tokens": "max_num_tokens", "--max_seq_len": "max_seq_len",
         "--free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction",
         "--kv_cache_free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction",
         "--enable_chunked_prefill": "enable_chunked_prefill"}
"""serve.py's options and the LLM-API argument each sets (`get_llm_args`)."""


def _uses_mtp(spec: Spec) -> bool:
    """A model that ships its own multi-token prediction module (DeepSeek-V3,
    arXiv:2412.19437 Sec. 2.2) drafts with it (MTPDecodingConfig), any other with an
    EAGLE-3 head (Eagle3DecodingConfig; Li et al. 2025, arXiv:2503.01840)."""
    return serving.ships_draft_module(spec)


def _layout(spec: Spec, layout: Layout, ledger: Ledger,
            notes: list[str]) -> tuple[dict[str, Any], bool]:
    """The LLM-API parallel arguments, and whether the attention is data-parallel."""
    tensor, pipeline, data, expert = serving.layout_degrees(layout)
    ledger.take("parallel.tensor", "parallel.pipeline", "parallel.data")
    attention_dp = data > 1 and expert > 1 and tensor == 1  # experts span the replicas
    engine = data if attention_dp else tensor
    args: dict[str, Any] = {"tensor_parallel_size": engine,
                            "pipeline_parallel_size": pipeline}
    if attention_dp:
        args["enable_attention_dp"] = True
    elif data > 1:
        ledger.cannot("parallel.data", f"trtllm-serve runs one engine of {tensor * pipeline} "
                      f"GPUs: start {data} servers behind a load balancer", data)
    if expert > 1:
        if engine % expert:
            ledger.cannot("parallel.expert.degree", f"TensorRT-LLM splits the experts over "
                          f"the engine's {engine} GPUs (moe_expert_parallel_size x "
                          "moe_tensor_parallel_size)", expert)
        else:
            args["moe_expert_parallel_size"] = expert
            args["moe_tensor_parallel_size"] = engine // expert
        if spec.parallel["expert"].dispatcher != "all-to-all":
            ledger.cannot("parallel.expert.dispatcher", "TensorRT-LLM chooses its expert "
                          "all-to-all with moe_config.backend (WIDEEP) and its environment, "
                          "not mapped", spec.parallel["expert"].dispatcher)
    if "expert" in spec.parallel:
        ledger.take("parallel.expert")
    serving.cannot_split_context(spec, layout, ledger, "not mapped to TensorRT-LLM's "
                                 "context parallelism (context_parallel_size with "
                                 "cp_config: Helix or star attention)")
    if engine * pipeline > spec.hardware.gpus_per_node:
        notes.append("the engine spans nodes: start it under MPI or Slurm with "
                     "trtllm-llmapi-launch (one rank per GPU)")
    return args, attention_dp


def memory_after_load_bytes(spec: Spec, layout: Layout, plan: Plan) -> float:
    """What TensorRT-LLM's `free_gpu_memory_fraction` is a fraction of, on one GPU of the
    plan's peak stage: the memory the weights, the activations and the runtime leave.

    The PyTorch backend sizes the cache once the model is loaded
    (tensorrt_llm/_torch/pyexecutor/_util.py `KvCacheCreator.configure_kv_cache_capacity`
    and `_cal_max_memory`, TensorRT-LLM commit 00043967): it runs dummy requests of
    `max_num_tokens` tokens, takes the peak of PyTorch's allocations (weights,
    activations, the temporary cache) plus what is allocated outside PyTorch (CUDA
    context, NCCL buffers, CUDA graphs), and gives the cache
    `free_gpu_memory_fraction x (device memory - peak + temporary cache)`. In the plan's
    terms that base is the capacity less the weights, the workspace (the activations of
    its largest step) and the runtime allowance without its headroom (the CUDA context
    and NCCL buffers, `llmpar.inference.overhead`)."""
    allowance = runtime_overhead(spec, layout)
    return (plan.capacity_bytes - plan.weights_bytes - (plan.activations_bytes or 0)
            - allowance.context_bytes - allowance.communication_bytes)


def cache_fraction(memory_utilization: float, capacity_bytes: float,
                   after_load_bytes: float) -> float:
    """The free_gpu_memory_fraction that gives the cache the plan's memory_utilization
    leaves. The plan lets the engine use `memory_utilization x capacity` (its headroom is
    the rest, `llmpar.inference.overhead`), so its cache may take
    `memory_utilization x capacity - (capacity - after_load)` bytes, and TensorRT-LLM
    takes `fraction x after_load` (`memory_after_load_bytes`):
    fraction = 1 - (1 - memory_utilization) x capacity / after_load."""
    return 1 - (1 - memory_utilization) * capacity_bytes / after_load_bytes


def memory_utilization_of(fraction: float, capacity_bytes: float,
                          after_load_bytes: float) -> float:
    """`cache_fraction` the other way: the memory_utilization whose cache TensorRT-LLM's
    `fraction` gives, 1 - (1 - fraction) x after_load / capacity (rounded to 12 decimals:
    the fraction is written to 17 digits, so this only drops the float error)."""
    return round(1 - (1 - fraction) * after_load_bytes / capacity_bytes, 12)


def _planned_utilization(fraction: float, spec: Spec, plan: Plan) -> dict[str, Any]:
    """The imported spec's memory_utilization from a free_gpu_memory_fraction, with the
    weights and workspace of that spec's plan (`ReadSettings.planned`)."""
    layout = Layout(degrees=dict(plan.serving[0].layout), num_gpus=plan.num_gpus)
    after = memory_after_load_bytes(spec, layout, plan)
    if after <= 0:
        return {}
    return {"inference.memory_utilization": memory_utilization_of(
        fraction, plan.capacity_bytes, after)}


@attrs.frozen
class TrtLlmTarget:
    """The `trtllm-serve` line and its LLM-API options YAML."""

    name: str = "trt-llm"
    aliases: tuple[str, ...] = ("trtllm", "tensorrt-llm", "trtllm-serve")
    description: str = "the trtllm-serve command line and its --extra_llm_api_options YAML"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        """Without the plan: free_gpu_memory_fraction is the spec's memory_utilization,
        which gives TensorRT-LLM a larger cache than the plan's (`launch_planned`)."""
        return self._launch(spec, layout, None)

    def launch_planned(self, spec: Spec, layout: Layout, plan: Plan) -> Launch:
        return self._launch(spec, layout, plan)

    def _launch(self, spec: Spec, layout: Layout, plan: Plan | None) -> Launch:
        inference, ledger, notes = serving.start(spec, self.name, "TensorRT-LLM")
        args, attention_dp = _layout(spec, layout, ledger, notes)
        activations = spec.precision.activations
        if activations in DTYPES:
            args["dtype"] = DTYPES[activations]
        if inference.weights not in DTYPES:
            notes.append(f"{inference.weights} weights: TensorRT-LLM reads the quantization "
                         "from the checkpoint's config (serve a ModelOpt FP8/NVFP4, an MXFP4 "
                         "or an AWQ/GPTQ checkpoint)")
        ledger.take("inference.weights")
        args["max_seq_len"] = inference.context_tokens
        # a static batch is per attention-DP rank, as llmpar's batch is per replica
        seqs = serving.engine_max_seqs(inference) if inference.continuous else inference.batch_size
        if seqs is not None:
            args["max_batch_size"] = seqs
        ledger.take("inference.batch_size")
        chunk = serving.engine_chunk_tokens(inference)
        args["enable_chunked_prefill"] = chunk is not None
        args["max_num_tokens"] = chunk if chunk is not None else max(
            inference.batch_size * inference.prompt_tokens, inference.context_tokens)
        ledger.take("inference.prefill_chunk_tokens")
        fraction = self._fraction(spec, layout, plan, ledger, notes)
        cache: dict[str, Any] = {"free_gpu_memory_fraction": fraction,
                                 "enable_block_reuse": inference.prefix_cache_hit_rate > 0}
        if inference.kv_cache == activations:
            cache["dtype"] = "auto"
        elif inference.kv_cache in KV_DTYPES:
            cache["dtype"] = KV_DTYPES[inference.kv_cache]
        ledger.cannot("inference.kv_cache", "TensorRT-LLM keeps the cache in the model's "
                      "format or fp8 (nvfp4 only for an NVFP4 checkpoint)",
                      inference.kv_cache if inference.kv_cache != activations
                      and inference.kv_cache not in KV_DTYPES else None)
        if inference.kv_block_tokens is not None:
            cache["tokens_per_block"] = inference.kv_block_tokens
        else:
            notes.append(f"TensorRT-LLM pages the cache in blocks ({BLOCK_TOKENS} tokens "
                         "unless kv_cache_config.tokens_per_block); the plan counts exactly "
                         "the tokens held")
        ledger.take("inference.kv_block_tokens")
        args["kv_cache_config"] = cache
        if not inference.cuda_graphs:
            args["cuda_graph_config"] = None
        ledger.take("inference.cuda_graphs")
        if inference.two_batch_overlap:
            ledger.cannot("inference.two_batch_overlap", "no TensorRT-LLM option overlaps "
                          "two micro-batches' communication with compute", True)
        ledger.take("inference.two_batch_overlap")
        if inference.sliding_window is False and spec.model.sliding_window is not None:
            ledger.cannot("inference.sliding_window", "TensorRT-LLM caches windowed layers "
                          "by their window (kv_cache_config.max_attention_window)", False)
        ledger.take("inference.sliding_window")
        speculative = inference.speculative
        if speculative is not None:
            if _uses_mtp(spec):
                args["speculative_config"] = {"decoding_type": "MTP",
                                              "max_draft_len": speculative.draft_tokens}
            else:
                args["speculative_config"] = {"decoding_type": "Eagle3",
                                              "max_draft_len": speculative.draft_tokens,
                                              "speculative_model": "DRAFT_MODEL"}
                notes.append("DRAFT_MODEL in the YAML is your EAGLE-3 draft checkpoint")
            serving.take_speculative(ledger, speculative.draft_layers,
                                     "TensorRT-LLM's MTP and EAGLE-3 heads")
        ledger.cannot("inference.disaggregated", "two TensorRT-LLM servers (context and "
                      "generation) behind trtllm-serve disaggregated: this serves one pool's "
                      "layout")
        notes.append(serving.checkpoint_note(spec))
        if attention_dp:
            notes.append("under enable_attention_dp each rank schedules its own requests: "
                         "max_batch_size is per rank")
        arguments: list[Argument] = [("--backend", "pytorch")]
        for flag in ("--tensor_parallel_size", "--pipeline_parallel_size",
                     "--moe_expert_parallel_size", "--max_batch_size", "--max_num_tokens",
                     "--max_seq_len"):
            if FLAGS[flag] in args:
                arguments.append((flag, str(args[FLAGS[flag]])))
        arguments.append(("--free_gpu_memory_fraction", repr(fraction)))
        if args["enable_chunked_prefill"]:
            arguments.append(("--enable_chunked_prefill", None))
        arguments.append(("--extra_llm_api_options", YAML))
        command = command_line('trtllm-serve "$MODEL"', arguments)
        return Launch(
            target=self.name, framework_version=VERSION,
            files=(LaunchFile(YAML, yaml_text(args), "the LLM-API options (all of them: they "
                              "override the command line's)"),
                   LaunchFile("serve.sh", f"#!/bin/sh\n{command}\n", "the trtllm-serve line",
                              in_command=True)),
            command=command, unmapped=ledger.unmapped(), notes=tuple(notes))

    @staticmethod
    def _fraction(spec: Spec, layout: Layout, plan: Plan | None, ledger: Ledger,
                  notes: list[str]) -> float:
        """KvCacheConfig.free_gpu_memory_fraction for the plan's memory_utilization
        (`cache_fraction`), the spec's memory_utilization itself without a plan."""
        utilization = spec.inference.memory_utilization  # type: ignore[union-attr]
        ledger.take("inference.memory_utilization")
        if plan is None:
            notes.append("free_gpu_memory_fraction is the share of the memory the weights "
                         "and activations leave that the cache takes, not the share of the "
                         "whole GPU memory_utilization is: launched without the plan, the "
                         "cache TensorRT-LLM allocates is larger than the plan's")
            return utilization
        after = memory_after_load_bytes(spec, layout, plan)
        fraction = cache_fraction(utilization, plan.capacity_bytes, after) if after > 0 else 0.0
        if fraction <= 0:
            ledger.cannot("inference.memory_utilization", "the weights, workspace and "
                          "runtime allowance leave no memory for TensorRT-LLM's cache at "
                          "this memory_utilization", utilization)
            return utilization
        notes.append(f"free_gpu_memory_fraction {fraction:.4f} of the {after / 1e9:.2f} GB "
                     "the weights, activations and runtime leave on a GPU gives the cache "
                     f"{fraction * after / 1e9:.2f} GB, what memory_utilization "
                     f"{utilization:g} of {plan.capacity_bytes / 1e9:.2f} GB leaves it (the "
                     f"spec's batch holds {(plan.serving[0].kv_cache_bytes or 0) / 1e9:.2f} "
                     "GB); TensorRT-LLM measures the weights and activations it subtracts")
        return fraction

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_options(text, source, base)


@attrs.define
class _Options:
    """The LLM-API arguments by dotted key, read with every problem collected (each
    names its key or option)."""

    values: dict[str, Any]
    names: dict[str, str]
    source: str
    problems: list[Problem] = attrs.field(factory=list)
    read: set[str] = attrs.field(factory=set)

    def _bad(self, key: str, message: str) -> None:
        self.problems.append(Problem(f"$.{self.names.get(key, key)}", message))

    def integer(self, key: str) -> int | None:
        self.read.add(key)
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self._bad(key, f"expected an integer >= 1, got {value!r}")
            return None
        return value

    def flag(self, key: str) -> bool | None:
        self.read.add(key)
        value = self.values.get(key)
        if value is not None and not isinstance(value, bool):
            self._bad(key, f"expected true or false, got {value!r}")
            return None
        return value

    def fraction(self, key: str) -> float | None:
        self.read.add(key)
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self._bad(key, f"must be in (0, 1], got {value!r}")
            return None
        return float(value)

    def choice(self, key: str, choices: dict[str, str | None]) -> str | None:
        self.read.add(key)
        value = self.values.get(key)
        if value is None:
            return None
        if value not in choices:
            self._bad(key, f"must be one of {', '.join(choices)}, got {value!r}")
            return None
        return choices[value]


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and key != "speculative_config":
            found.update(_flatten(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def _options(text: str, source: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The LLM-API arguments a YAML states, or those a trtllm-serve line's options set
    (with the names to report problems under), and what was left unread."""
    first = next((line.strip() for line in text.splitlines()
                  if line.strip() and not line.lstrip().startswith("#")), "")
    if not first.startswith(("trtllm-serve", "--")) and ":" in first:
        return _flatten(load_mapping(text, source)), {}, []
    found = serving.server_words(text, source)
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    left: list[str] = []
    for flag, words in found.items():
        key = FLAGS.get(flag)
        if key is None:
            left.append(flag)
            continue
        names[key] = flag
        if flag == "--enable_chunked_prefill":
            values[key] = True if not words else _yaml_scalar(words[0])
        elif len(words) != 1:
            raise SpecError([Problem(f"$.{flag}", f"expected one value, got {words!r}")],
                            source)
        else:
            values[key] = _yaml_scalar(words[0])
    return values, names, left


def read_options(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from an `--extra_llm_api_options` YAML (or a trtllm-serve line): the
    layout, the formats, the batch, the prefill chunk, the cache's blocks and share, CUDA
    graphs and the draft length; a malformed value is a Problem naming its key, a key llmpar
    does not model a note."""
    values, names, left = _options(text, source)
    options = _Options(values, names, source)
    settings: dict[str, Any] = {}
    engine = options.integer("tensor_parallel_size") or 1
    pipeline = options.integer("pipeline_parallel_size") or 1
    attention_dp = options.flag("enable_attention_dp") or False
    expert = options.integer("moe_expert_parallel_size") or 1
    moe_tensor = options.integer("moe_tensor_parallel_size")
    if expert > 1 and engine % expert:
        options._bad("moe_expert_parallel_size", f"must divide tensor_parallel_size "
                                                 f"({engine}), got {expert}")
    elif moe_tensor is not None and expert * moe_tensor != engine:
        options._bad("moe_tensor_parallel_size", f"x moe_expert_parallel_size ({expert}) "
                                                 f"must be tensor_parallel_size ({engine})")
    if (options.integer("context_parallel_size") or 1) > 1:
        options._bad("context_parallel_size", "llmpar does not read TensorRT-LLM's context "
                                              "parallelism (Helix, star attention)")
    tensor, data = (1, engine) if attention_dp else (engine, 1)
    serving.set_degree(settings, base, "tensor", tensor)
    serving.set_degree(settings, base, "pipeline", pipeline)
    if not serving.keep_filled_data(base, data, tensor * pipeline):
        serving.set_degree(settings, base, "data", data)
    serving.set_degree(settings, base, "expert", expert)
    dtype = options.choice("dtype", {**{v: k for k, v in DTYPES.items()}, "auto": None})
    serving.set_precision(settings, dtype)
    # KvCacheConfig.dtype (llm_args.py validate_dtype): "auto", "fp8", "fp8_ds_mla" (the
    # FP8 cache packed for sparse MLA), "nvfp4" (not an llmpar cache format) or a torch
    # dtype's name.
    kv = options.choice("kv_cache_config.dtype", {"auto": None, "fp8": "fp8",
                                                  "fp8_ds_mla": "fp8", "bfloat16": "bf16",
                                                  "float16": "fp16", "float32": "fp32"})
    if "kv_cache_config.dtype" in values:
        settings["inference.kv_cache"] = serving.kv_cache_format(base, dtype, kv)
    options.integer("max_seq_len")  # the requests' lengths are the workload's
    seqs = options.integer("max_batch_size")
    if seqs is not None and not serving.is_continuous(base):
        settings["inference.batch_size"] = seqs
    tokens = options.integer("max_num_tokens")
    chunked = options.flag("enable_chunked_prefill")
    if chunked is False or (chunked is None and "max_num_tokens" in values):
        settings["inference.prefill_chunk_tokens"] = None  # whole prompts, as the default
    elif chunked and tokens is not None:
        settings["inference.prefill_chunk_tokens"] = serving.prefill_chunk_setting(base, tokens)
    memory = options.fraction("kv_cache_config.free_gpu_memory_fraction")
    block = options.integer("kv_cache_config.tokens_per_block")
    if block is not None:
        settings["inference.kv_block_tokens"] = block
    options.flag("kv_cache_config.enable_block_reuse")
    options.read.add("cuda_graph_config")
    if "cuda_graph_config" in values and values["cuda_graph_config"] is None:
        settings["inference.cuda_graphs"] = False
    speculative = values.get("speculative_config")
    options.read.add("speculative_config")
    if speculative is not None:
        draft = speculative.get("max_draft_len", speculative.get("num_nextn_predict_layers")) \
            if isinstance(speculative, dict) else None
        if isinstance(draft, bool) or not isinstance(draft, int) or draft < 1:
            options._bad("speculative_config.max_draft_len", f"expected an integer >= 1, got "
                                                             f"{draft!r}")
        else:
            settings["inference.speculative.draft_tokens"] = draft
    for key in ("backend", "model", "extra_llm_api_options"):
        options.read.add(key)
    if options.problems:
        raise SpecError(options.problems, source)
    ignored = sorted({names.get(k, k) for k in values if k not in options.read} | set(left))
    ignored = [k for k in ignored if k not in ("--backend", "--extra_llm_api_options",
                                               "--config")]
    notes = [f"ignored: {', '.join(ignored)} (not modelled)"] if ignored else []
    if "--extra_llm_api_options" in left or "--config" in left:
        notes.append("the line names an --extra_llm_api_options YAML, whose keys override "
                     "its options: import that file (--from trt-llm) for them")
    # The fraction is of the memory the imported spec's weights and activations leave:
    # its memory_utilization comes from that spec's plan (`memory_utilization_of`).
    planned = partial(_planned_utilization, memory) if memory is not None else None
    return ReadSettings(settings=settings, notes=tuple(notes), planned=planned)
