"""Checks that compare fields: within a model, across the spec, and of the layout.

Field validators check one value; these check how values fit together, and
quote every operand so the user sees why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmpar.dtypes import math_format
from llmpar.errors import Problem
from llmpar.finetune.checks import finetune_problems
from llmpar.inference.checks import inference_problems
from llmpar.positions import TRAINED_POSITIONS, position_limit_problem
from llmpar.spec import Spec
from llmpar.spec.model import ALONE, EXPERTS_ALONE, Model
from llmpar.strategy import Layout
from llmpar.workload import workload_problems

if TYPE_CHECKING:
    from llmpar.strategy import Strategy


def model_problems(model: Model) -> list[Problem]:
    """A model is an architecture or a size, and its head counts divide."""
    problems = []
    needed = model.architecture_fields
    given = [name for name in needed if getattr(model, name) is not None]
    if model.parameters is None and not model.has_architecture:
        missing = [name for name in needed if name not in given]
        problems.append(Problem("$.model", "give the architecture or `parameters`; "
                                f"missing: {', '.join(missing)}"))
    if model.parameters is not None and model.has_architecture:
        problems.append(Problem("$.model.parameters", "the architecture fields already "
                                "determine the parameter count; give one or the other"))
    heads, kv = model.num_attention_heads, model.num_kv_heads
    if heads is not None and kv is not None and heads % kv != 0:
        problems.append(Problem("$.model.num_kv_heads", f"num_attention_heads ({heads}) must "
                                f"be divisible by num_kv_heads ({kv})"))
    if model.position_embedding == "learned" and model.max_position_embeddings is None:
        problems.append(Problem("$.model.max_position_embeddings",
                                "required with position_embedding = 'learned'"))
    problems += rotary_problems(model)
    if model.mtp_layers and not model.has_architecture:
        problems.append(Problem("$.model.mtp_layers", "a multi-token-prediction module is "
                                "a block of the model's own kind: give the architecture"))
    if model.mtp_table_copies and not model.mtp_layers:
        problems.append(Problem("$.model.mtp_table_copies", "copies of the embedding and "
                                "head come with multi-token-prediction modules: give "
                                "mtp_layers >= 1"))
    return problems + moe_problems(model) + mixer_problems(model)


def rotary_problems(model: Model) -> list[Problem]:
    """A rotary fraction below 1 needs RoPE on standard heads, and rotates whole pairs of
    channels (rotate_half splits the rotated width in two halves)."""
    if model.rotary_fraction == 1:
        return []
    path = "$.model.rotary_fraction"
    if model.position_embedding != "rope" or model.mla is not None:
        return [Problem(path, "only with position_embedding = 'rope' and without "
                              "[model.mla] (MLA rotates qk_rope_head_dim), got "
                              f"{model.rotary_fraction!r}")]
    width = model.rotary_dim
    if model.attends and (width == 0 or width % 2):
        return [Problem(path, f"must rotate an even number of channels: int(head_dim "
                              f"({model.head_dim}) x {model.rotary_fraction!r}) is {width}")]
    return []


MIXER_TABLES = {"L": "linear_attention", "M": "mamba"}
"""The letters of `mixer_pattern` that need a table, and the table."""
PARALLEL_MAMBA = "P"
"""The parallel hybrid layer's letter: attention and Mamba-2, whose table it needs."""


