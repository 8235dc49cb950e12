"""SGLang: the `python -m sglang.launch_server` command line for a serving spec, and
reading one back.

Flags follow SGLang's own parser (`ServerArgs.add_cli_args`, sglang/srt/server_args.py,
whose flags come from the dataclass fields of sglang/srt/arg_groups/fields/) of the
version recorded in `validation/data/launch/sglang.json`, against which the tests check
every line written. Layout (sglang/srt/arg_groups/fields/parallel.py): --tp-size is the
GPUs of one engine (x --pp-size); --attn-dp-size splits them into attention replicas,
the attention's own tensor split being tp / attn-dp (the form that replaced `--dp
--enable-dp-attention`); --ep-size splits the routed experts; --dp-size runs whole
engine replicas behind SGLang's router.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.errors import Problem
from llmpar.launch import serving
from llmpar.launch.common import Argument, command_line
from llmpar.launch.flags import Words
from llmpar.launch.target import Launch, ReadSettings
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "SGLang 0.5.23"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
KV_DTYPES = {"bf16": "bf16", "fp8": "fp8_e4m3"}
"""llmpar's cache formats to SGLang's `--kv-cache-dtype` choices."""
DISPATCHERS = {"deepep": "deepep"}
"""llmpar's expert dispatcher to SGLang's `--moe-a2a-backend`."""


def _speculative_algorithm(spec: Spec) -> str:
    """SGLang's algorithm for a draft head: NEXTN runs a model's own multi-token prediction
    module (DeepSeek-V3, arXiv:2412.19437 Sec. 2.2), EAGLE any other head (Li et al. 2024,
    arXiv:2401.15077)."""
    return "NEXTN" if serving.ships_draft_module(spec) else "EAGLE"


@attrs.frozen
class SglangTarget:
    """The `python -m sglang.launch_server` command line."""

    name: str = "sglang"
    aliases: tuple[str, ...] = ("sgl",)
    description: str = "the python -m sglang.launch_server command line of a serving spec"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        inference, ledger, notes = serving.start(spec, self.name, "SGLang")
        tensor, pipeline, data, expert = serving.layout_degrees(layout)
        ledger.take("parallel.tensor", "parallel.pipeline", "parallel.data")
        arguments: list[Argument] = []
        attention_dp = data > 1 and expert > 1  # the experts span the attention replicas
        if attention_dp:
            arguments += [("--tp-size", str(tensor * data)), ("--attn-dp-size", str(data))]
            notes.append("under --attn-dp-size the dense MLP layers are split over all "
                          "--tp-size GPUs unless --moe-dense-tp-size 1 (the plan keeps them "
                          "with the attention)")
        else:
            arguments.append(("--tp-size", str(tensor)))
            if data > 1:
                arguments.append(("--dp-size", str(data)))
        if pipeline > 1:
            arguments.append(("--pp-size", str(pipeline)))
        if expert > 1:
            arguments.append(("--ep-size", str(expert)))
            dispatcher = spec.parallel["expert"].dispatcher
            if dispatcher in DISPATCHERS:
                arguments.append(("--moe-a2a-backend", DISPATCHERS[dispatcher]))
        if "expert" in spec.parallel:
            ledger.take("parallel.expert")
        serving.cannot_split_context(spec, layout, ledger, "not mapped to SGLang's context "
                                     "parallelism (--attn-cp-size)")
        activations = spec.precision.activations
        arguments += serving.format_arguments(spec, inference, DTYPES, "SGLang", ledger, notes)
        if inference.kv_cache in KV_DTYPES:
            arguments.append(("--kv-cache-dtype", KV_DTYPES[inference.kv_cache]))
        elif inference.kv_cache == activations:
            arguments.append(("--kv-cache-dtype", "auto"))
        ledger.cannot("inference.kv_cache", "SGLang's cache formats are the model's, bf16 "
                      "or fp8", None if inference.kv_cache in KV_DTYPES
                      or inference.kv_cache == activations else inference.kv_cache)
        arguments.append(("--context-length", str(inference.context_tokens)))
        if inference.continuous:
            seqs = serving.engine_max_seqs(inference)
        else:  # the engine's whole batch: SGLang 0.5.23 gives each attention replica
            # max_running_requests // attn_dp_size (model_executor/pool_configurator.py)
            seqs = inference.batch_size * (data if attention_dp else 1)
        if seqs is not None:
            arguments.append(("--max-running-requests", str(seqs)))
        ledger.take("inference.batch_size")
        chunk = serving.engine_chunk_tokens(inference)
        arguments.append(("--chunked-prefill-size", str(chunk if chunk is not None else -1)))
        ledger.take("inference.prefill_chunk_tokens")
        arguments.append(("--mem-fraction-static", f"{inference.memory_utilization:g}"))
        ledger.take("inference.memory_utilization")
        notes.append("--mem-fraction-static is the share for the weights and the cache "
                     "pool; SGLang keeps the activations' workspace outside it")
        arguments.append(("--page-size", str(inference.kv_block_tokens or 1)))
        ledger.take("inference.kv_block_tokens")
        if inference.sliding_window is False and spec.model.sliding_window is not None:
            ledger.cannot("inference.sliding_window", "SGLang caches windowed layers by "
                          "their window", False)
        ledger.take("inference.sliding_window")
        if not inference.cuda_graphs:
            arguments += [("--cuda-graph-backend-decode", "disabled"),
                          ("--cuda-graph-backend-prefill", "disabled")]
        ledger.take("inference.cuda_graphs")
        if inference.two_batch_overlap:
            arguments.append(("--enable-two-batch-overlap", None))
        ledger.take("inference.two_batch_overlap")
        speculative = inference.speculative
        if speculative is not None:
            steps = speculative.draft_tokens
            arguments += [("--speculative-algorithm", _speculative_algorithm(spec)),
                          ("--speculative-num-steps", str(steps)),
                          ("--speculative-eagle-topk", "1"),
                          ("--speculative-num-draft-tokens", str(steps + 1))]
            serving.take_speculative(ledger, speculative.draft_layers,
                                     "SGLang's EAGLE and NEXTN heads")
        ledger.cannot("inference.disaggregated", "two SGLang servers (--disaggregation-mode "
                      "prefill and decode) behind its router: this line serves one pool's "
                      "layout")
        hardware = spec.hardware
        launcher = 'python -m sglang.launch_server --model-path "$MODEL"'
        if hardware.num_nodes > 1:  # each node runs the line with its own rank
            launcher += (f" --nnodes {hardware.num_nodes} --node-rank $NODE_RANK "
                         "--dist-init-addr $MASTER_ADDR:5000")
        notes.append(serving.checkpoint_note(spec))
        notes += serving.prefix_cache_note(inference, " (SGLang's radix cache is on by default)")
        command = command_line(launcher, arguments)
        return serving.serve_line(self.name, VERSION, command, "the sglang.launch_server line",
                                  ledger, notes)

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_command(text, source, base)


def read_command(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from a `sglang.launch_server` line (or its flags); a malformed value is
    a Problem naming its flag, a flag llmpar does not model a note."""
    found = serving.server_words(text, source)
    aliases = {"--tp": "--tp-size", "--dp": "--dp-size", "--ep": "--ep-size",
               "--pp": "--pp-size", "--model": "--model-path"}
    found = {aliases.get(flag, flag): values for flag, values in found.items()}
    words = Words(found, source)
    settings: dict[str, Any] = {}
    words.text("--model-path")
    engine = words.integer("--tp-size") or 1
    attention_dp = words.integer("--attn-dp-size")
    replicas = words.integer("--dp-size") or 1
    if words.switch("--enable-dp-attention"):  # the older spelling of --attn-dp-size
        attention_dp, replicas = replicas, 1
    pipeline = words.integer("--pp-size") or 1
    expert = words.integer("--ep-size") or 1
    if attention_dp is not None and engine % attention_dp:
        words.problems.append(Problem("$.--attn-dp-size", f"must divide --tp-size "
                                      f"({engine}), got {attention_dp}"))
        attention_dp = None
    tensor = engine // (attention_dp or 1)
    data = (attention_dp or 1) * replicas
    serving.set_degree(settings, base, "tensor", tensor)
    serving.set_degree(settings, base, "pipeline", pipeline)
    if not serving.keep_filled_data(base, data, tensor * pipeline):
        serving.set_degree(settings, base, "data", data)
    serving.set_degree(settings, base, "expert", expert)
    backend = words.choice("--moe-a2a-backend", {"deepep": "deepep", "none": None})
    if backend is not None and expert > 1:
        settings["parallel.expert.dispatcher"] = backend
    dtype = words.choice("--dtype", {v: k for k, v in DTYPES.items()})
    serving.set_precision(settings, dtype)
    serving.read_quantization(words, settings)
    serving.read_kv_cache(words, settings, base, dtype, {
        "auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"})
    words.integer("--context-length")  # the requests' lengths are the workload's
    seqs = words.integer("--max-running-requests")
    if seqs is not None and not serving.is_continuous(base):
        per_replica, left = divmod(seqs, attention_dp or 1)
        if left:
            words.problems.append(Problem("$.--max-running-requests", f"must be a multiple "
                                          f"of --attn-dp-size ({attention_dp}), got {seqs}"))
        settings["inference.batch_size"] = per_replica
    chunk = words.integer("--chunked-prefill-size", least=-1)
    if chunk is not None:
        if chunk == 0:
            words.problems.append(Problem("$.--chunked-prefill-size", "must be -1 (no "
                                          "chunking) or >= 1, got 0"))
        settings["inference.prefill_chunk_tokens"] = (
            None if chunk == -1 else serving.prefill_chunk_setting(base, chunk))
    memory = words.fraction("--mem-fraction-static")
    if memory is not None:
        settings["inference.memory_utilization"] = memory
    page = words.integer("--page-size")
    if page is not None:
        settings["inference.kv_block_tokens"] = None if page == 1 else page
    if (words.choice("--cuda-graph-backend-decode", {"disabled": "off", "full": "on",
                                                     "breakable": "on"}) == "off"
            or words.switch("--disable-cuda-graph")):
        settings["inference.cuda_graphs"] = False
    words.read.add("--cuda-graph-backend-prefill")
    settings["inference.two_batch_overlap"] = words.switch("--enable-two-batch-overlap") or None
    algorithm = words.choice("--speculative-algorithm", {"EAGLE": "EAGLE", "EAGLE3": "EAGLE",
                                                         "NEXTN": "NEXTN", "MTP": "NEXTN"})
    steps = words.integer("--speculative-num-steps")
    topk = words.integer("--speculative-eagle-topk")
    words.integer("--speculative-num-draft-tokens")
    if algorithm is not None and steps is not None:
        settings["inference.speculative.draft_tokens"] = steps
        if topk not in (None, 1):
            words.problems.append(Problem("$.--speculative-eagle-topk", "llmpar models one "
                                          f"draft chain (topk 1), got {topk}"))
    for flag in ("--nnodes", "--node-rank", "--dist-init-addr"):
        words.text(flag)
    words.done()
    return ReadSettings(settings=settings, notes=words.ignored())
