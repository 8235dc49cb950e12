"""Hugging Face Trainer and accelerate: `TrainingArguments` as JSON (what
`HfArgumentParser.parse_json_file` reads), an accelerate config file and the `accelerate
launch` line; a ZeRO layout adds the DeepSpeed config (`llmpar.launch.deepspeed`).

Names follow the installed transformers' `TrainingArguments` dataclass and `FSDPOption`
(transformers/training_args.py, trainer_utils.py) and accelerate's `ClusterConfig`
(accelerate/commands/config/config_args.py), whose fsdp_config / deepspeed_config keys are
`accelerate launch`'s options (accelerate/commands/launch.py), at the versions recorded in
`validation/data/launch/hf-trainer.json`, against which the tests check what is written.
The Trainer shards data only: FSDP (ZeRO-3 of every state; accelerate's FSDP2 with
fsdp_version 2), DeepSpeed ZeRO-1/2/3, or DDP; tensor, pipeline, context and expert
parallelism are listed as not mapped.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import (
    accumulation_steps,
    number_or_text,
    run_tokens,
    steps_of,
    training_only,
)
from llmpar.launch.deepspeed import DeepSpeedTarget, read_config
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "transformers 5.24.0, accelerate 1.15.0"
MIXED = {"bf16": "bf16", "fp16": "fp16"}
FSDP_OPTIONS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard",
                "hybrid_shard_zero2", "offload", "auto_wrap")
"""transformers' FSDPOption values (trainer_utils.py)."""
YAML_WORDS = ("yes", "no", "on", "off", "y", "n", "true", "false", "null")
"""Plain words YAML 1.1 loaders (PyYAML's, which accelerate uses) read as booleans or
null: written quoted (`distributed_type: "NO"`)."""


def _uses_fsdp(spec: Spec) -> bool:
    data = spec.parallel.get("data")
    return data is not None and data.stage == 3 and data.fsdp


def _uses_deepspeed(spec: Spec) -> bool:
    data = spec.parallel.get("data")
    return data is not None and data.stage > 0 and not _uses_fsdp(spec)


