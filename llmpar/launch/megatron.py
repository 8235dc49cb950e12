"""Megatron-LM / Megatron-Core: `pretrain_gpt.py` arguments and the torchrun line, and
such an argument list read back.

Argument names and meanings follow NVIDIA/Megatron-LM `megatron/training/arguments.py`
and the dataclasses its ArgumentGroupFactory turns into arguments
(`megatron/core/model_parallel_config.py`, `megatron/core/transformer/
transformer_config.py`, `megatron/training/config/`), at the commit recorded in
`validation/data/launch/megatron-lm.json`, against which the tests check every flag
written here.
"""

from __future__ import annotations

import ast
import math
import shlex
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.launch.common import (
    Argument,
    argument_lines,
    command_line,
    global_batch,
    run_tokens,
    steps_of,
    torchrun,
    training_only,
)
from llmpar.launch.flags import Words
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.loading.limits import MAX_LAYERS
from llmpar.placement import RANK_ORDER
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "Megatron-LM core 0.20.0 (commit d98e8a64)"
SCRIPT = "pretrain_gpt.py"
CP_COMM_TYPES = {"ring": "p2p", "all-to-all": "a2a", "hybrid": "a2a+p2p"}
DISPATCHERS = {"all-to-all": "alltoall", "deepep": "flex"}
VOCAB_PADDING = 128
"""`--make-vocab-size-divisible-by`'s default: Megatron pads the vocabulary to a multiple
of it times the tensor degree (megatron/training/tokenizer: `_vocab_size_with_padding`)."""


def _moe_layer_pattern(spec: Spec) -> str | None:
    """`--moe-layer-freq` as the list of which layers have experts, when not all do.
    Megatron's integer form marks layer i when i % freq == 0, llmpar's when (i + 1) %
    layer_frequency == 0, so the list is written out."""
    model = spec.model
    layers = model.num_layers or 0
    flags = [1 if model.is_moe_layer(i) else 0 for i in range(layers)]
    if all(flags):
        return None
    dense = next(i for i, f in enumerate(flags) if f) if any(flags) else layers
    if all(flags[dense:]):
        return f"([0]*{dense}+[1]*{layers - dense})"
    return "[" + ",".join(map(str, flags)) + "]"


@attrs.frozen
class MegatronTarget:
    """`pretrain_gpt.py` arguments for Megatron-LM (Megatron-Core models)."""

    name: str = "megatron-core"
    aliases: tuple[str, ...] = ("megatron", "megatron-lm", "mcore")
    description: str = "Megatron-LM pretrain_gpt.py arguments and the torchrun line"

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        ledger = Ledger(spec, "Megatron-LM")
        notes: list[str] = []
        args = [*_parallel_arguments(spec, layout, ledger), *_model_arguments(spec, ledger,
                                                                              notes),
                *_training_arguments(spec, layout, ledger, notes)]
        ledger.take("hardware.num_gpus", "hardware.gpus_per_node")
        profile = spec.training.profile.name
        if spec.training.framework is not None and profile not in ("megatron-core", "nemo"):
            notes.append(f"the spec plans for framework {profile!r}: the plan's overlaps "
                         "and host costs are that stack's, not Megatron-LM's")
        notes.append("data and tokenizer are yours to add: --data-path (or --mock-data), "
                     "--tokenizer-type and its files, --lr and the schedule, --save/--load")
        launcher = torchrun(spec, SCRIPT)
        return Launch(
            target=self.name, framework_version=VERSION,
            files=(LaunchFile("pretrain_gpt.args", argument_lines(args),
                              f"{SCRIPT} arguments, one per line", in_command=True),
                   LaunchFile("launch.sh", "#!/bin/sh\n" + command_line(launcher, args)
                              + "\n", "the launcher line (run it on every node)",
                              in_command=True)),
            command=command_line(launcher, args), unmapped=ledger.unmapped(),
            notes=tuple(notes))

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        from llmpar.launch.megatron_args import is_namespace, read_namespace

        if is_namespace(text):  # a dump of the args a checkpoint stores
            return read_namespace(text, source, base)
        read = read_arguments(text, source, base)
        if "training.hidden_dropout" in read.settings:
            return read
        # an argument list without the flag runs at Megatron-LM's default, not the base's
        return attrs.evolve(read, settings={**read.settings,
                                            "training.hidden_dropout": MEGATRON_HIDDEN_DROPOUT})


