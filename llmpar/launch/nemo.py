"""NeMo 2 and Megatron-Bridge: recipe overrides for a training spec, and such overrides
read back.

Both train through Megatron-Core, whose configuration dataclasses (ModelParallelConfig,
TransformerConfig, DistributedDataParallelConfig, OptimizerConfig) hold what Megatron-LM's
arguments set, under the arguments' dest names (megatron/training/arguments.py builds its
flags from those fields). So the overrides are the Megatron-LM arguments llmpar writes
(`llmpar.launch.megatron`), each put at its place in the framework's configuration, and
reading overrides back turns them into those arguments and reads them as Megatron's:

- Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge, src/megatron/bridge/training/config.py
  `ConfigContainer`): `model.*` (GPTModelProvider: parallelism and architecture),
  `train.*`, `ddp.*`, `optimizer.*`, `dataset.seq_length`, `dist.*` (FSDP),
  `checkpoint.*`, `comm_overlap.*` and `mixed_precision`, given as the trailing KEY=VALUE
  overrides of scripts/training/run_recipe.py.
- NeMo 2 (NVIDIA/NeMo, nemo/collections/llm/recipes: `run.Partial(pretrain, model,
  trainer, data, optim)`): `trainer.strategy.*` (MegatronStrategy), `trainer.strategy.ddp.*`,
  `model.config.*` (GPTConfig), `data.*`, `optim.config.*`, `trainer.plugins.precision`
  (MegatronMixedPrecision) and `trainer.max_steps`, given to `nemo llm pretrain --factory`.

The paths are checked against the fields read from those sources
(`validation/data/launch/megatron-bridge.json` and `nemo.json`).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import (
    Argument,
    argument_lines,
    number_or_text,
    torchrun,
    training_only,
)
from llmpar.launch.megatron import (
    _model_arguments,
    _parallel_arguments,
    _training_arguments,
    layer_pattern,
    read_arguments,
)
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings, Unmapped
from llmpar.spec import Spec
from llmpar.strategy import Layout

MISSING = object()
"""A row's value when its flag is absent: write nothing (the recipe's value stays)."""


@attrs.frozen
class Row:
    """One Megatron-LM argument at its config paths.

    `kind`: "value" (the flag's value, typed), "list" (its several values), "switch"
    (true when the flag is given), "negated" (false when given), "present" (true when
    the flag is given; a companion field, not read back), "pattern" (a --moe-layer-freq
    list). `absent` is written when the flag is not given (the recipe's own value would
    differ from what Megatron-LM runs without it); `architecture` rows only for a model
    given by its shape."""

    flag: str
    kind: str
    paths: tuple[str, ...]
    absent: Any = MISSING
    architecture: bool = False


@attrs.frozen
class Choice:
    """One config value that stands for one of several switches (the number format, the
    FSDP implementation): value -> flag (None: none of them)."""

    path: str
    flags: Mapping[Any, str | None]


@attrs.frozen
class Dialect:
    """Where one framework keeps the settings: its rows and choices, and how its override
    syntax writes true, false and null (OmegaConf's YAML words for Bridge, Python literals
    for NeMo-Run)."""

    name: str
    version: str
    rows: tuple[Row, ...]
    choices: tuple[Choice, ...]
    true: str
    false: str
    null: str


def _rows(parallel: str, model: str, ddp: str, optim: str, batch: str) -> list[Row]:
    """The rows both frameworks share, under their section prefixes."""
    value, switch = "value", "switch"
    rows = [
        Row("--tensor-model-parallel-size", value, (f"{parallel}tensor_model_parallel_size",)),
        Row("--pipeline-model-parallel-size", value,
            (f"{parallel}pipeline_model_parallel_size",)),
        Row("--num-virtual-stages-per-pipeline-rank", value,
            (f"{parallel}virtual_pipeline_model_parallel_size",), None),
        Row("--sequence-parallel", switch, (f"{parallel}sequence_parallel",), False),
        Row("--context-parallel-size", value, (f"{parallel}context_parallel_size",), 1),
        Row("--expert-model-parallel-size", value, (f"{parallel}expert_model_parallel_size",),
            1),
        Row("--expert-tensor-parallel-size", value,
            (f"{parallel}expert_tensor_parallel_size",)),
        Row("--cp-comm-type", value, (f"{model}cp_comm_type",)),
        Row("--hierarchical-context-parallel-sizes", "list",
            (f"{model}hierarchical_context_parallel_sizes",)),
        Row("--moe-token-dispatcher-type", value, (f"{model}moe_token_dispatcher_type",)),
        Row("--moe-enable-deepep", switch, (f"{model}moe_enable_deepep",)),
        Row("--overlap-moe-expert-parallel-comm", switch,
            (f"{model}overlap_moe_expert_parallel_comm",)),
        Row("--use-distributed-optimizer", switch, (f"{ddp}use_distributed_optimizer",
                                                    f"{optim}use_distributed_optimizer"),
            False),
        Row("--overlap-grad-reduce", switch, (f"{ddp}overlap_grad_reduce",), False),
        Row("--overlap-param-gather", switch, (f"{ddp}overlap_param_gather",), False),
        # Megatron-LM reduces fp32 main gradients unless --grad-reduce-in-bf16
        Row("--grad-reduce-in-bf16", "negated", (f"{ddp}grad_reduce_in_fp32",), True),
        Row("--data-parallel-sharding-strategy", value,
            (f"{ddp}data_parallel_sharding_strategy",)),
        Row("--micro-batch-size", value, (f"{batch}micro_batch_size",)),
        Row("--global-batch-size", value, (f"{batch}global_batch_size",)),
        Row("--recompute-granularity", value, (f"{model}recompute_granularity",), None),
        Row("--recompute-method", value, (f"{model}recompute_method",), None),
        Row("--recompute-num-layers", value, (f"{model}recompute_num_layers",), None),
        Row("--cpu-offloading-num-layers", "present", (f"{model}cpu_offloading",), False),
        Row("--cpu-offloading-num-layers", value, (f"{model}cpu_offloading_num_layers",)),
        Row("--optimizer", value, (f"{optim}optimizer",)),
    ]
    architecture = [
        ("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
        ("--ffn-hidden-size", "ffn_hidden_size"),
        ("--num-attention-heads", "num_attention_heads"),
        ("--num-query-groups", "num_query_groups"), ("--kv-channels", "kv_channels"),
        ("--normalization", "normalization"),
        ("--position-embedding-type", "position_embedding_type"),
        ("--vocab-size", "vocab_size"), ("--q-lora-rank", "q_lora_rank"),
        ("--kv-lora-rank", "kv_lora_rank"), ("--qk-head-dim", "qk_head_dim"),
        ("--qk-pos-emb-head-dim", "qk_pos_emb_head_dim"), ("--v-head-dim", "v_head_dim"),
        ("--num-experts", "num_moe_experts"), ("--moe-router-topk", "moe_router_topk"),
        ("--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
        ("--moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size"),
        ("--moe-expert-capacity-factor", "moe_expert_capacity_factor")]
    rows += [Row(flag, value, (f"{model}{name}",), architecture=True)
             for flag, name in architecture]
    rows += [
        Row("--swiglu", switch, (f"{model}gated_linear_unit",), False, True),
        Row("--untie-embeddings-and-output-weights", "negated",
            (f"{model}share_embeddings_and_output_weights",), True, True),
        Row("--disable-bias-linear", "negated", (f"{model}add_bias_linear",), True, True),
        Row("--add-qkv-bias", switch, (f"{model}add_qkv_bias",), False, True),
        Row("--qk-layernorm", switch, (f"{model}qk_layernorm",), False, True),
        Row("--multi-latent-attention", switch, (f"{model}multi_latent_attention",),
            architecture=True),
        Row("--moe-layer-freq", "pattern", (f"{model}moe_layer_freq",), architecture=True),
        Row("--moe-router-enable-expert-bias", switch,
            (f"{model}moe_router_enable_expert_bias",), architecture=True),
    ]
    return rows


BRIDGE = Dialect(
    name="megatron-bridge", version="Megatron-Bridge 0.7.0 (commit 067f987d)",
    rows=(*_rows("model.", "model.", "ddp.", "optimizer.", "train."),
          Row("--no-overlap-p2p-communication", "negated", ("model.overlap_p2p_comm",)),
          Row("--tp-comm-overlap", "switch", ("comm_overlap.tp_comm_overlap",)),
          # run_recipe.py: the dataset owns the sequence length, model.seq_length follows
          Row("--seq-length", "value", ("dataset.seq_length", "model.seq_length")),
          Row("--train-iters", "value", ("train.train_iters",)),
          Row("--use-torch-fsdp2", "switch", ("dist.use_torch_fsdp2",), False),
          Row("--use-megatron-fsdp", "switch", ("dist.use_megatron_fsdp",
                                                "ddp.use_megatron_fsdp"), False),
          Row("--async-save", "switch", ("checkpoint.async_save",), False)),
    # training/mixed_precision.py: the registered recipes; no recipe is fp32
    choices=(Choice("mixed_precision", {"bf16_mixed": "--bf16", "fp16_mixed": "--fp16",
                                        None: None}),),
    true="true", false="false", null="null")
NEMO = Dialect(
    name="nemo", version="NeMo 2.6.0rc0 (commit 8cfedd72)",
    rows=(*_rows("trainer.strategy.", "model.config.", "trainer.strategy.ddp.",
                 "optim.config.", "data."),
          Row("--no-overlap-p2p-communication", "negated", ("model.config.overlap_p2p_comm",)),
          Row("--seq-length", "value", ("data.seq_length", "model.config.seq_length")),
          Row("--train-iters", "value", ("trainer.max_steps",)),
          Row("--async-save", "switch", ("trainer.strategy.ckpt_async_save",), False)),
    # MegatronMixedPrecision(precision=...) and MegatronStrategy(fsdp=...)
    choices=(Choice("trainer.plugins.precision", {"bf16-mixed": "--bf16",
                                                  "16-mixed": "--fp16", "32": None}),
             Choice("trainer.strategy.fsdp", {"pytorch": "--use-torch-fsdp2",
                                              "megatron": "--use-megatron-fsdp",
                                              None: None})),
    true="True", false="False", null="None")
NO_PATH = {"nemo": {"--tp-comm-overlap": "NeMo 2 turns it on through "
                                         "MegatronCommOverlapCallback(tp_comm_overlap=True) "
                                         "in trainer.callbacks, not a config path"}}
"""Megatron-LM arguments a framework has no config path for, and why."""
IMPLIED = {"--group-query-attention": "num_query_groups", "--bf16": "", "--fp16": "",
           "--max-position-embeddings": "seq_length",
           "--num-layers-per-virtual-pipeline-stage": "virtual_pipeline_model_parallel_size"}
"""Arguments the config states another way: GQA by num_query_groups, the number format
by a choice, the learned position table by seq_length (GPTModelProvider and GPTConfig have
no max_position_embeddings), the virtual stages by their count."""


def _literal(value: Any, dialect: Dialect) -> str:
    if value is True:
        return dialect.true
    if value is False:
        return dialect.false
    if value is None:
        return dialect.null
    if isinstance(value, list | tuple):
        return "[" + ",".join(_literal(v, dialect) for v in value) + "]"
    return str(value)


def _pattern(text: str) -> list[int]:
    """A --moe-layer-freq list llmpar writes (`([0]*k+[1]*n)` or `[0,1,...]`) written
    out, as the config field holds it."""
    value = layer_pattern(text)
    assert isinstance(value, list)
    return value


def overrides_of(arguments: list[Argument], dialect: Dialect, layers: int,
                 pipeline: int) -> tuple[dict[str, Any], list[str]]:
    """The config overrides the Megatron-LM arguments say, and the arguments this
    framework has no path for."""
    found: dict[str, str | tuple[str, ...] | None] = dict(arguments)
    per_stage = found.pop("--num-layers-per-virtual-pipeline-stage", None)
    if isinstance(per_stage, str):
        found["--num-virtual-stages-per-pipeline-rank"] = str(layers // (pipeline
                                                                         * int(per_stage)))
    has_shape = "--num-layers" in found
    out: dict[str, Any] = {}
    used = set(IMPLIED)
    for row in dialect.rows:
        if row.architecture and not has_shape:
            continue
        given = row.flag in found
        used.add(row.flag)
        raw = found.get(row.flag)
        if row.kind == "value":
            value = number_or_text(raw) if isinstance(raw, str) else row.absent
        elif row.kind == "list":
            value = [number_or_text(v) for v in raw] if isinstance(raw, tuple) else row.absent
        elif row.kind == "pattern":
            value = _pattern(raw) if isinstance(raw, str) else row.absent
        elif row.kind in ("switch", "present"):
            value = True if given else row.absent
        else:  # negated
            value = False if given else row.absent
        if row.flag == "--no-overlap-p2p-communication" and pipeline > 1:
            value = not given  # Megatron-Core's default is off, Megatron-LM's on
        if value is not MISSING:
            out.update({path: value for path in row.paths})
    for choice in dialect.choices:
        chosen = [v for v, flag in choice.flags.items() if flag is not None and flag in found]
        default = [v for v, flag in choice.flags.items() if flag is None]
        if chosen or default:
            out[choice.path] = (chosen or default)[0]
        used.update(flag for flag in choice.flags.values() if flag is not None)
    left = [flag for flag in found if flag not in used]
    return out, left


def override_lines(overrides: Mapping[str, Any], dialect: Dialect) -> list[str]:
    return [f"{key}={_literal(value, dialect)}" for key, value in overrides.items()]


@attrs.frozen
class NemoTarget:
    """Recipe overrides for NeMo 2 (`nemo llm pretrain --factory RECIPE`) or, as
    `megatron-bridge`, for Megatron-Bridge's run_recipe.py."""

    name: str = "nemo"
    aliases: tuple[str, ...] = ("nemo2", "nemo-run")
    description: str = "NeMo 2 recipe overrides (nemo llm pretrain --factory)"
    dialect: Dialect = NEMO

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        dialect = self.dialect
        framework = "NeMo 2" if dialect is NEMO else "Megatron-Bridge"
        ledger = Ledger(spec, framework)
        notes: list[str] = []
        arguments = [*_parallel_arguments(spec, layout, ledger),
                     *_model_arguments(spec, ledger, notes),
                     *_training_arguments(spec, layout, ledger, notes)]
        ledger.take("hardware.num_gpus", "hardware.gpus_per_node")
        overrides, left = overrides_of(arguments, dialect, spec.model.num_layers or 0,
                                       layout.degree("pipeline"))
        unmapped = list(ledger.unmapped())
        reasons = NO_PATH.get(dialect.name, {})
        unmapped += [Unmapped(f"$.{flag}", "true", reasons.get(
            flag, f"no {framework} config path is mapped for Megatron-LM's {flag}"))
            for flag in left]
        model = spec.model
        if (model.position_embedding == "learned" and model.max_position_embeddings
                is not None and model.max_position_embeddings != spec.training.sequence_length):
            unmapped.append(Unmapped("$.model.max_position_embeddings",
                                     str(model.max_position_embeddings),
                                     f"{framework}'s learned position table has seq_length "
                                     "rows"))
        if model.ffn_activation == "swiglu" and model.has_architecture:
            notes.append("SwiGLU is gated_linear_unit with activation_func silu: the "
                         "Llama-style recipes' own; set it where your recipe's differs")
        model_path = "model.config." if dialect is NEMO else "model."
        named = {"--train-iters": "trainer.max_steps" if dialect is NEMO
                 else "train.train_iters", "--rotary-base": f"{model_path}rotary_base",
                 "--make-vocab-size-divisible-by": f"{model_path}make_vocab_size_divisible_by"}
        for flag, path in named.items():  # the notes name the config fields, not the flags
            notes = [note.replace(flag, path) for note in notes]
        notes = [f"llmpar's model has no RoPE base: the recipe's {model_path}rotary_base "
                 "stays; check it is your model's" if note.startswith("llmpar's model has "
                                                                        "no RoPE base")
                 else note for note in notes]
        hardware = spec.hardware
        per_node = min(hardware.gpus_per_node, hardware.num_gpus)
        if dialect is NEMO:
            overrides = {"trainer.num_nodes": hardware.num_nodes, "trainer.devices": per_node,
                         **overrides}
            launcher = 'nemo llm pretrain --factory "$RECIPE" -y'
            notes.append("$RECIPE is a nemo.collections.llm recipe (llama3_8b, ...) whose "
                         "model is yours; data, tokenizer, the learning-rate schedule and "
                         "checkpoints are the recipe's")
        else:
            launcher = torchrun(spec, 'scripts/training/run_recipe.py --recipe "$RECIPE"')
            notes.append("$RECIPE is a Megatron-Bridge recipe function (llama3_8b_pretrain_"
                         "config, ...); a recipe's comm_overlap (CommOverlapConfig) also sets "
                         "overlap_p2p_comm, overlap_grad_reduce and overlap_param_gather: give "
                         "comm_overlap.* the same values where your recipe sets them")
        if "comm_overlap.tp_comm_overlap" in overrides:
            notes.append("comm_overlap.tp_comm_overlap needs a recipe that sets comm_overlap "
                         "(CommOverlapConfig; it is None by default, and Bridge's struct "
                         "config has no keys under None)")
        lines = override_lines(overrides, dialect)
        command = " \\\n    ".join([launcher, *(shlex.quote(line) for line in lines)])
        return Launch(
            target=self.name, framework_version=dialect.version,
            files=(LaunchFile("overrides.txt", "".join(f"{line}\n" for line in lines),
                              f"{framework} config overrides, one per line", in_command=True),
                   LaunchFile("launch.sh", f"#!/bin/sh\n{command}\n",
                              "the launcher line" + ("" if dialect is NEMO else
                                                     " (run it on every node)"),
                              in_command=True)),
            command=command, unmapped=tuple(unmapped), notes=tuple(notes))

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_overrides(text, source, self.dialect, base)


KEY = re.compile(r"[A-Za-z_][\w.]*$")


def _parse(text: str) -> Any:
    """An override's value: true/false/null (either spelling), a number, a list, else
    the text (quotes removed)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        # (TypeError: an unhashable key such as {[1]: 2}; the others: a text nested
        # deeper than the parser goes)
        return text.strip().strip("'\"")


def split_overrides(text: str, source: str) -> dict[str, str]:
    """KEY=VALUE words (a file of them, one per line, or the whole launcher line: words
    without `=`, and options, are the launcher's)."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise SpecError([Problem("$", f"cannot split the overrides: {exc}")], source) from None
    found: dict[str, str] = {}
    for word in words:
        key, equals, value = word.partition("=")
        if equals and not key.startswith("-") and KEY.match(key):
            found[key.lstrip("+")] = value
    return found


def read_overrides(text: str, source: str, dialect: Dialect,
                   base: Spec | None = None) -> ReadSettings:
    """Spec settings from a framework's config overrides, read as the Megatron-LM
    arguments they stand for; a malformed value is a Problem naming its key, keys llmpar
    does not model a note."""
    found = split_overrides(text, source)
    values = {key: _parse(value) for key, value in found.items()}
    problems: list[Problem] = []
    arguments: list[Argument] = []
    keys: dict[str, str] = {}
    used: set[str] = set()
    for row in dialect.rows:
        given = [path for path in row.paths if path in values]
        used.update(given)
        if not given or row.kind == "present":
            continue
        path = given[0]
        value = values[path]
        if any(values[other] != value for other in given[1:]):
            problems.append(Problem(f"$.{given[1]}", f"must equal {path} ({value!r}), got "
                                                     f"{values[given[1]]!r}"))
            continue
        keys[row.flag] = path
        if row.kind in ("switch", "negated"):
            if not isinstance(value, bool):
                problems.append(Problem(f"$.{path}", f"expected true or false, got "
                                                     f"{found[path]!r}"))
            elif value is (row.kind == "switch"):
                arguments.append((row.flag, None))
        elif value is None or (row.kind == "value" and value == row.absent):
            continue  # what Megatron-LM runs without the flag
        elif row.kind == "list":
            if not isinstance(value, list):
                problems.append(Problem(f"$.{path}", f"expected a list, got {found[path]!r}"))
            else:
                arguments.append((row.flag, tuple(str(v) for v in value)))
        elif row.kind == "pattern":
            arguments.append((row.flag, json.dumps(value).replace(" ", "")
                              if isinstance(value, list) else str(value)))
        else:
            arguments.append((row.flag, found[path].strip().strip("'\"")))
    for choice in dialect.choices:
        if choice.path not in values:
            continue
        used.add(choice.path)
        value = values[choice.path]
        if value not in choice.flags:
            listed = ", ".join(_literal(v, dialect) for v in choice.flags)
            problems.append(Problem(f"$.{choice.path}", f"must be one of {listed}, got "
                                                        f"{found[choice.path]!r}"))
            continue
        flag = choice.flags[value]
        if flag is not None:
            arguments.append((flag, None))
            keys[flag] = choice.path
    if any(flag == "--num-query-groups" for flag, _ in arguments):
        arguments.append(("--group-query-attention", None))
    settings: dict[str, Any] = {}
    if dialect is NEMO:
        nodes, devices = values.get("trainer.num_nodes"), values.get("trainer.devices")
        used.update(("trainer.num_nodes", "trainer.devices"))
        for key, number in (("trainer.num_nodes", nodes), ("trainer.devices", devices)):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int)
                                       or number < 1):
                problems.append(Problem(f"$.{key}", f"expected an integer >= 1, got "
                                                    f"{found[key]!r}"))
        if isinstance(nodes, int) and isinstance(devices, int) and not problems:
            settings["hardware.num_gpus"] = nodes * devices
    if problems:
        raise SpecError(problems, source)
    try:
        read = read_arguments(argument_lines(arguments), source, base)
    except SpecError as error:  # name the override, not the flag it stands for
        raise SpecError([Problem(_key_path(problem.path, keys), problem.message)
                         for problem in error.problems], source) from None
    notes = list(read.notes)
    ignored = sorted(set(found) - used)
    if ignored:
        notes.append(f"ignored: {', '.join(ignored)} (not modelled)")
    return ReadSettings(settings={**read.settings, **settings}, owned=read.owned,
                        notes=tuple(notes))


def _key_path(path: str, keys: Mapping[str, str]) -> str:
    flag = path.removeprefix("$.")
    return f"$.{keys[flag]}" if flag in keys else path


BRIDGE_TARGET = NemoTarget(name="megatron-bridge", aliases=("bridge", "mbridge"),
                           description="Megatron-Bridge recipe overrides (run_recipe.py "
                                       "KEY=VALUE)", dialect=BRIDGE)
"""The Megatron-Bridge target: the same mapping, Bridge's paths."""