@attrs.frozen
class HfTrainerTarget:
    """`TrainingArguments` JSON, an accelerate config and the `accelerate launch` line."""

    name: str = "hf-trainer"
    aliases: tuple[str, ...] = ("trainer", "accelerate", "transformers")
    description: str = ("Hugging Face TrainingArguments, an accelerate config and the "
                        "accelerate launch line")

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        ledger = Ledger(spec, "the Hugging Face Trainer")
        notes: list[str] = []
        training = spec.training
        arguments: dict[str, Any] = {
            "output_dir": "out",
            "per_device_train_batch_size": training.micro_batch_size,
            "gradient_accumulation_steps": accumulation_steps(spec, layout),
        }
        ledger.take("training.micro_batch_size", "training.global_batch_size",
                    "training.sequence_length", "training.tokens",
                    "training.tokens_per_parameter", "parallel.data.degree",
                    "hardware.num_gpus", "hardware.gpus_per_node", "model", "optimizer")
        if (steps := steps_of(spec, layout)) is not None:
            arguments["max_steps"] = steps
        compute = spec.precision.compute
        if compute in MIXED:
            arguments[compute] = True
        elif compute != "fp32":
            ledger.cannot("precision.compute", "the Trainer computes in bf16, fp16 or fp32",
                          compute)
        ledger.take("precision")
        notes.append(f"the weights are kept in the format the model is loaded in "
                     f"(torch_dtype); the plan's is {spec.precision.weights}")
        if training.recompute == "full" and training.recompute_layers is None:
            arguments["gradient_checkpointing"] = True
        elif training.recompute != "none":
            ledger.cannot("training.recompute", "the Trainer checkpoints every layer "
                          "(gradient_checkpointing) or none", training.recompute)
        ledger.take("training.recompute")
        ledger.cannot("training.recompute_layers", "the Trainer checkpoints every layer")
        ledger.cannot("training.activation_offload_layers", "not a Trainer setting")
        ledger.cannot("finetune", "the adapter is peft's config (LoraConfig: r, lora_alpha, "
                      "lora_dropout, target_modules), given to your model, not to the "
                      "Trainer")
        for name in ("tensor", "pipeline", "context", "expert"):
            if layout.degree(name) > 1:
                ledger.cannot(f"parallel.{name}", "the Trainer and accelerate's FSDP and "
                              "DeepSpeed plugins shard data only", layout.degree(name))
            elif name in spec.parallel:
                ledger.take(f"parallel.{name}")
        if "sequence" in spec.parallel and layout.degree("tensor") == 1:
            ledger.take("parallel.sequence")
        hardware = spec.hardware
        config: dict[str, Any] = {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "MULTI_GPU" if layout.num_gpus > 1 else "NO",
            "mixed_precision": MIXED.get(compute, "no"),
            "num_machines": hardware.num_nodes,
            "num_processes": layout.num_gpus,
            "machine_rank": 0,
        }
        files: list[LaunchFile] = []
        data = spec.parallel.get("data")
        if _uses_fsdp(spec):
            assert data is not None
            fsdp = {"version": 2, "reshard_after_forward": data.reshard_after_forward,
                    "transformer_layer_cls_to_wrap": ["$DECODER_LAYER"]}
            arguments["fsdp"] = "full_shard auto_wrap"
            arguments["fsdp_config"] = fsdp
            config["distributed_type"] = "FSDP"
            config["fsdp_config"] = {
                "fsdp_version": 2, "fsdp_reshard_after_forward": data.reshard_after_forward,
                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                "fsdp_activation_checkpointing": bool(arguments.get("gradient_checkpointing"))}
            ledger.take("parallel.data.zero", "parallel.data.fsdp",
                        "parallel.data.reshard_after_forward", "parallel.data.reduce_dtype",
                        "parallel.data.overlap_grad_reduce",
                        "parallel.data.overlap_param_gather")
            if data.shard_degree is not None and data.shard_degree != layout.degree("data"):
                ledger.cannot("parallel.data.shard_degree", "hybrid sharding needs "
                              "accelerate's parallelism_config, not mapped", data.shard_degree)
            ledger.cannot("parallel.data.gradient_sync", "the Trainer synchronises "
                          "gradients at the last micro-batch (accelerate's no_sync)")
            notes.append("$DECODER_LAYER is your model's decoder-layer class name "
                         "(LlamaDecoderLayer)")
        elif _uses_deepspeed(spec):
            deepspeed = DeepSpeedTarget().launch(spec, layout)
            files.append(deepspeed.files[0])
            arguments["deepspeed"] = deepspeed.files[0].name
            config["distributed_type"] = "DEEPSPEED"
            config["deepspeed_config"] = {
                "deepspeed_config_file": deepspeed.files[0].name,
                "zero3_init_flag": data is not None and data.stage == 3}
            ledger.take("parallel.data", "parallel.offload")
            # what the DeepSpeed config cannot say of the data and offload settings
            ledger.skipped.extend(u for u in deepspeed.unmapped if u.path.startswith(
                ("$.parallel.data", "$.parallel.offload")))
        elif data is not None:
            ledger.take("parallel.data")
        if hardware.num_nodes > 1:
            config["main_process_ip"] = "$MASTER_ADDR"
            config["main_process_port"] = 29500
            notes.append("run the line on every node with its own --machine_rank")
        notes.append("train.py is your script: HfArgumentParser(TrainingArguments)"
                     ".parse_json_file(sys.argv[1]) and a Trainer over your model and data")
        launcher = ("accelerate launch --config_file accelerate_config.yaml"
                    + (" --machine_rank $NODE_RANK" if hardware.num_nodes > 1 else "")
                    + " train.py training_args.json")
        files = [LaunchFile("training_args.json", json.dumps(arguments, indent=2) + "\n",
                            "TrainingArguments"),
                 LaunchFile("accelerate_config.yaml", yaml_text(config),
                            "the accelerate config"),
                 *files,
                 LaunchFile("launch.sh", f"#!/bin/sh\n{launcher}\n", "the launcher line",
                            in_command=True)]
        return Launch(target=self.name, framework_version=VERSION, files=tuple(files),
                      command=launcher, unmapped=ledger.unmapped(), notes=tuple(notes))

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        table = load_mapping(text, source)
        if "distributed_type" in table:
            return read_accelerate(table, source, base)
        return read_training_arguments(table, source, base)


def _scalar_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return json.dumps(value)
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z_][\w.\-]*", text) and text.lower() not in YAML_WORDS
    return text if plain else json.dumps(text)


def yaml_text(table: dict[str, Any]) -> str:
    """A mapping of scalars and mappings of scalars in YAML's block style (flow lists)."""
    lines = []
    for key, value in table.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {k}: {_scalar_text(v)}" for k, v in value.items())
        else:
            lines.append(f"{key}: {_scalar_text(value)}")
    return "\n".join(lines) + "\n"