def _parallel_arguments(spec: Spec, layout: Layout, ledger: Ledger) -> list[Argument]:
    parallel = spec.parallel
    t, p, c, e = (layout.degree(n) for n in ("tensor", "pipeline", "context", "expert"))
    args: list[Argument] = [("--tensor-model-parallel-size", str(t)),
                            ("--pipeline-model-parallel-size", str(p))]
    ledger.take("parallel.tensor.degree", "parallel.pipeline.degree", "parallel.data.degree")
    if (tensor := parallel.get("tensor")) is not None and not tensor.overlap_backward:
        ledger.cannot("parallel.tensor.overlap_backward", "Megatron-LM always overlaps the "
                      "input-gradient all-reduce with the weight-gradient product")
    if (pipeline := parallel.get("pipeline")) is not None:
        layers = spec.model.num_layers or 0
        v = pipeline.virtual_stages
        ledger.take("parallel.pipeline.schedule", "parallel.pipeline.virtual_stages")
        if pipeline.schedule == "interleaved" and v > 1:
            if layers % (p * v):
                ledger.cannot("parallel.pipeline.virtual_stages", f"{layers} layers do not "
                              f"split into {p} x {v} equal virtual stages")
            else:
                args.append(("--num-layers-per-virtual-pipeline-stage", str(layers // (p * v))))
        elif pipeline.schedule not in ("1f1b", "interleaved"):
            ledger.cannot("parallel.pipeline.schedule", "Megatron-LM runs 1F1B (or "
                          "interleaved) schedules only", pipeline.schedule)
        if pipeline.layers_per_stage is not None:
            ledger.cannot("parallel.pipeline.layers_per_stage", "uneven stages: Megatron-LM "
                          "takes only the first and last stage's counts "
                          "(--decoder-first/last-pipeline-num-layers)")
        if not pipeline.overlap_p2p and p > 1:
            # on by default (arguments.py: --no-overlap-p2p-communication, store_false)
            args.append(("--no-overlap-p2p-communication", None))
        ledger.take("parallel.pipeline.overlap_p2p")
        if not pipeline.scatter_gather:
            ledger.cannot("parallel.pipeline.scatter_gather", "no Megatron-LM argument for "
                          "sending whole boundary tensors")
    if layout.is_active("sequence") is True:
        args.append(("--sequence-parallel", None))
        sequence = parallel["sequence"]
        ledger.take("parallel.sequence.enabled")
        if sequence.comm_overlap == "pipelined":
            args.append(("--tp-comm-overlap", None))
        ledger.take("parallel.sequence.comm_overlap")
        ledger.cannot("parallel.sequence.overlap_splits", "Transformer Engine's userbuffers "
                      "split count is set in the --tp-comm-overlap-cfg YAML file")
        if not sequence.overlap_backward:
            ledger.cannot("parallel.sequence.overlap_backward", "Megatron-LM always overlaps "
                          "the input-gradient reduce-scatter")
    elif "sequence" in parallel:
        ledger.take("parallel.sequence")
    if (context := parallel.get("context")) is not None:
        ledger.take("parallel.context.degree", "parallel.context.kind",
                    "parallel.context.all_to_all_degree")
        if c > 1:
            args += [("--context-parallel-size", str(c)),
                     ("--cp-comm-type", CP_COMM_TYPES[context.kind])]
            if context.kind == "hybrid" and context.all_to_all_degree is not None:
                args.append(("--hierarchical-context-parallel-sizes",
                             (str(context.all_to_all_degree),
                              str(c // context.all_to_all_degree))))
    if (expert := parallel.get("expert")) is not None:
        ledger.take("parallel.expert.degree", "parallel.expert.tensor_degree",
                    "parallel.expert.dispatcher", "parallel.expert.overlap_a2a")
        if e > 1:
            args.append(("--expert-model-parallel-size", str(e)))
        if expert.tensor_degree is not None:
            args.append(("--expert-tensor-parallel-size", str(expert.tensor_degree)))
        if spec.model.moe is not None:
            args.append(("--moe-token-dispatcher-type", DISPATCHERS[expert.dispatcher]))
            if expert.dispatcher == "deepep":
                args.append(("--moe-enable-deepep", None))
        if expert.overlap_a2a:
            args.append(("--overlap-moe-expert-parallel-comm", None))
    args += _data_arguments(spec, layout, ledger)
    if spec.rank_order != RANK_ORDER:
        ledger.cannot("parallel.order", "Megatron-LM places ranks tp-cp-ep-dp-pp "
                      "(or tp-pp-dp with --use-tp-pp-dp-mapping) only")
    return args


def _data_arguments(spec: Spec, layout: Layout, ledger: Ledger) -> list[Argument]:
    data = spec.parallel.get("data")
    if data is None:
        return []
    args: list[Argument] = []
    ledger.take("parallel.data.zero", "parallel.data.fsdp", "parallel.data.overlap_grad_reduce",
                "parallel.data.overlap_param_gather", "parallel.data.reduce_dtype")
    if data.fsdp:
        args.append(("--use-torch-fsdp2", None))
    elif data.zero == 3:
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", "optim_grads_params")]
    elif data.zero == 2:
        ledger.cannot("parallel.data.zero", "Megatron-LM has no ZeRO-2; its distributed "
                      "optimizer (--use-distributed-optimizer) is ZeRO-1", 2)
    elif data.zero == 1:
        args.append(("--use-distributed-optimizer", None))
    if data.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce", None))
    if data.overlap_param_gather and data.stage >= 1:
        args.append(("--overlap-param-gather", None))
    if data.reduce_dtype == "bf16":
        args.append(("--grad-reduce-in-bf16", None))
    elif data.reduce_dtype not in ("gradients", spec.gradients_dtype):
        ledger.cannot("parallel.data.reduce_dtype", "Megatron-LM reduces fp32 main "
                      "gradients in fp32, or in bf16 with --grad-reduce-in-bf16")
    if data.shard_degree is not None:
        ledger.cannot("parallel.data.shard_degree", "hybrid sharding is not mapped to "
                      "Megatron-FSDP's arguments")
    for field in ("reshard_after_forward", "gradient_sync"):
        ledger.cannot(f"parallel.data.{field}", "not a Megatron-LM argument")
    return args


def _bias_arguments(spec: Spec, ledger: Ledger) -> list[Argument]:
    """Megatron's `add_bias_linear` (every linear layer, default on) and `add_qkv_bias`
    (the QKV projection only)."""
    model = spec.model
    ledger.take("model.linear_bias", "model.qkv_bias", "model.attention_output_bias",
                "model.mlp_bias")
    out = model.linear_bias or (model.attention_output_bias and model.mlp_bias)
    if model.linear_bias or (model.qkv_bias and out):
        return []
    args: list[Argument] = [("--disable-bias-linear", None)]
    if model.qkv_bias:
        args.append(("--add-qkv-bias", None))
    if model.attention_output_bias or model.mlp_bias:
        ledger.cannot("model.attention_output_bias" if model.attention_output_bias
                      else "model.mlp_bias", "Megatron-LM puts biases on all linear layers "
                      "or on none (and optionally on QKV)", True)
    return args


def _model_arguments(spec: Spec, ledger: Ledger, notes: list[str]) -> list[Argument]:
    model = spec.model
    if not model.has_architecture:
        ledger.cannot("model.parameters", "a model given only by its size has no shape to "
                      "pass; give its architecture")
        return []
    assert model.num_layers and model.hidden_size and model.num_attention_heads
    args: list[Argument] = [
        ("--num-layers", str(model.num_layers)), ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(model.num_attention_heads))]
    ledger.take("model.num_layers", "model.hidden_size", "model.ffn_hidden_size",
                "model.num_attention_heads", "model.num_kv_heads", "model.head_dim",
                "model.ffn_activation", "model.vocab_size", "model.tie_embeddings", "model.norm",
                "model.position_embedding", "model.max_position_embeddings", "model.qk_norm")
    kv = model.num_kv_heads
    if kv is not None and kv != model.num_attention_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", str(kv))]
    if model.head_dim is not None and model.mla is None:
        args.append(("--kv-channels", str(model.head_dim)))
    if model.ffn_activation == "swiglu":
        args.append(("--swiglu", None))
    elif model.ffn_activation != "gelu":
        ledger.cannot("model.ffn_activation", "Megatron-LM's pretrain_gpt.py takes GeLU or "
                      "SwiGLU (--swiglu)", model.ffn_activation)
    if model.norm == "rmsnorm":
        args += [("--normalization", "RMSNorm")]
    if model.norm_placement != "pre":
        ledger.cannot("model.norm_placement", "Megatron-LM's GPT blocks are pre-norm")
    if model.qk_norm:
        args.append(("--qk-layernorm", None))
        if model.qk_norm_scope != "head":
            ledger.cannot("model.qk_norm_scope", "Megatron-LM's --qk-layernorm is per head")
    position = {"rope": "rope", "learned": "learned_absolute", "none": "none"}
    if model.position_embedding in position:
        args.append(("--position-embedding-type", position[model.position_embedding]))
        if model.position_embedding == "rope":
            notes.append("llmpar's model has no RoPE base: Megatron's --rotary-base default "
                         "(10000) applies; set your model's")
    else:
        ledger.cannot("model.position_embedding", "no ALiBi in Megatron-LM's GPT model",
                      model.position_embedding)
    longest = model.max_position_embeddings or spec.training.sequence_length
    args.append(("--max-position-embeddings", str(longest)))
    if not model.tie_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    args += _bias_arguments(spec, ledger)
    if model.vocab_size is not None:
        args.append(("--vocab-size", str(model.vocab_size)))
        t = 1 if spec.parallel.get("tensor") is None else spec.parallel["tensor"].degree
        multiple = VOCAB_PADDING * t
        padded = -(-model.vocab_size // multiple) * multiple
        if padded != model.vocab_size:
            notes.append(f"Megatron-LM pads the vocabulary to a multiple of "
                         f"--make-vocab-size-divisible-by ({VOCAB_PADDING}) x TP ({t}): "
                         f"{padded} rows, the plan counts {model.vocab_size}")
    args += _mla_arguments(spec, ledger) + _moe_arguments(spec, ledger)
    return args


def _mla_arguments(spec: Spec, ledger: Ledger) -> list[Argument]:
    mla = spec.model.mla
    if mla is None:
        return []
    ledger.take("model.mla")
    args: list[Argument] = [("--multi-latent-attention", None)]
    if mla.q_lora_rank is not None:
        args.append(("--q-lora-rank", str(mla.q_lora_rank)))
    return args + [("--kv-lora-rank", str(mla.kv_lora_rank)),
                   ("--qk-head-dim", str(mla.qk_nope_head_dim)),
                   ("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)),
                   ("--v-head-dim", str(mla.v_head_dim))]


def _moe_arguments(spec: Spec, ledger: Ledger) -> list[Argument]:
    moe = spec.model.moe
    if moe is None:
        return []
    ledger.take("model.moe.num_experts", "model.moe.experts_per_token",
                "model.moe.expert_ffn_hidden_size", "model.moe.num_shared_experts",
                "model.moe.shared_expert_ffn_hidden_size", "model.moe.dense_layers",
                "model.moe.layer_frequency", "model.moe.capacity_factor",
                "model.moe.router_bias", "model.moe.shared_expert_gate")
    args: list[Argument] = [("--num-experts", str(moe.num_experts)),
                            ("--moe-router-topk", str(moe.experts_per_token)),
                            ("--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size))]
    if moe.num_shared_experts:
        width = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
        args.append(("--moe-shared-expert-intermediate-size",
                     str(moe.num_shared_experts * width)))
    if (pattern := _moe_layer_pattern(spec)) is not None:
        args.append(("--moe-layer-freq", pattern))
    if moe.capacity_factor is not None:
        args.append(("--moe-expert-capacity-factor", str(moe.capacity_factor)))
    if moe.router_bias:
        args.append(("--moe-router-enable-expert-bias", None))
    if moe.shared_expert_gate:
        ledger.cannot("model.moe.shared_expert_gate", "no Megatron-LM argument for a gated "
                      "shared expert", True)
    return args


def _training_arguments(spec: Spec, layout: Layout, ledger: Ledger,
                        notes: list[str]) -> list[Argument]:
    training, precision = spec.training, spec.precision
    args: list[Argument] = [("--seq-length", str(training.sequence_length)),
                            ("--micro-batch-size", str(training.micro_batch_size)),
                            ("--global-batch-size", str(global_batch(spec, layout)))]
    ledger.take("training.sequence_length", "training.micro_batch_size",
                "training.global_batch_size", "training.tokens", "training.tokens_per_parameter",
                "training.recompute", "training.recompute_layers",
                "training.activation_offload_layers", "training.hidden_dropout")
    # always given: Megatron-LM's own default is 0.1 (arguments.py), llmpar's 0
    args.append(("--hidden-dropout", str(training.hidden_dropout)))
    steps = steps_of(spec, layout)
    if steps is not None:
        args.append(("--train-iters", str(steps)))
        tokens = run_tokens(spec) or 0.0
        per_step = global_batch(spec, layout) * training.sequence_length
        if steps * per_step != tokens:
            notes.append(f"--train-iters {steps} runs {steps * per_step:,} tokens, the spec "
                         f"{tokens:,.0f} (whole steps)")
    if training.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    elif training.recompute == "full":
        method, count = (("block", training.recompute_layers)
                         if training.recompute_layers is not None else ("uniform", 1))
        args += [("--recompute-granularity", "full"), ("--recompute-method", method),
                 ("--recompute-num-layers", str(count))]
    if training.activation_offload_layers is not None:
        # arguments.py: a count above 0 sets cpu_offloading
        args.append(("--cpu-offloading-num-layers", str(training.activation_offload_layers)))
    ledger.take("precision.weights", "precision.activations", "precision.compute",
                "precision.gradients", "optimizer.states", "optimizer.gradients")
    if precision.weights == "bf16":
        args.append(("--bf16", None))
    elif precision.weights == "fp16":
        args.append(("--fp16", None))
    elif precision.weights != "fp32":
        ledger.cannot("precision.weights", "Megatron-LM keeps weights in bf16, fp16 or fp32",
                      precision.weights)
    if precision.compute not in (precision.weights, "fp32") and precision.compute != "bf16":
        ledger.cannot("precision.compute", "low-precision matrix math (--fp8-format and its "
                      "recipe) is not mapped", precision.compute)
    if precision.weights in ("bf16", "fp16") and spec.gradients_dtype != "fp32":
        reduce = spec.parallel.get("data")
        if not (reduce is not None and reduce.reduce_dtype == "bf16"):
            ledger.cannot("precision.gradients", "Megatron-LM accumulates fp32 main "
                          "gradients under --bf16/--fp16 (megatron/training/arguments.py); "
                          "the plan counts 16-bit gradients: name the optimizer "
                          "adam-fp32-grads to plan what Megatron-LM runs",
                          spec.gradients_dtype)
    name = spec.optimizer.name
    if name.startswith("adam") and "8bit" not in name:
        args += [("--optimizer", "adam")]
    elif name.startswith("sgd"):
        args += [("--optimizer", "sgd")]
    else:
        ledger.cannot("optimizer", "not one of Megatron-LM's optimizers (adam, sgd) "
                      "under this name", name)
    if (goodput := training.goodput) is not None:
        ledger.take("training.goodput")
        if goodput.asynchronous:
            args.append(("--async-save", None))
        ledger.cannot("training.goodput.checkpoint_interval_seconds", "--save-interval "
                      "counts steps: divide the interval by the plan's step time")
    return args


# --- reading an argument list back ---------------------------------------------------

NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
POSITIONS = {"rope": "rope", "learned_absolute": "learned", "none": "none"}
SWITCHES = frozenset({
    "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--sequence-parallel",
    "--tp-comm-overlap", "--use-distributed-optimizer", "--use-torch-fsdp2",
    "--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather",
    "--grad-reduce-in-bf16", "--bf16", "--fp16", "--no-overlap-p2p-communication",
    "--moe-enable-deepep", "--overlap-moe-expert-parallel-comm",
    "--multi-latent-attention", "--moe-router-enable-expert-bias", "--async-save",
})
"""The switches llmpar reads (`action='store_true'` in Megatron-LM)."""
VALUED = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--context-parallel-size", "--cp-comm-type", "--hierarchical-context-parallel-sizes",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--moe-token-dispatcher-type", "--data-parallel-sharding-strategy", "--num-layers",
    "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--normalization", "--position-embedding-type",
    "--max-position-embeddings", "--vocab-size", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-expert-capacity-factor", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--seq-length", "--micro-batch-size",
    "--global-batch-size", "--train-iters", "--train-samples", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--cpu-offloading-num-layers",
    "--optimizer", "--hidden-dropout",
})
"""The arguments with values llmpar reads."""


def split_arguments(text: str, source: str) -> dict[str, list[str]]:
    """`--flag value ...` words (a file of them, or a launcher line: everything up to the
    `.py` script is the launcher's) as {flag: values}; `--flag=value` too."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise SpecError([Problem("$", f"cannot split the arguments: {exc}")], source) from None
    scripts = [i for i, word in enumerate(words) if word.endswith(".py")]
    if scripts:
        words = words[scripts[-1] + 1:]
    found: dict[str, list[str]] = {}
    flag: str | None = None
    for word in words:
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            found[flag] = [value] if value else []
        elif flag is None:
            raise SpecError([Problem("$", f"{word!r} is not an argument (expected --flag "
                                          "before any value)")], source)
        else:
            found[flag].append(word)
    return found


def layer_pattern(text: str) -> int | list[int]:
    """A `--moe-layer-freq` value as Megatron-LM's `moe_freq_type` takes it (an integer,
    or a Python list expression such as `([0]*3+[1]*58)`), worked out without `eval`:
    integers, lists of them, lists joined by `+` and repeated by `*` an integer, at most
    `MAX_LAYERS` entries. ValueError for anything else."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {exc.msg}") from None
    return _pattern_value(tree.body)


def _pattern_value(node: ast.expr) -> int | list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_pattern_value(item) for item in node.elts]
        numbers = [item for item in items if isinstance(item, int)]
        if len(numbers) != len(items):
            raise ValueError("a list of integers is read")
        return _bounded(numbers)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _pattern_value(node.left), _pattern_value(node.right)
        if isinstance(left, int) and isinstance(right, int):
            if max(abs(left), abs(right)) > MAX_LAYERS:
                raise ValueError(f"numbers above {MAX_LAYERS:,} are not read")
            return left + right if isinstance(node.op, ast.Add) else left * right
        add, mult = isinstance(node.op, ast.Add), isinstance(node.op, ast.Mult)
        if add and isinstance(left, list) and isinstance(right, list):
            return _bounded(left + right)
        if mult and isinstance(left, list) and isinstance(right, int):
            return _bounded(left, right)
        if mult and isinstance(left, int) and isinstance(right, list):
            return _bounded(right, left)
        raise ValueError("a list joins a list (+) and repeats by an integer (*)")
    raise ValueError("only a number or a list of 0 and 1 is read")


def _bounded(items: list[int], count: int = 1) -> list[int]:
    """`items` repeated `count` times, refused past `MAX_LAYERS` entries."""
    if len(items) * max(count, 0) > MAX_LAYERS:
        raise ValueError(f"more than {MAX_LAYERS:,} entries")
    return items * count


def _moe_layers(pattern: str, layers: int, reader: Words) -> tuple[int, int] | None:
    """(dense_layers, layer_frequency) of a `--moe-layer-freq`: an integer N (layer i has
    experts when i % N == 0) or a list of 0/1 (Megatron's `moe_freq_type`)."""
    where = "$.--moe-layer-freq"
    try:
        value = layer_pattern(pattern)
    except ValueError as exc:
        reader.problems.append(Problem(where, f"expected an integer or a list of 0/1, got "
                                              f"{pattern!r} ({exc})"))
        return None
    if isinstance(value, int) and value < 1:
        reader.problems.append(Problem(where, f"expected an integer of at least 1 (every "
                                              f"N-th layer has experts), got {pattern!r}"))
        return None
    if layers > MAX_LAYERS:
        reader.problems.append(Problem(where, f"read for at most {MAX_LAYERS:,} "
                                              f"layers (--num-layers is {layers:,})"))
        return None
    flags = ([1 if i % value == 0 else 0 for i in range(layers)] if isinstance(value, int)
             else list(value))
    if len(flags) != layers or set(flags) - {0, 1} or 1 not in flags:
        reader.problems.append(Problem(where, f"expected {layers} entries of 0/1 with at "
                                              f"least one 1, got {pattern!r}"))
        return None
    # The layers i >= d with (i + 1) a multiple of f: an f that divides the first such
    # layer's i + 1 and gives the rest, with the fewest dense layers d (just past the
    # multiple before it), then the smallest f.
    ones = [i for i, flag in enumerate(flags) if flag]
    first = ones[0]
    found = [(max(0, first - frequency + 1), frequency) for frequency in range(1, first + 2)
             if (first + 1) % frequency == 0 and ones == list(range(first, layers, frequency))]
    if found:
        return min(found)
    reader.problems.append(Problem(where, f"llmpar's MoE layers are the layers i >= "
                                          f"dense_layers with (i + 1) a multiple of "
                                          f"layer_frequency; {pattern!r} is not such a set"))
    return None


def read_arguments(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from Megatron-LM arguments; flags llmpar does not model are listed
    in the notes, every malformed value is a Problem naming its flag."""
    found = split_arguments(text, source)
    reader = Words(found, source)
    settings: dict[str, Any] = {}
    owned = ["parallel.sequence", "parallel.context", "parallel.expert",
             "parallel.data.degree", "parallel.tensor.degree", "parallel.pipeline.degree",
             "parallel.pipeline.virtual_stages", "parallel.pipeline.schedule",
             "parallel.pipeline.overlap_p2p", "training.recompute_layers",
             "training.activation_offload_layers", "model.num_kv_heads", "model.head_dim"]
    _read_model(reader, settings, base)
    if "--num-layers" in found:
        owned += ["model.moe", "model.mla"]
    _read_parallel(reader, settings)
    _read_training(reader, settings, base)
    if reader.problems:
        raise SpecError(reader.problems, source)
    ignored = sorted(set(found) - SWITCHES - VALUED)
    notes = [f"not modelled by llmpar, ignored: {' '.join(ignored)}"] if ignored else []
    return ReadSettings(settings=settings, owned=tuple(owned), notes=tuple(notes))


def _read_model(reader: Words, settings: dict[str, Any], base: Spec | None) -> None:
    if "--num-layers" not in reader.found:
        return  # no architecture: the model is the base's
    for flag, key in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                      ("--ffn-hidden-size", "ffn_hidden_size"),
                      ("--num-attention-heads", "num_attention_heads"),
                      ("--kv-channels", "head_dim"), ("--vocab-size", "vocab_size"),
                      ("--max-position-embeddings", "max_position_embeddings")):
        if (value := reader.integer(flag)) is not None:
            settings[f"model.{key}"] = value
    if reader.switch("--group-query-attention"):
        groups = reader.integer("--num-query-groups")
        if groups is None:
            reader.problems.append(Problem("$.--group-query-attention",
                                           "needs --num-query-groups"))
        settings["model.num_kv_heads"] = groups
    settings["model.ffn_activation"] = "swiglu" if reader.switch("--swiglu") else "gelu"
    settings["model.norm"] = reader.choice("--normalization", NORMALIZATIONS) or "layernorm"
    settings["model.position_embedding"] = reader.choice("--position-embedding-type",
                                                         POSITIONS) or "learned"
    settings["model.tie_embeddings"] = not reader.switch("--untie-embeddings-and-output-weights")
    biased = not reader.switch("--disable-bias-linear")
    settings["model.linear_bias"] = biased
    settings["model.qkv_bias"] = reader.switch("--add-qkv-bias")
    settings["model.attention_output_bias"] = settings["model.mlp_bias"] = False
    settings["model.qk_norm"] = reader.switch("--qk-layernorm")
    if reader.switch("--multi-latent-attention"):
        mla = {"q_lora_rank": reader.integer("--q-lora-rank"),
               "kv_lora_rank": reader.integer("--kv-lora-rank") or 32,
               "qk_nope_head_dim": reader.integer("--qk-head-dim") or 128,
               "qk_rope_head_dim": reader.integer("--qk-pos-emb-head-dim") or 64,
               "v_head_dim": reader.integer("--v-head-dim") or 128}
        settings["model.mla"] = {k: v for k, v in mla.items() if v is not None}
    experts = reader.integer("--num-experts")
    if experts is not None:
        moe: dict[str, Any] = {"num_experts": experts,
                               "experts_per_token": reader.integer("--moe-router-topk") or 2}
        width = reader.integer("--moe-ffn-hidden-size") or settings.get("model.ffn_hidden_size")
        moe["expert_ffn_hidden_size"] = width
        shared = reader.integer("--moe-shared-expert-intermediate-size")
        if shared is not None:
            moe["num_shared_experts"] = 1
            moe["shared_expert_ffn_hidden_size"] = shared
            if base is not None and base.model.moe is not None and \
                    base.model.moe.num_shared_experts and \
                    shared % base.model.moe.num_shared_experts == 0:
                # Megatron states the shared experts' total width; the base says how many
                moe["num_shared_experts"] = base.model.moe.num_shared_experts
                moe["shared_expert_ffn_hidden_size"] = shared // moe["num_shared_experts"]
        pattern = reader.text("--moe-layer-freq")
        layers = settings.get("model.num_layers")
        if pattern is not None and layers is not None:
            found = _moe_layers(pattern, layers, reader)
            if found is not None:
                moe["dense_layers"], moe["layer_frequency"] = found
        factor = reader.text("--moe-expert-capacity-factor")
        if factor is not None:
            try:
                moe["capacity_factor"] = float(factor)
            except ValueError:
                reader.problems.append(Problem("$.--moe-expert-capacity-factor",
                                               f"expected a number, got {factor!r}"))
        moe["router_bias"] = reader.switch("--moe-router-enable-expert-bias")
        settings["model.moe"] = moe


def _read_parallel(reader: Words, settings: dict[str, Any]) -> None:
    t = reader.integer("--tensor-model-parallel-size") or 1
    p = reader.integer("--pipeline-model-parallel-size") or 1
    if t > 1:
        settings["parallel.tensor.degree"] = t
    if p > 1:
        settings["parallel.pipeline.degree"] = p
    layers = settings.get("model.num_layers")
    per_virtual = reader.integer("--num-layers-per-virtual-pipeline-stage")
    virtual = reader.integer("--num-virtual-stages-per-pipeline-rank")
    if per_virtual is not None and layers is not None:
        if layers % (p * per_virtual):
            reader.problems.append(Problem("$.--num-layers-per-virtual-pipeline-stage",
                                           f"{per_virtual} x {p} stages does not divide "
                                           f"--num-layers {layers}"))
        virtual = layers // (p * per_virtual)
    if virtual is not None and virtual > 1:
        settings["parallel.pipeline.schedule"] = "interleaved"
        settings["parallel.pipeline.virtual_stages"] = virtual
    if p > 1 and not reader.switch("--no-overlap-p2p-communication"):
        settings["parallel.pipeline.overlap_p2p"] = True
    if reader.switch("--sequence-parallel"):
        settings["parallel.sequence"] = {"comm_overlap": "pipelined"
                                         if reader.switch("--tp-comm-overlap") else "none"}
    c = reader.integer("--context-parallel-size") or 1
    if c > 1:
        kinds = {v: k for k, v in CP_COMM_TYPES.items()}
        values = reader.found.get("--cp-comm-type", ["p2p"])
        if len(values) != 1 or values[0] not in kinds:
            reader.problems.append(Problem("$.--cp-comm-type", f"expected one of "
                                           f"{', '.join(kinds)} for every layer alike, got "
                                           f"{values!r}"))
        context: dict[str, Any] = {"degree": c, "kind": kinds.get(values[0], "ring")
                                   if values else "ring"}
        sizes = reader.found.get("--hierarchical-context-parallel-sizes")
        if context["kind"] == "hybrid" and sizes:
            context["all_to_all_degree"] = int(sizes[0]) if sizes[0].isdigit() else None
        settings["parallel.context"] = context
    e = reader.integer("--expert-model-parallel-size")
    et = reader.integer("--expert-tensor-parallel-size")
    if e is not None or et is not None or "--num-experts" in reader.found:
        expert: dict[str, Any] = {"degree": e or 1}
        if et is not None:
            expert["tensor_degree"] = et
        dispatcher = reader.text("--moe-token-dispatcher-type")
        if reader.switch("--moe-enable-deepep") or dispatcher == "flex":
            expert["dispatcher"] = "deepep"
        expert["overlap_a2a"] = reader.switch("--overlap-moe-expert-parallel-comm")
        settings["parallel.expert"] = expert
    fsdp = reader.switch("--use-torch-fsdp2")
    megatron_fsdp = reader.switch("--use-megatron-fsdp")
    strategy = reader.text("--data-parallel-sharding-strategy") or "optim_grads_params"
    zero = 1 if reader.switch("--use-distributed-optimizer") else 0
    if megatron_fsdp:
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
            strategy, 3)
    settings["parallel.data.fsdp"] = fsdp
    if not fsdp:  # FSDP is ZeRO-3 whatever `zero` says
        settings["parallel.data.zero"] = zero
    settings["parallel.data.overlap_grad_reduce"] = reader.switch("--overlap-grad-reduce")
    gather = reader.switch("--overlap-param-gather")
    settings["parallel.data.overlap_param_gather"] = gather or not (zero or fsdp)
    settings["parallel.data.reduce_dtype"] = ("bf16" if reader.switch("--grad-reduce-in-bf16")
                                              else "gradients")


MEGATRON_HIDDEN_DROPOUT = 0.1
"""--hidden-dropout's default: TransformerConfig.hidden_dropout = 0.1
(megatron/core/transformer/transformer_config.py at d98e8a64, whose fields are
pretrain_gpt.py's arguments)."""


def _read_training(reader: Words, settings: dict[str, Any], base: Spec | None) -> None:
    for flag, key in (("--seq-length", "sequence_length"),
                      ("--micro-batch-size", "micro_batch_size"),
                      ("--global-batch-size", "global_batch_size")):
        if (value := reader.integer(flag)) is not None:
            settings[f"training.{key}"] = value
    granularity = reader.choice("--recompute-granularity", {"full": "full",
                                                            "selective": "selective"})
    settings["training.recompute"] = granularity or "none"
    if granularity == "full":
        method = reader.choice("--recompute-method", {"uniform": "uniform", "block": "block"})
        count = reader.integer("--recompute-num-layers") or 1
        if method == "block":
            settings["training.recompute_layers"] = count
        elif count != 1:
            reader.problems.append(Problem("$.--recompute-num-layers", f"with --recompute-"
                                           f"method uniform llmpar models groups of one layer, "
                                           f"got {count}"))
    if (offloaded := reader.integer("--cpu-offloading-num-layers")) is not None:
        settings["training.activation_offload_layers"] = offloaded
    if (dropout := reader.probability("--hidden-dropout")) is not None:
        settings["training.hidden_dropout"] = dropout
    if reader.switch("--bf16"):
        dtype = "bf16"
    elif reader.switch("--fp16"):
        dtype = "fp16"
    else:
        dtype = "fp32"
    for key in ("weights", "activations", "compute"):
        settings[f"precision.{key}"] = dtype
    seq = settings.get("training.sequence_length", base.training.sequence_length
                       if base is not None else 2048)
    batch = settings.get("training.global_batch_size")
    iters, samples = reader.integer("--train-iters"), reader.integer("--train-samples")
    tokens = (None if iters is None or batch is None else iters * batch * seq) or (
        None if samples is None else samples * seq)
    if tokens is not None:
        kept = run_tokens(base) if base is not None else None
        per_step = (batch or 1) * seq
        same_steps = kept is not None and math.ceil(kept / per_step) == math.ceil(
            tokens / per_step)
        if not same_steps:  # the base states the run's length more exactly than steps do
            settings["training.tokens"] = float(tokens)
            settings["training.tokens_per_parameter"] = None
