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

from llmpar.launch.common import accumulation_steps, global_batch, steps_of
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile
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
    offload = spec.parallel.get("offload")
    if offload is not None:
        ledger.take("parallel.offload")
        if getattr(offload, "optimizer", False):
            zero["offload_optimizer"] = {"device": "cpu"}
        if getattr(offload, "weights", False):
            zero["offload_param"] = {"device": "cpu"}
    return zero