def _yaml_scalar(text: str) -> Any:
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text in ("null", "~", ""):
        return None
    if text.startswith(('"', "[")):
        return json.loads(text)
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1]
    return number_or_text(text)


def load_mapping(text: str, source: str) -> dict[str, Any]:
    """A JSON object, or the block YAML an accelerate config is: `key: value` lines and
    one level of nested mappings; anything else is a Problem naming its line."""
    if text.lstrip().startswith("{"):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([Problem("$", f"not JSON: {exc}")], source) from None
        if not isinstance(loaded, dict):
            raise SpecError([Problem("$", "expected a JSON object")], source)
        return dict(loaded)
    table: dict[str, Any] = {}
    inner: dict[str, Any] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.split(" #", 1)[0].rstrip()
        if not stripped.strip() or stripped.lstrip().startswith("#"):
            continue
        key, colon, value = stripped.strip().partition(":")
        if not colon or key.startswith("-"):
            raise SpecError([Problem(f"$ (line {number})", "expected `key: value` (llmpar "
                                     f"reads block mappings), got {line.strip()!r}")], source)
        try:
            parsed = _yaml_scalar(value.strip())
        except json.JSONDecodeError:
            raise SpecError([Problem(f"$.{key}", f"cannot read {value.strip()!r}")],
                            source) from None
        if line.startswith((" ", "\t")):
            if inner is None:
                raise SpecError([Problem(f"$ (line {number})", "indented key outside a "
                                                                 "mapping")], source)
            inner[key] = parsed
        elif not value.strip():
            inner = table[key] = {}
        else:
            table[key], inner = parsed, None
    return table


def _integer(table: dict[str, Any], key: str, path: str, problems: list[Problem]) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(Problem(path, f"expected an integer >= 1, got {value!r}"))
        return None
    return value


def _data_replicas(base: Spec | None) -> int | None:
    """The base's data ranks: its GPUs over its other degrees (the Trainer shards data
    only, so every GPU of a spec it can run is a data rank)."""
    if base is None:
        return None
    others = math.prod(int(config.degree) for name, config in base.parallel.items()
                       if name in ("tensor", "pipeline", "context") and config.degree > 0)
    return int(base.hardware.num_gpus) // max(1, others)


def read_training_arguments(table: dict[str, Any], source: str,
                            base: Spec | None = None) -> ReadSettings:
    """Spec settings from `TrainingArguments` as JSON: the batch, the run's steps, the
    number format, gradient checkpointing and FSDP or DeepSpeed (an inline DeepSpeed
    config is read as `--from deepspeed` reads one; a file name is a note)."""
    problems: list[Problem] = []
    settings: dict[str, Any] = {}
    notes: list[str] = []
    micro = _integer(table, "per_device_train_batch_size", "$.per_device_train_batch_size",
                     problems) or (base.training.micro_batch_size if base else 8)
    accumulation = _integer(table, "gradient_accumulation_steps",
                            "$.gradient_accumulation_steps", problems) or 1
    settings["training.micro_batch_size"] = micro
    replicas = _data_replicas(base)
    batch = None if replicas is None else micro * accumulation * replicas
    if batch is not None:
        settings["training.global_batch_size"] = batch
    steps = _integer(table, "max_steps", "$.max_steps", problems) if table.get(
        "max_steps", -1) != -1 else None
    if steps is not None and batch is not None and base is not None:
        per_step = batch * base.training.sequence_length
        kept = run_tokens(base)
        if kept is None or math.ceil(kept / per_step) != steps:
            settings["training.tokens"] = float(steps * per_step)
            settings["training.tokens_per_parameter"] = None
    formats = [name for name in ("bf16", "fp16") if table.get(name) is True]
    for key in ("activations", "compute"):
        settings[f"precision.{key}"] = formats[0] if formats else "fp32"
    checkpointing = table.get("gradient_checkpointing")
    settings["training.recompute"] = "full" if checkpointing else "none"
    if checkpointing:
        settings["training.recompute_layers"] = None
    fsdp = table.get("fsdp") or ""
    if not isinstance(fsdp, str | list):
        problems.append(Problem("$.fsdp", f"expected a string of FSDP options, got {fsdp!r}"))
        fsdp = ""
    options = set(fsdp.split() if isinstance(fsdp, str) else fsdp)
    fsdp_config = table.get("fsdp_config") or {}
    if not isinstance(fsdp_config, dict):
        notes.append("fsdp_config names a file: read its reshard_after_forward yourself")
        fsdp_config = {}
    unknown = options - set(FSDP_OPTIONS)
    if unknown:
        problems.append(Problem("$.fsdp", f"unknown FSDP options {sorted(unknown)}; "
                                          f"TrainingArguments takes {', '.join(FSDP_OPTIONS)}"))
    if options & {"full_shard", "hybrid_shard"}:
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 3, True
        reshard = fsdp_config.get("reshard_after_forward", True)
        settings["parallel.data.reshard_after_forward"] = bool(reshard)
        if "hybrid_shard" in options and base is not None:
            settings["parallel.data.shard_degree"] = base.hardware.gpus_per_node
    elif options & {"shard_grad_op", "hybrid_shard_zero2"}:
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 2, False
        notes.append("FSDP's shard_grad_op shards gradients and optimizer states: "
                     "llmpar's ZeRO-2")
    deepspeed = table.get("deepspeed")
    if isinstance(deepspeed, dict):
        read = read_config(json.dumps(deepspeed), source, base)
        settings.update({k: v for k, v in read.settings.items()
                         if k.startswith("parallel.data.")})
    elif isinstance(deepspeed, str):
        notes.append(f"deepspeed names {deepspeed}: read it with --from deepspeed")
    elif not options & {"full_shard", "hybrid_shard", "shard_grad_op", "hybrid_shard_zero2"}:
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 0, False
    if problems:
        raise SpecError(problems, source)
    return ReadSettings(settings=_no_empty_data(settings, base), notes=tuple(notes))