def mixer_problems(model: Model) -> list[Problem]:
    """A mixer pattern that repeats to num_layers, a table for each recurrent letter and a
    letter for each table, at most one recurrent kind, and head counts that divide."""
    given_pattern, problems = model.mixer_pattern or "", []
    pattern = "".join(ALONE.get(letter, letter) for letter in given_pattern)
    path = "$.model.mixer_pattern"
    layers = model.num_layers
    problems += _placed_expert_problems(model)
    if pattern and layers is not None and layers % len(pattern):
        problems.append(Problem(path, f"its length ({len(pattern)}) must divide num_layers "
                                      f"({layers}): the pattern repeats from layer 0"))
    for letter, table in MIXER_TABLES.items():
        given = getattr(model, table) is not None
        if letter == "M" and PARALLEL_MAMBA in pattern:
            letter = "M" if "M" in pattern else PARALLEL_MAMBA
        if letter in pattern and not given:
            problems.append(Problem(f"$.model.{table}", f"required: mixer_pattern "
                                    f"({given_pattern!r}) has {letter!r} layers"))
        elif given and letter not in pattern:
            problems.append(Problem(f"$.model.{table}", f"no layer uses it: give "
                                    f"mixer_pattern with {letter!r} layers"))
    if pattern and model.sliding_window is not None:
        problems.append(Problem("$.model.sliding_window", "windowed attention beside "
                                "recurrent layers (mixer_pattern) is not modelled"))
    if "L" in pattern and set("MP") & set(pattern):
        problems.append(Problem(path, "mix attention with one recurrent kind, 'L' or "
                                      "Mamba-2 ('M', 'P'), not both"))
    if model.sparse_attention is not None and (model.mla is None
                                               or model.mla.q_lora_rank is None):
        problems.append(Problem("$.model.sparse_attention", "the indexer reads MLA's query "
                                "latent: give [model.mla] with a q_lora_rank"))
    linear = model.linear_attention
    if linear is not None and linear.num_value_heads % linear.num_key_heads:
        problems.append(Problem("$.model.linear_attention.num_value_heads", (
            f"num_value_heads ({linear.num_value_heads}) must be a multiple of "
            f"num_key_heads ({linear.num_key_heads})")))
    mamba = model.mamba
    if mamba is not None and mamba.num_heads % mamba.num_groups:
        problems.append(Problem("$.model.mamba.num_groups", (
            f"num_groups ({mamba.num_groups}) must divide num_heads ({mamba.num_heads})")))
    return problems


def _placed_expert_problems(model: Model) -> list[Problem]:
    """Experts beside single-module layers sit where mixer_pattern's "E" letters put them,
    and only there."""
    pattern, moe, path = model.mixer_pattern or "", model.moe, "$.model.mixer_pattern"
    if EXPERTS_ALONE in pattern and moe is None:
        return [Problem("$.model.moe", f"required: mixer_pattern ({pattern!r}) has "
                                       f"{EXPERTS_ALONE!r} layers (the experts alone)")]
    if moe is None:
        return []
    if EXPERTS_ALONE not in pattern and set(pattern) & set(ALONE):
        return [Problem(path, "experts beside token mixers alone (lower-case letters) go in "
                              f"{EXPERTS_ALONE!r} layers of the pattern: the MoE layers would "
                              "follow no period of dense_layers and layer_frequency")]
    if EXPERTS_ALONE in pattern and (moe.dense_layers, moe.layer_frequency) != (0, 1):
        return [Problem("$.model.moe", f"mixer_pattern's {EXPERTS_ALONE!r} letters place the "
                                       f"MoE layers: leave dense_layers (0) and "
                                       f"layer_frequency (1) out, got "
                                       f"{moe.dense_layers} and {moe.layer_frequency}")]
    return []


def moe_problems(model: Model) -> list[Problem]:
    """A token's experts exist, and some layer has them (else the `[model.moe]` table
    would be dropped without a word)."""
    moe = model.moe
    if moe is None:
        return []
    problems = []
    if moe.experts_per_token > moe.num_experts:
        problems.append(Problem("$.model.moe.experts_per_token",
                                f"experts_per_token ({moe.experts_per_token}) exceeds "
                                f"num_experts ({moe.num_experts}): a token cannot go to more "
                                "routed experts than a layer has"))
    layers = model.num_layers
    if layers is None or model.num_moe_layers:
        return problems
    if moe.dense_layers >= layers:
        problems.append(Problem("$.model.moe.dense_layers",
                                f"dense_layers ({moe.dense_layers}) leaves no MoE layer among "
                                f"num_layers ({layers}); drop [model.moe] for a dense model"))
    elif moe.layer_frequency > layers:
        problems.append(Problem("$.model.moe.layer_frequency",
                                f"layer_frequency ({moe.layer_frequency}) exceeds num_layers "
                                f"({layers}): no layer has experts"))
    else:
        problems.append(Problem("$.model.moe.layer_frequency",
                                "no layer has experts: no layer number (from 1) after "
                                f"dense_layers ({moe.dense_layers}) up to num_layers "
                                f"({layers}) is a multiple of layer_frequency "
                                f"({moe.layer_frequency})"))
    return problems


USABLE_TO_DATASHEET = (0.9, 1.1)
"""How far a device's reported memory lies from its datasheet figure: 0.99-1.08 for the
shipped GPUs (GB versus GiB and reserved pages); beyond it, one of the two was changed
without the other."""


