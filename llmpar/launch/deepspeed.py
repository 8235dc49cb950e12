"""DeepSpeed: a config JSON (`--deepspeed_config`) and the deepspeed launcher line.

Keys follow the DeepSpeed package's config classes (deepspeed/runtime/config.py,
deepspeed/runtime/zero/config.py and offload_config.py), as installed at the version
recorded in `validation/data/launch/deepspeed.json`, against which the tests check what
is written. The config covers data parallelism (ZeRO); tensor, pipeline, context and
expert parallelism need model code (Megatron-DeepSpeed, PipelineModule), so a layout that
uses them lists them as not mapped.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import accumulation_steps, global_batch, steps_of, training_only
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "DeepSpeed 0.19.8"
DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


@attrs.frozen
class DeepSpeedTarget:
    """A DeepSpeed config JSON and the `deepspeed` launcher line."""

    name: str = "deepspeed"
    aliases: tuple[str, ...] = ("ds",)
    description: str = "a DeepSpeed config JSON and the deepspeed launcher line"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        ledger = Ledger(spec, "DeepSpeed")
        notes: list[str] = []
        config: dict[str, Any] = {
            "train_batch_size": global_batch(spec, layout),
            "train_micro_batch_size_per_gpu": spec.training.micro_batch_size,
            "gradient_accumulation_steps": accumulation_steps(spec, layout),
        }
        ledger.take("training.micro_batch_size", "training.global_batch_size",
                    "training.sequence_length", "parallel.data.degree", "hardware.num_gpus",
                    "hardware.gpus_per_node", "precision.activations", "precision.compute")
        weights = spec.precision.weights
        ledger.take("precision.weights", "precision.gradients", "optimizer")
        if weights in ("bf16", "fp16"):
            config[weights] = {"enabled": True}
        elif weights != "fp32":
            ledger.cannot("precision.weights", "DeepSpeed trains in bf16, fp16 or fp32",
                          weights)
        for key in ("activations", "compute"):
            if getattr(spec.precision, key) != weights:
                ledger.cannot(f"precision.{key}", "DeepSpeed computes in its weights' "
                              "format", getattr(spec.precision, key))
        config["zero_optimization"] = _zero(spec, ledger)
        data = spec.parallel.get("data")
        if data is not None and data.reduce_dtype in DTYPES:
            config["communication_data_type"] = DTYPES[data.reduce_dtype]
        ledger.take("parallel.data.reduce_dtype")
        for name in ("tensor", "pipeline", "context", "expert"):
            if layout.degree(name) > 1:
                ledger.cannot(f"parallel.{name}", "a DeepSpeed config alone does not split "
                              "the model: that needs model code (Megatron-DeepSpeed, "
                              "PipelineModule)", layout.degree(name))
            elif name in spec.parallel:
                ledger.take(f"parallel.{name}")
        if "sequence" in spec.parallel:
            ledger.take("parallel.sequence")
        training = spec.training
        ledger.take("training.recompute", "training.tokens", "training.tokens_per_parameter")
        if training.recompute == "full" and training.recompute_layers is None:
            notes.append("full recomputation: turn on the model's activation checkpointing "
                         "(gradient_checkpointing_enable() for Hugging Face models, "
                         "deepspeed.checkpointing.checkpoint in your own)")
            config["activation_checkpointing"] = {"partition_activations": False,
                                                  "contiguous_memory_optimization": False}
        elif training.recompute != "none":
            ledger.cannot("training.recompute", "DeepSpeed checkpoints whole layers (full) "
                          "only", training.recompute)
        ledger.cannot("training.recompute_layers", "DeepSpeed checkpoints every layer the "
                      "model code wraps")
        ledger.cannot("training.activation_offload_layers", "DeepSpeed's cpu_checkpointing "
                      "offloads the checkpoints of every layer, not the first N")
        hardware = spec.hardware
        per_node = min(hardware.gpus_per_node, hardware.num_gpus)
        launcher = (f"deepspeed --num_nodes={hardware.num_nodes} --num_gpus={per_node}"
                    + (" --hostfile=hostfile" if hardware.num_nodes > 1 else "")
                    + " train.py --deepspeed --deepspeed_config ds_config.json")
        ledger.take("model")
        notes.append("the model is your script's (a Hugging Face model from its "
                     "config.json: `llmpar import-hf` reads that into a spec)")
        notes.append("train.py is your training script (deepspeed.initialize with this "
                     "config); the hostfile lists the nodes")
        if (steps := steps_of(spec, layout)) is not None:
            notes.append(f"the run is {steps} optimizer steps: set your script's step count")
        text = json.dumps(config, indent=2) + "\n"
        return Launch(target=self.name, framework_version=VERSION,
                      files=(LaunchFile("ds_config.json", text, "the DeepSpeed config"),
                             LaunchFile("launch.sh", f"#!/bin/sh\n{launcher}\n",
                                        "the launcher line", in_command=True)),
                      command=launcher, unmapped=ledger.unmapped(), notes=tuple(notes))

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_config(text, source, base)


def _zero(spec: Spec, ledger: Ledger) -> dict[str, Any]:
    data = spec.parallel.get("data")
    if data is None:
        return {"stage": 0}
    ledger.take("parallel.data.zero", "parallel.data.fsdp", "parallel.data.overlap_grad_reduce",
                "parallel.data.overlap_param_gather", "parallel.data.reshard_after_forward")
    zero: dict[str, Any] = {"stage": data.stage,
                            "overlap_comm": data.overlap_grad_reduce or data.overlap_param_gather}
    if data.stage == 3 and not data.reshard_after_forward:
        ledger.cannot("parallel.data.reshard_after_forward", "DeepSpeed ZeRO-3 always frees "
                      "the gathered weights after the forward pass", False)
    if data.shard_degree is not None:
        ledger.cannot("parallel.data.shard_degree", "hybrid sharding is not mapped "
                      "(ZeRO++'s zero_hpz_partition_size shards a secondary weight copy)")
    if data.gradient_sync != "every-micro-batch":
        ledger.cannot("parallel.data.gradient_sync", "not a DeepSpeed setting")
    # ZeRO++ (deepspeed/runtime/zero/config.py): set only where the spec turns it on
    ledger.take("parallel.data.quantized_weights", "parallel.data.hpz_partition_size",
                "parallel.data.quantized_gradients")
    if data.quantized_weights:
        zero["zero_quantized_weights"] = True
    if data.hpz_partition_size != 1:
        zero["zero_hpz_partition_size"] = data.hpz_partition_size
    if data.quantized_gradients:
        zero["zero_quantized_gradients"] = True
    ledger.take("parallel.data.prefetch_bucket_parameters",
                "parallel.data.persistence_threshold_parameters")
    if data.prefetch_bucket_parameters is not None:
        zero["stage3_prefetch_bucket_size"] = data.prefetch_bucket_parameters
    if data.persistence_threshold_parameters is not None:
        zero["stage3_param_persistence_threshold"] = data.persistence_threshold_parameters
    offload = spec.parallel.get("offload")
    if offload is not None:
        ledger.take("parallel.offload")
        if getattr(offload, "optimizer", False):
            zero["offload_optimizer"] = {"device": "cpu"}
        if getattr(offload, "weights", False):
            zero["offload_param"] = {"device": "cpu"}
    return zero


def read_config(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from a DeepSpeed config JSON (ZeRO stage, batch, number format); a
    malformed value is a Problem naming its `$.key`. The model is the base's (or give its
    config.json to `llmpar import-hf`)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError([Problem("$", f"not JSON: {exc}")], source) from None
    if not isinstance(config, dict):
        raise SpecError([Problem("$", "expected a JSON object")], source)
    problems: list[Problem] = []
    settings: dict[str, Any] = {}

    def integer(value: Any, path: str, least: int = 1) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            problems.append(Problem(path, f"expected an integer >= {least}, got {value!r}"))
            return None
        return value

    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        problems.append(Problem("$.zero_optimization", f"expected an object (its stage and "
                                                       f"settings), got {zero!r}"))
        zero = {}
    stage = integer(zero.get("stage", 0), "$.zero_optimization.stage", 0)
    if stage is not None and stage > 3:
        problems.append(Problem("$.zero_optimization.stage", f"must be 0 to 3, got {stage}"))
    elif stage is not None:
        base_data = base.parallel.get("data") if base is not None else None
        keep_fsdp = base_data is not None and base_data.fsdp and stage == 3
        if not keep_fsdp:
            settings["parallel.data.zero"], settings["parallel.data.fsdp"] = stage, False
    if stage == 3:  # ZeRO++: DeepSpeed reads its settings under stage 3 only
        for key, field in (("zero_quantized_weights", "quantized_weights"),
                           ("zero_quantized_gradients", "quantized_gradients")):
            if key in zero:
                settings[f"parallel.data.{field}"] = bool(zero[key])
        if "zero_hpz_partition_size" in zero:
            settings["parallel.data.hpz_partition_size"] = integer(
                zero["zero_hpz_partition_size"], "$.zero_optimization.zero_hpz_partition_size")
        for key, field in (("stage3_prefetch_bucket_size", "prefetch_bucket_parameters"),
                           ("stage3_param_persistence_threshold",
                            "persistence_threshold_parameters")):
            if key in zero:
                settings[f"parallel.data.{field}"] = integer(zero[key],
                                                             f"$.zero_optimization.{key}")
    if "overlap_comm" in zero:
        overlap = bool(zero["overlap_comm"])
        settings["parallel.data.overlap_grad_reduce"] = overlap
        settings["parallel.data.overlap_param_gather"] = overlap
    if "train_micro_batch_size_per_gpu" in config:
        settings["training.micro_batch_size"] = integer(
            config["train_micro_batch_size_per_gpu"], "$.train_micro_batch_size_per_gpu")
    if "train_batch_size" in config:
        settings["training.global_batch_size"] = integer(config["train_batch_size"],
                                                         "$.train_batch_size")
    formats = [name for name in ("bf16", "fp16")
               if isinstance(config.get(name), dict) and config[name].get("enabled")]
    dtype = formats[0] if formats else "fp32"
    for key in ("weights", "activations", "compute"):
        settings[f"precision.{key}"] = dtype
    if "communication_data_type" in config:
        value = config["communication_data_type"]
        if value not in DTYPES:
            problems.append(Problem("$.communication_data_type", f"expected one of "
                                    f"{', '.join(DTYPES)}, got {value!r}"))
        else:
            settings["parallel.data.reduce_dtype"] = value
    if problems:
        raise SpecError(problems, source)
    return ReadSettings(settings=settings, owned=("parallel.data.degree",))