def _no_empty_data(settings: dict[str, Any], base: Spec | None) -> dict[str, Any]:
    """Plain data parallelism over a base without a [parallel.data] table adds none."""
    if (base is not None and "data" not in base.parallel
            and settings.get("parallel.data.zero") == 0):
        return {k: v for k, v in settings.items() if not k.startswith("parallel.data.")}
    return settings


def read_accelerate(table: dict[str, Any], source: str,
                    base: Spec | None = None) -> ReadSettings:
    """Spec settings from an accelerate config: the GPUs, the number format, and FSDP or
    DeepSpeed's ZeRO stage (its config file is a note: read it with --from deepspeed)."""
    problems: list[Problem] = []
    settings: dict[str, Any] = {}
    notes: list[str] = []
    kinds = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")
    kind = table.get("distributed_type")
    if kind not in kinds:
        problems.append(Problem("$.distributed_type", f"llmpar reads {', '.join(kinds)}, "
                                                      f"got {kind!r}"))
    gpus = _integer(table, "num_processes", "$.num_processes", problems)
    if gpus is not None:
        settings["hardware.num_gpus"] = gpus
    mixed = table.get("mixed_precision", "no")
    if mixed not in ("no", "bf16", "fp16"):
        problems.append(Problem("$.mixed_precision", f"llmpar reads no, bf16 or fp16, got "
                                                     f"{mixed!r}"))
    else:
        for key in ("activations", "compute"):
            settings[f"precision.{key}"] = MIXED.get(mixed, "fp32")
    if kind == "FSDP":
        fsdp = table.get("fsdp_config") or {}
        strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD"))
        if strategy in ("SHARD_GRAD_OP", "2"):
            settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 2, False
        else:
            settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 3, True
            settings["parallel.data.reshard_after_forward"] = bool(
                fsdp.get("fsdp_reshard_after_forward", True))
        checkpointing = fsdp.get("fsdp_activation_checkpointing")
        if checkpointing is not None:
            settings["training.recompute"] = "full" if checkpointing else "none"
    elif kind == "DEEPSPEED":
        deepspeed = table.get("deepspeed_config") or {}
        stage = deepspeed.get("zero_stage")
        if stage is not None:
            if stage not in (0, 1, 2, 3):
                problems.append(Problem("$.deepspeed_config.zero_stage", f"must be 0 to 3, "
                                                                         f"got {stage!r}"))
            else:
                settings["parallel.data.zero"], settings["parallel.data.fsdp"] = stage, False
        if "deepspeed_config_file" in deepspeed:
            notes.append(f"the ZeRO stage is in {deepspeed['deepspeed_config_file']}: read "
                         "it with --from deepspeed")
    elif kind in ("NO", "MULTI_GPU"):
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 0, False
    if problems:
        raise SpecError(problems, source)
    return ReadSettings(settings=_no_empty_data(settings, base), notes=tuple(notes))