def hardware_problems(spec: Spec) -> list[Problem]:
    """A usable memory that belongs to the GPU's, and room left after the headroom (a
    memory without its unit is the converter's: `BARE_FLOORS`)."""
    hardware, gpu = spec.hardware, spec.hardware.gpu
    path = "$.hardware.gpu"
    problems = []
    usable = gpu.usable_memory_bytes
    low, high = USABLE_TO_DATASHEET
    if usable is not None and not low <= usable / gpu.memory_bytes <= high:
        problems.append(Problem(f"{path}.usable_memory_bytes", (
            f"{usable / 1e9:,.2f} GB is far from memory_bytes ({gpu.memory_bytes / 1e9:,.2f} "
            f"GB): a device reports within {low:g}-{high:g}x of its datasheet's figure")))
    if hardware.memory_headroom_bytes >= gpu.usable_bytes:
        problems.append(Problem("$.hardware.memory_headroom_bytes", (
            f"{hardware.memory_headroom_bytes / 1e9:,.2f} GB leaves nothing of the GPU's "
            f"{gpu.usable_bytes / 1e9:,.2f} GB")))
    return problems


def training_problems(spec: Spec) -> list[Problem]:
    """Run length given once, and a sequence that fits the position table."""
    training, model = spec.training, spec.model
    problems = []
    if training.tokens is not None and training.tokens_per_parameter is not None:
        problems.append(Problem("$.training.tokens_per_parameter",
                                "give tokens or tokens_per_parameter, not both"))
    if training.activation_offload_layers is not None:
        problems += _activation_offload_problems(spec)
    problems += _product_format_problems(spec)
    if training.recompute_modules is not None:
        problems += recompute_module_problems(spec)
    if training.recompute_policy is not None:
        problems += recompute_policy_problems(spec)
    if training.recompute_layer_interval is not None:
        problems += _layer_interval_problems(spec)
    goodput = training.goodput
    if goodput is not None and goodput.asynchronous and (
            spec.hardware.host_bandwidth_bytes_per_s is None):
        problems.append(Problem("$.training.goodput.asynchronous", (
            "an asynchronous checkpoint copies each GPU's states to host memory first: "
            "give [hardware] host_bandwidth_bytes_per_s (or a cluster preset that has it)")))
    if training.multi_token_prediction:
        problems += _mtp_problems(spec)
    positions = position_limit_problem(model, training.sequence_length,
                                       "$.training.sequence_length", TRAINED_POSITIONS)
    if positions is not None:
        problems.append(positions)
    return problems + finetune_problems(spec) + workload_problems(spec)


def _mtp_problems(spec: Spec) -> list[Problem]:
    """Multi-token prediction trains modules the model has, in full training."""
    path = "$.training.multi_token_prediction"
    if not spec.model.mtp_layers:
        return [Problem(path, f"model {spec.model.name!r} has no multi-token-prediction "
                              "modules (mtp_layers = 0): give [model] mtp_layers >= 1 or "
                              "leave it off")]
    if spec.tuning is not None:
        return [Problem(path, "training the modules beside [finetune] is not modelled")]
    if spec.training.activation_offload_layers is not None:
        return [Problem(path, "offloading activations beside the modules' is not modelled "
                              "(leave activation_offload_layers out)")]
    return []


def _product_format_problems(spec: Spec) -> list[Problem]:
    """A per-operation format needs the GPU's peak for it."""
    gpu, problems = spec.hardware.gpu, []
    for key in ("linear", "attention"):
        dtype = getattr(spec.precision, key)
        if dtype is not None and gpu.peak_flops_per_s(dtype) is None:
            problems.append(Problem(f"$.precision.{key}", (
                f"GPU {gpu.name!r} states no peak for {dtype!r} products (peak_"
                f"{math_format(dtype)}_flops_per_s); set it in [hardware.gpu] or pick a "
                "format the GPU runs")))
    return problems


MODULE_TAGGED_ACTIVATION_MODELS = ("korthikanti", "fused")
"""Activation models whose saved tensors name the module that keeps them."""


