"""torchtitan: a job configuration TOML and the torchrun line.

Section and key names follow pytorch/torchtitan `torchtitan/config/job_config.py` at
commit e347b1e (torchtitan 0.2.1, the last release with TOML job configurations; 0.2.2
replaced them with Python config registries), recorded with every key in
`validation/data/launch/torchtitan.json`, against which the tests check what is written.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import (
    accumulation_steps,
    global_batch,
    run_tokens,
    steps_of,
    torchrun,
    training_only,
)
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.loading.dump import toml_text
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "torchtitan 0.2.1 (commit e347b1e5)"
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
"""llmpar's schedules by the names torch.distributed.pipelining takes
(torch/distributed/pipelining/schedules.py, `get_schedule_class`)."""
FLAVORS = {
    "llama-3-8b": ("llama3", "8B"), "llama-3-70b": ("llama3", "70B"),
    "llama-3.1-405b": ("llama3", "405B"), "qwen3-4b": ("qwen3", "4B"),
    "qwen3-8b": ("qwen3", "8B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"), "deepseek-v3": ("deepseek_v3", "671B"),
}
"""llmpar's model presets that torchtitan ships as (model name, flavor)
(torchtitan/models/llama3, qwen3, deepseek_v3 `__init__.py` at the commit above)."""


@attrs.frozen
class TorchtitanTarget:
    """A torchtitan job TOML (`--job.config_file`)."""

    name: str = "torchtitan"
    aliases: tuple[str, ...] = ("titan",)
    description: str = "a torchtitan job TOML and the torchrun line"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        ledger = Ledger(spec, "torchtitan")
        notes: list[str] = []
        job: dict[str, dict[str, Any]] = {
            "model": _model(spec, ledger),
            "training": _training(spec, layout, ledger, notes),
            "parallelism": _parallelism(spec, layout, ledger, notes),
            "activation_checkpoint": _recompute(spec, ledger, notes),
        }
        if job["parallelism"].get("enable_async_tensor_parallel"):
            job["compile"] = {"enable": True}
            notes.append("asynchronous tensor parallelism needs torch.compile: "
                         "[compile] enable = true")
        if spec.optimizer.name.startswith("adam") and "8bit" not in spec.optimizer.name:
            job["optimizer"] = {"name": "AdamW"}
            ledger.take("optimizer")
        else:
            ledger.cannot("optimizer", "not mapped to a torchtitan optimizer",
                          spec.optimizer.name)
        ledger.take("hardware.num_gpus", "hardware.gpus_per_node", "precision")
        notes.append("torchtitan's FSDP2 keeps the sharded parameters in training.dtype "
                     "(float32 by default) and computes in mixed_precision_param; the "
                     "plan's weights and optimizer states are the spec's")
        notes.append("the dataset and tokenizer are yours to add: [training] dataset, "
                     "[model] hf_assets_path")
        text = toml_text({k: v for k, v in job.items() if v})
        launcher = torchrun(spec, "-m torchtitan.train --job.config_file job.toml")
        return Launch(target=self.name, framework_version=VERSION,
                      files=(LaunchFile("job.toml", text, "the job configuration"),
                             LaunchFile("launch.sh", f"#!/bin/sh\n{launcher}\n",
                                        "the launcher line (run it on every node)",
                                        in_command=True)),
                      command=launcher, unmapped=ledger.unmapped(), notes=tuple(notes))

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_job(text, source, base)


def _model(spec: Spec, ledger: Ledger) -> dict[str, Any]:
    found = FLAVORS.get(spec.model.name)
    if found is None:
        ledger.cannot("model", "torchtitan builds models from its own flavors; "
                      f"{spec.model.name!r} is not one llmpar knows", spec.model.name)
        return {}
    ledger.take("model")
    name, flavor = found
    return {"name": name, "flavor": flavor}


def _training(spec: Spec, layout: Layout, ledger: Ledger, notes: list[str]) -> dict[str, Any]:
    training = spec.training
    p = layout.degree("pipeline")
    micro, m = training.micro_batch_size, accumulation_steps(spec, layout)
    # With pipelining torchtitan splits each rank's local batch into micro-batches of
    # pipeline_parallel_microbatch_size; without, local_batch_size is the micro-batch and
    # global_batch_size / (local x data ranks) the accumulation steps.
    local = micro * m if p > 1 else micro
    found: dict[str, Any] = {"local_batch_size": local,
                             "global_batch_size": global_batch(spec, layout),
                             "seq_len": training.sequence_length}
    ledger.take("training.micro_batch_size", "training.global_batch_size",
                "training.sequence_length", "training.tokens", "training.tokens_per_parameter")
    if (steps := steps_of(spec, layout)) is not None:
        found["steps"] = steps
    if spec.precision.compute in ("bf16", "fp32"):
        found["mixed_precision_param"] = "bfloat16" if spec.precision.compute == "bf16" \
            else "float32"
    else:
        ledger.cannot("precision.compute", "torchtitan computes in bfloat16 or float32 "
                      "(float8 through [quantize] is not mapped)", spec.precision.compute)
    if training.activation_offload_layers is not None:
        ledger.cannot("training.activation_offload_layers", "torchtitan has no activation "
                      "offloading (training.enable_cpu_offload offloads FSDP's states)")
    return found


def _recompute(spec: Spec, ledger: Ledger, notes: list[str]) -> dict[str, Any]:
    training = spec.training
    ledger.take("training.recompute")
    if training.recompute_layers is not None:
        ledger.cannot("training.recompute_layers", "torchtitan's layer-wise option "
                      "checkpoints every N-th layer, not the first N of each stage")
    if training.recompute == "full" and training.recompute_layer_interval is not None:
        ledger.take("training.recompute_layer_interval")
        return {"mode": "selective",
                "selective_ac_option": str(training.recompute_layer_interval)}
    if training.recompute == "selective" and training.recompute_policy is not None:
        ledger.take("training.recompute_policy")
        if training.recompute_policy == "op-all-matmuls":
            notes.append("torchtitan's op policy saves every second matrix product; saving "
                         "every one (op-all-matmuls) needs a custom policy")
        return {"mode": "selective", "selective_ac_option": "op"}
    if training.recompute == "selective":
        notes.append("torchtitan's selective (op) checkpointing keeps the matrix products' "
                     "and attention's outputs and recomputes the rest, not only the "
                     "attention scores the plan's selective recomputation drops")
        if training.activation_model == "fused":  # the import reads it as the op policy
            ledger.cannot("training.recompute", "torchtitan has no module-level selective "
                          "recomputation (Megatron-Core's core_attn); its op policy "
                          "recomputes another set of tensors", "selective")
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": training.recompute}


def _parallelism(spec: Spec, layout: Layout, ledger: Ledger,
                 notes: list[str]) -> dict[str, Any]:
    parallel = spec.parallel
    t, p, c, e, d = (layout.degree(n) for n in ("tensor", "pipeline", "context", "expert",
                                                 "data"))
    found: dict[str, Any] = {"tensor_parallel_degree": t, "pipeline_parallel_degree": p,
                             "context_parallel_degree": c}
    ledger.take("parallel.tensor.degree", "parallel.pipeline.degree", "parallel.context.degree",
                "parallel.data.degree")
    data = parallel.get("data")
    stage = 0 if data is None else data.stage
    if data is not None and stage == 3:
        shard = data.shard_degree or d
        found["data_parallel_shard_degree"], found["data_parallel_replicate_degree"] = (
            shard, d // shard)
        found["fsdp_reshard_after_forward"] = "default" if data.reshard_after_forward \
            else "never"
    else:
        found["data_parallel_shard_degree"], found["data_parallel_replicate_degree"] = 1, d
        if stage in (1, 2):
            ledger.cannot("parallel.data.zero", "torchtitan shards all states (FSDP2) or "
                          "none (DDP): no ZeRO-1/2", stage)
    if data is not None:
        ledger.take("parallel.data.zero", "parallel.data.fsdp", "parallel.data.shard_degree",
                    "parallel.data.reshard_after_forward")
        for field in ("overlap_grad_reduce", "overlap_param_gather"):
            if not getattr(data, field):
                ledger.cannot(f"parallel.data.{field}", "torchtitan's FSDP2 always "
                              "overlaps its collectives")
            ledger.take(f"parallel.data.{field}")
        if data.gradient_sync != "every-micro-batch":
            ledger.cannot("parallel.data.gradient_sync", "torchtitan reduces the gradients "
                          "of every micro-batch")
        fp32 = data.reduce_dtype == "fp32" or (data.reduce_dtype == "gradients"
                                               and spec.gradients_dtype == "fp32")
        if not fp32 and stage == 3:
            ledger.cannot("parallel.data.reduce_dtype", "torchtitan's FSDP2 reduces in "
                          "float32 (training.mixed_precision_reduce takes only float32)",
                          data.reduce_dtype)
        ledger.take("parallel.data.reduce_dtype")
    if t > 1:
        sequence = layout.is_active("sequence") is True
        if not sequence:
            ledger.cannot("parallel.sequence", "torchtitan's tensor parallelism always "
                          "splits the norms by sequence (SequenceParallel)", "absent")
        elif parallel["sequence"].comm_overlap == "pipelined":
            found["enable_async_tensor_parallel"] = True
        ledger.take("parallel.sequence.enabled", "parallel.sequence.comm_overlap",
                    "parallel.sequence.overlap_splits", "parallel.sequence")
        tensor = parallel.get("tensor")
        if tensor is not None and tensor.overlap_backward and not found.get(
                "enable_async_tensor_parallel"):
            ledger.cannot("parallel.tensor.overlap_backward", "torchtitan runs the tensor "
                          "collectives in line unless asynchronous TP is on", True)
        ledger.take("parallel.tensor.overlap_backward", "parallel.sequence.overlap_backward")
    if (pipeline := parallel.get("pipeline")) is not None:
        ledger.take("parallel.pipeline.schedule", "parallel.pipeline.virtual_stages",
                    "parallel.pipeline.overlap_p2p", "parallel.pipeline.scatter_gather")
        if p > 1:
            if pipeline.schedule in SCHEDULES:
                found["pipeline_parallel_schedule"] = SCHEDULES[pipeline.schedule]
            else:
                ledger.cannot("parallel.pipeline.schedule", "not mapped to a "
                              "torch.distributed.pipelining schedule", pipeline.schedule)
            found["pipeline_parallel_microbatch_size"] = spec.training.micro_batch_size
            layers = spec.model.num_layers or 0
            stages = p * (pipeline.virtual_stages if pipeline.schedule == "interleaved" else 1)
            if layers % stages == 0:
                found["pipeline_parallel_layers_per_stage"] = layers // stages
            if not pipeline.overlap_p2p:
                ledger.cannot("parallel.pipeline.overlap_p2p", "torchtitan's schedules post "
                              "their sends asynchronously", False)
        if pipeline.layers_per_stage is not None:
            ledger.cannot("parallel.pipeline.layers_per_stage", "torchtitan splits the "
                          "layers evenly (less on the first and last stage only)")
    if (context := parallel.get("context")) is not None:
        ledger.take("parallel.context.kind", "parallel.context.all_to_all_degree")
        if c > 1 and context.kind == "ring":
            found["context_parallel_rotate_method"] = "alltoall"
            notes.append("context parallelism: torchtitan's ring attention passes K/V "
                         "around the ring with rotate_method alltoall")
        elif c > 1:
            ledger.cannot("parallel.context.kind", "torchtitan's context parallelism is "
                          "ring attention only", context.kind)
    if (expert := parallel.get("expert")) is not None:
        ledger.take("parallel.expert.degree", "parallel.expert.tensor_degree",
                    "parallel.expert.dispatcher")
        found["expert_parallel_degree"] = e
        if expert.tensor_degree is not None:
            found["expert_tensor_parallel_degree"] = expert.tensor_degree
        if expert.dispatcher == "deepep":
            found["expert_parallel_comm_backend"] = "deepep"
        if expert.overlap_a2a:
            ledger.cannot("parallel.expert.overlap_a2a", "not mapped to torchtitan")
    if spec.rank_order != ("tensor", "context", "expert", "data", "pipeline"):
        ledger.cannot("parallel.order", "torchtitan builds its device mesh in its own order")
    return found


# --- reading a job TOML back ------------------------------------------------------------

RECOMPUTE_MODES = ("none", "selective", "full")


def _number(table: dict[str, Any], section: str, key: str, problems: list[Problem],
            default: int, least: int = 1) -> int:
    value = table.get(section, {}).get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        problems.append(Problem(f"$.{section}.{key}", f"expected an integer >= {least}, "
                                                      f"got {value!r}"))
        return default
    return value


def _op_policy_applies(base: Spec | None, settings: dict[str, Any]) -> bool:
    """Whether the op-level policy can be stated for the imported spec: over a base that
    keeps its model, whose activation model is "fused" and whose layers are attention
    blocks with a dense MLP or an MoE block (`recompute_policy`'s conditions); else plain
    selective."""
    if base is None or "model" in settings:
        return False
    model = base.model
    return (base.training.activation_model == "fused" and model.has_architecture
            and model.recurrent_mixer is None
            and model.sparse_attention is None)


def read_job(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from a torchtitan job TOML; every malformed value is a Problem
    naming its `$.section.key`."""
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([Problem("$", f"not TOML: {exc}")], source) from None
    problems: list[Problem] = []
    settings: dict[str, Any] = {}
    owned = ["parallel.tensor.degree", "parallel.pipeline.degree", "parallel.pipeline.schedule",
             "parallel.pipeline.virtual_stages", "parallel.sequence", "parallel.context",
             "parallel.expert", "parallel.data.degree", "parallel.data.shard_degree",
             "parallel.data.reshard_after_forward", "training.recompute",
             "training.recompute_layer_interval", "training.recompute_layers",
             "training.recompute_policy", "training.recompute_modules"]
    par = "parallelism"
    t = _number(job, par, "tensor_parallel_degree", problems, 1)
    p = _number(job, par, "pipeline_parallel_degree", problems, 1)
    c = _number(job, par, "context_parallel_degree", problems, 1)
    shard = job.get(par, {}).get("data_parallel_shard_degree", -1)
    if shard != -1:
        shard = _number(job, par, "data_parallel_shard_degree", problems, 1)
    replicate = _number(job, par, "data_parallel_replicate_degree", problems, 1)
    if t > 1:
        settings["parallel.tensor.degree"] = t
        asynchronous = job.get(par, {}).get("enable_async_tensor_parallel", False)
        settings["parallel.sequence"] = {"comm_overlap": "pipelined" if asynchronous
                                         else "none"}
    if p > 1:
        settings["parallel.pipeline.degree"] = p
        schedules = {v: k for k, v in SCHEDULES.items()}
        name = job.get(par, {}).get("pipeline_parallel_schedule", "1F1B")
        if name not in schedules:
            problems.append(Problem(f"$.{par}.pipeline_parallel_schedule", f"expected one "
                                    f"of {', '.join(schedules)}, got {name!r}"))
        schedule = schedules.get(name, "1f1b")
        settings["parallel.pipeline.schedule"] = schedule
        per_stage = job.get(par, {}).get("pipeline_parallel_layers_per_stage")
        layers = base.model.num_layers if base is not None else None
        if schedule == "interleaved" and per_stage and layers:
            settings["parallel.pipeline.virtual_stages"] = max(1, layers // (p * per_stage))
    if c > 1:
        settings["parallel.context"] = {"degree": c, "kind": "ring"}
    e = _number(job, par, "expert_parallel_degree", problems, 1)
    if e > 1:
        expert: dict[str, Any] = {"degree": e}
        etp = job.get(par, {}).get("expert_tensor_parallel_degree")
        if etp is not None:
            expert["tensor_degree"] = _number(job, par, "expert_tensor_parallel_degree",
                                              problems, 1)
        if job.get(par, {}).get("expert_parallel_comm_backend") == "deepep":
            expert["dispatcher"] = "deepep"
        settings["parallel.expert"] = expert
    if shard == 1:
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 0, False
    else:
        base_data = base.parallel.get("data") if base is not None else None
        if base_data is None or base_data.stage != 3:  # FSDP2: ZeRO-3 with prefetch
            settings["parallel.data.fsdp"] = True
        if replicate > 1 and shard != -1:
            settings["parallel.data.shard_degree"] = shard
        settings["parallel.data.reshard_after_forward"] = job.get(par, {}).get(
            "fsdp_reshard_after_forward", "default") != "never"
    training = job.get("training", {})
    local = _number(job, "training", "local_batch_size", problems, 8)
    micro = (_number(job, par, "pipeline_parallel_microbatch_size", problems, 1) if p > 1
             else local)
    settings["training.micro_batch_size"] = micro
    if "global_batch_size" in training and training["global_batch_size"] != -1:
        settings["training.global_batch_size"] = _number(job, "training",
                                                         "global_batch_size", problems, 1)
    seq = _number(job, "training", "seq_len", problems, 2048)
    settings["training.sequence_length"] = seq
    mode = job.get("activation_checkpoint", {}).get("mode", "selective")
    if mode not in RECOMPUTE_MODES:
        problems.append(Problem("$.activation_checkpoint.mode", f"expected one of "
                                f"{', '.join(RECOMPUTE_MODES)}, got {mode!r}"))
    settings["training.recompute"] = mode if mode in RECOMPUTE_MODES else "none"
    option = str(job.get("activation_checkpoint", {}).get("selective_ac_option", "2"))
    if mode == "selective" and option.isdigit():
        # every N-th block fully checkpointed (_apply_layer_sac; 0: every block)
        settings["training.recompute"] = "full"
        if int(option) > 1:
            settings["training.recompute_layer_interval"] = int(option)
    model = job.get("model", {})
    flavor = (model.get("name"), model.get("flavor"))
    preset = next((name for name, found in FLAVORS.items() if found == flavor), None)
    if model and preset is None:
        problems.append(Problem("$.model", f"{flavor[0]}/{flavor[1]} is not a flavor llmpar "
                                           f"has a preset for: give --base"))
    elif preset is not None and (base is None or base.model.name != preset):
        settings["model"] = preset
        owned.append("model")
    if problems:
        raise SpecError(problems, source)
    if mode == "selective" and option == "op" and _op_policy_applies(base, settings):
        settings["training.recompute_policy"] = "op"
    steps = training.get("steps")
    if isinstance(steps, int) and steps > 0 and "training.global_batch_size" in settings:
        per_step = settings["training.global_batch_size"] * seq
        kept = run_tokens(base) if base is not None else None
        if kept is None or math.ceil(kept / per_step) != steps:
            settings["training.tokens"] = float(steps * per_step)
            settings["training.tokens_per_parameter"] = None
    return ReadSettings(settings=settings, owned=tuple(owned))