def recompute_module_problems(spec: Spec) -> list[Problem]:
    """recompute_modules needs selective recomputation (as Megatron-Core's
    --recompute-modules needs --recompute-granularity selective), an activation model
    that tags tensors by module, and a model that has each module: one that would
    recompute nothing is an error, not a silent no-op. core_attn alone (the attention
    scores) works with every activation model, as recompute = "selective" does."""
    training, model, path = spec.training, spec.model, "$.training.recompute_modules"
    modules = training.recompute_modules or ()
    if training.recompute != "selective":
        return [Problem(path, f"recomputes modules under recompute = 'selective' (Megatron-"
                              f"Core's --recompute-granularity selective), got recompute = "
                              f"{training.recompute!r}")]
    others = [m for m in modules if m != "core_attn"]  # every model marks the scores
    if not others:
        return []
    if not model.has_architecture:
        return [Problem(path, f"{others[0]!r} needs the model's architecture (a model given "
                              f"by its size has no modules)")]
    if training.activation_model not in MODULE_TAGGED_ACTIVATION_MODELS:
        listed = " or ".join(repr(m) for m in MODULE_TAGGED_ACTIVATION_MODELS)
        return [Problem(path, f"{others[0]!r} needs activation_model {listed}, whose tensors "
                              f"name the module that keeps them; got "
                              f"{training.activation_model!r}")]
    moe = model.moe
    absent = {
        "mla_up_proj": (model.mla is None, "the model has no MLA (no [model.mla])"),
        "moe": (not model.num_moe_layers, "the model has no MoE layers"),
        "moe_act": (not model.num_moe_layers, "the model has no MoE layers (the dense MLP's "
                                              "activation is recomputed by 'mlp')"),
        "shared_experts": (moe is None or not moe.num_shared_experts or not model.num_moe_layers,
                           "the model has no shared experts"),
        "mlp": (not model.num_dense_layers, "the model has no dense MLP layers (its MoE "
                                            "blocks are recomputed by 'moe')"),
        "layernorm": (model.norm_placement == "post",
                      "a post-norm block keeps no norm output for the next linear"),
    }
    if model.mla is not None and training.activation_model == "korthikanti":
        # Its MLA attention lists no latents, from which the up-projections would rerun.
        absent["mla_up_proj"] = (True, "activation model 'korthikanti' keeps no MLA latents "
                                       "to rerun the up-projections from; use 'fused'")
    problems = []
    for module in dict.fromkeys(modules):
        missing, why = absent.get(module, (False, ""))
        if missing:
            problems.append(Problem(path, f"{module!r} recomputes nothing: {why}"))
    return problems


def recompute_policy_problems(spec: Spec) -> list[Problem]:
    """An op-level policy is torchtitan's selective mode, over the fused inventory's
    attention blocks with a dense MLP or an MoE block (`llmpar.footprint.op_checkpoint`):
    anything else is an error, not a silent guess."""
    training, model, path = spec.training, spec.model, "$.training.recompute_policy"
    policy = training.recompute_policy
    if training.recompute != "selective":
        return [Problem(path, f"{policy!r} is a policy of recompute = 'selective' "
                              f"(torchtitan's activation_checkpoint.mode = 'selective'), got "
                              f"recompute = {training.recompute!r}")]
    if training.recompute_modules is not None:
        return [Problem(path, "give recompute_modules (Megatron-Core's modules) or "
                              "recompute_policy (torchtitan's op-level policy), not both")]
    if not model.has_architecture:
        return [Problem(path, f"{policy!r} needs the model's architecture (a model given by "
                              f"its size has no ops to save)")]
    if training.activation_model != "fused":
        return [Problem(path, f"{policy!r} needs activation_model 'fused' (torchtitan's "
                              f"flash attention and fused kernels), got "
                              f"{training.activation_model!r}")]
    unmodelled = [(model.recurrent_mixer is not None, "recurrent mixer layers"),
                  (model.single_module_layers, "single-module layers"),
                  (model.sparse_attention is not None, "sparse attention")]
    return [Problem(path, f"{policy!r} is modelled for attention blocks with a dense MLP or "
                          f"an MoE block; the model "
                          f"has {what}, whose ops the policy's save list is not stated for")
            for present, what in unmodelled if present]


def _layer_interval_problems(spec: Spec) -> list[Problem]:
    training, path = spec.training, "$.training.recompute_layer_interval"
    if training.recompute != "full":
        return [Problem(path, f"recomputes every N-th layer fully under recompute = 'full', "
                              f"got recompute = {training.recompute!r}")]
    if training.recompute_layers is not None:
        return [Problem(path, "give recompute_layers (the first N layers of a stage) or "
                              "recompute_layer_interval (every N-th), not both")]
    return []


def _activation_offload_problems(spec: Spec) -> list[Problem]:
    training, path = spec.training, "$.training.activation_offload_layers"
    if spec.hardware.host_bandwidth_bytes_per_s is None:
        return [Problem(path, "offloaded activations travel over the host link: give "
                              "[hardware] host_bandwidth_bytes_per_s (or a cluster preset that "
                              "has it)")]
    if training.recompute == "full" and training.recompute_layers is not None:
        return [Problem(path, "give recompute_layers or activation_offload_layers, not both "
                              "(each picks the first layers of a stage)")]
    if training.recompute == "full" and training.recompute_layer_interval is not None:
        return [Problem(path, "give recompute_layer_interval or activation_offload_layers, "
                              "not both (offloading picks the first layers of a stage, "
                              "whose recomputed ones keep only their inputs)")]
    return []


def resolve_layout(
    spec: Spec, strategies: Mapping[str, Strategy[Any]]
) -> tuple[Layout, list[Problem]]:
    """Every strategy's degree, with the one degree of -1 filled; they must multiply
    to `hardware.num_gpus`. The layout comes back even with problems (a degree it
    cannot fill is 1), so that the strategies' own checks can run too."""
    fixed: dict[str, int] = {}
    side: dict[str, int] = {}  # degrees that split ranks counted elsewhere (expert)
    fill: list[str] = []
    for name, config in spec.parallel.items():
        side.update(strategies[name].side_degrees(config))
        if not hasattr(config, "degree"):
            continue  # a strategy without a degree of its own (sequence parallelism)
        degree = strategies[name].degree(config)
        if degree == -1:
            fill.append(name)
        elif strategies[name].multiplies_gpus:
            fixed[name] = degree
        else:
            side[name] = degree
    num_gpus = spec.hardware.num_gpus
    product = math.prod(fixed.values())
    operands = " x ".join(f"{name} {degree}" for name, degree in sorted(fixed.items())) or "1"
    problems = []
    if len(fill) > 1:
        problems.append(Problem("$.parallel", "only one degree may be -1; these are: "
                                f"{', '.join(fill)}"))
    elif fill and num_gpus % product:
        problems.append(Problem(f"$.parallel.{fill[0]}.degree",
                                f"hardware.num_gpus ({num_gpus}) is not divisible by the "
                                f"other degrees ({operands} = {product})"))
    elif not fill and product != num_gpus:
        problems.append(Problem("$.parallel", f"degrees multiply to {product} ({operands}) but "
                                f"hardware.num_gpus is {num_gpus}"))
    for name in fill:
        fixed[name] = max(1, num_gpus // product) if not problems else 1
    active = {name: strategies[name].active(config) for name, config in spec.parallel.items()}
    shared = {key: value for name, config in spec.parallel.items()
              for key, value in strategies[name].shared_settings(config).items()}
    return Layout(degrees={**fixed, **side}, num_gpus=num_gpus, order=spec.rank_order,
                  active=active, nested=nested_axes(strategies), settings=shared), problems


def nested_axes(strategies: Mapping[str, Strategy[Any]]) -> frozenset[str]:
    """Strategies whose axis is carved out of the others' ranks (`Axis.nested`)."""
    return frozenset(name for name, strategy in strategies.items()
                     if strategy.axis is not None and strategy.axis.nested)


def spec_problems(spec: Spec, strategies: Mapping[str, Strategy[Any]]) -> list[Problem]:
    """Every cross-field problem of `spec`, the layout's and each strategy's included."""
    return checked_layout(spec, strategies)[1]


def checked_layout(spec: Spec, strategies: Mapping[str, Strategy[Any]]
                   ) -> tuple[Layout | None, list[Problem]]:
    """The resolved layout and every cross-field problem of `spec` (`spec_problems`);
    no layout when the spec names a strategy no plugin provides."""
    workload = training_problems(spec) if spec.inference is None else inference_problems(spec)
    problems = model_problems(spec.model) + hardware_problems(spec) + workload
    unknown = [name for name in spec.parallel if name not in strategies]
    problems += [Problem(f"$.parallel.{name}", "no loaded plugin provides this strategy")
                 for name in unknown]
    if problems:
        return None, problems
    layout, problems = resolve_layout(spec, strategies)
    for name in sorted(spec.parallel, key=lambda n: (strategies[n].phase, n)):
        problems += strategies[name].check(spec.parallel[name], spec, layout)
    if spec.inference is not None and spec.inference.disaggregated is not None:
        from llmpar.inference.disaggregated import disaggregated_problems

        problems += disaggregated_problems(spec, strategies)
    return layout, problems
