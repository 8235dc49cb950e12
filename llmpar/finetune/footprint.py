"""What a fine-tuning method changes in one replica's footprint: the adapters it adds,
the parameters it trains, the products it skips or adds, and the bytes per frozen
weight.

Adapters (Hu et al. 2021, LoRA, arXiv:2106.09685, Sec. 4.1): each targeted linear layer
W (in x out) gains A (in x r) and B (r x out), r x (in + out) parameters, no bias, as
Hugging Face PEFT builds them (`peft/tuners/lora/layer.py`, `LoraLayer.update_layer`:
`nn.Linear(in_features, r, bias=False)` and `nn.Linear(r, out_features, bias=False)`);
DoRA (Liu et al. 2024, arXiv:2402.09353, Sec. 4; PEFT's `lora_magnitude_vector`) adds a
magnitude of out features per layer. `modules_to_save` trains a copy of the module and
keeps the original (PEFT's `ModulesToSaveWrapper`).

FLOPs (Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1; Narayanan et al. 2021,
arXiv:2104.04473, Sec. 5.1: a product's backward is an input-gradient and a
weight-gradient product, each as large as the forward): a frozen weight needs no
weight-gradient product, so its forward FLOPs are skipped once per step and 4 of the 6
units of 6ND remain; each adapter product x A and (x A) B costs 2 x tokens x r x (in + out)
per pass, 3 passes (forward, input gradient, weight gradient).

Tensor parallelism (Hugging Face PEFT's `LoraParallelLinear`, peft/tuners/lora/tp_layer.py,
over Megatron-Core's parallel linears): under a column-parallel base layer (its output
split: q/k/v, gate and up projections) A stays whole on every rank and B is split by its
output columns, r x out / t; under a row-parallel one (its input split: o_proj,
down_proj) A is split by its input rows, in / t x r, and B stays whole. The whole factor's
products run on every tensor rank. MLA's down projections (q_a_proj, kv_a_proj_with_mqa)
are not split in Megatron-Core (`parallel_mode="duplicated"`): their adapters stay whole.
"""

from __future__ import annotations

import attrs

from llmpar.dtypes import blockwise_bytes_per_element, bytes_per_element
from llmpar.finetune.targets import Linear, block_linears, targeted
from llmpar.footprint.parameters import parameter_groups
from llmpar.spec import Model, Spec
from llmpar.spec.finetune import LAYER_RANGE, Finetune

ADAPTER_GROUPS = {"attention": "attention_adapters", "mlp": "mlp_adapters",
                  "experts": "expert_adapters", "shared_experts": "shared_expert_adapters"}
"""The group of the adapters on each group's linear layers."""
COPY_SUFFIX = "_copy"
"""`modules_to_save`: the trained copy of group g is the group g + "_copy"."""
QUANTIZED_GROUPS = frozenset({"attention", "mlp", "experts", "shared_experts"})
"""Groups whose linear layers QLoRA stores quantized: bitsandbytes replaces the blocks'
`nn.Linear` modules (transformers' `replace_with_bnb_linear` skips the output layer);
embeddings, norms and biases stay in 16-bit."""
ROW_PARALLEL = frozenset({"o_proj", "down_proj"})
"""Linear layers whose input tensor parallelism splits (Megatron's RowParallelLinear:
linear_proj, linear_fc2); the others it splits by their output (ColumnParallelLinear)."""
DUPLICATED = frozenset({"q_a_proj", "kv_a_proj_with_mqa"})
"""Linear layers tensor parallelism keeps whole on every rank (MLA's down projections)."""
INT8_ROW_SCALE_BYTES = 4.0
"""LLM.int8 (Dettmers et al. 2022, arXiv:2208.07339, Sec. 3.1): one fp32 absmax per
output row of a weight (bitsandbytes' `SCB`), over `in_features` weights."""


def beside(group: str) -> str:
    """The base group an adapter or copy group lives beside (itself for a base group)."""
    for base, adapter in ADAPTER_GROUPS.items():
        if group == adapter:
            return base
    return group.removesuffix(COPY_SUFFIX)


@attrs.frozen(kw_only=True)
class FinetuneFootprint:
    """The method's part of one replica's footprint."""

    method: str
    adapters_by_group: dict[str, float] = attrs.field(factory=dict, hash=False)
    copies_by_group: dict[str, float] = attrs.field(factory=dict, hash=False)
    """Trained copies of `modules_to_save`, by copy group."""
    frozen_groups: frozenset[str] = frozenset()
    """Base groups kept fixed in every layer."""
    frozen_layers: frozenset[int] = frozenset()
    """Blocks whose groups are all kept fixed (`layers[a:b]`)."""
    weight_factors: dict[str, float] = attrs.field(factory=dict, hash=False)
    """Bytes per weight of a group over `[precision] weights`' (QLoRA's base)."""
    dequantized_bytes: dict[str, float] = attrs.field(factory=dict, hash=False)
    """QLoRA: bytes one pass moves per parameter of a group to dequantize its base
    linear layers (`dequantization_bytes`)."""
    backward_free_layers: int = 0
    """Leading blocks with nothing trainable at or before them (`backward_free_layers`):
    no backward pass runs through them."""
    skipped_flops_per_sequence: float = 0.0
    adapter_flops_per_sequence: float = 0.0
    trainable_by_group: dict[str, float] = attrs.field(factory=dict, hash=False)
    """What the whole model trains, by group (`llmpar.finetune.trainable`)."""
    transient_bytes: float = 0.0
    """The largest weight a step materializes at once in the compute format: QLoRA's
    dequantized base weight (bitsandbytes' `dequantize_4bit` before each product), DoRA's
    W + BA for its norm."""
    tensor_split_by_group: dict[str, float] = attrs.field(factory=dict, hash=False)
    """Adapter parameters a tensor-parallel split divides, by adapter group: B (and DoRA's
    magnitude) of column-parallel layers, A of row-parallel ones (`tensor_split`)."""
    tensor_whole_flops_by_group: dict[str, float] = attrs.field(factory=dict, hash=False)
    """Adapter FLOPs of one sequence that a tensor-parallel split leaves whole, so every
    tensor rank runs them: A's products under column-parallel layers, B's under
    row-parallel ones, both under duplicated ones; by adapter group."""

    @property
    def trains_base(self) -> bool:
        """Whether base groups train (method "frozen"); adapter methods train only
        adapters and copies."""
        return self.method == "frozen"


def frozen_layers_of(finetune: Finetune, layers: int) -> frozenset[int]:
    found: set[int] = set()
    for entry in finetune.frozen:
        match = LAYER_RANGE.match(entry)
        if match:
            start = int(match.group(1)) if match.group(1) else 0
            stop = int(match.group(2)) if match.group(2) else layers
            found.update(range(start, min(stop, layers)))
    return frozenset(found)


def linear_layers_frozen(linear: Linear, model: Model, frozen: frozenset[int]) -> int:
    """Blocks among `linear`'s that a layer range freezes."""
    if linear.group == "attention":
        return len(frozen)
    moe = sum(1 for i in frozen if model.is_moe_layer(i))
    return moe if linear.group in ("experts", "shared_experts") else sum(
        1 for i in frozen if model.has_mlp(i)) - moe


def adapter_parameters(linear: Linear, finetune: Finetune) -> float:
    """PEFT's trainable parameters of one linear layer's adapter, all its copies."""
    per_copy = finetune.rank * (linear.in_features + linear.out_features)
    if finetune.method == "dora":
        per_copy += linear.out_features
    return float(per_copy * linear.copies * linear.layers)


def tensor_split(linear: Linear, finetune: Finetune) -> tuple[float, float]:
    """(adapter parameters a tensor split divides, r-wide product elements per token
    it leaves whole) of one linear layer's adapter, all its copies (`LoraParallelLinear`:
    see the module docstring)."""
    r, copies = finetune.rank, linear.copies * linear.layers
    magnitude = linear.out_features if finetune.method == "dora" else 0
    if linear.name in DUPLICATED:
        return 0.0, float(r * (linear.in_features + linear.out_features) * copies)
    if linear.name in ROW_PARALLEL:
        return float(r * linear.in_features * copies), float(r * linear.out_features * copies)
    return (float((r * linear.out_features + magnitude) * copies),
            float(r * linear.in_features * copies))


def head_weights(model: Model) -> float:
    assert model.vocab_size is not None and model.hidden_size is not None
    return float(model.vocab_size * model.hidden_size)


def router_weights(model: Model) -> float:
    if model.moe is None or model.hidden_size is None:
        return 0.0
    return float(model.hidden_size * model.moe.num_experts * model.num_moe_layers)


def frozen_active_weights(model: Model, finetune: Finetune, frozen_groups: frozenset[str],
                          frozen: frozenset[int]) -> float:
    """Active weights (those a token multiplies by) of the frozen products."""
    total = 0.0
    for linear in block_linears(model):
        per_layer = linear.in_features * linear.out_features * linear.active
        layers = linear.layers if linear.group in frozen_groups else linear_layers_frozen(
            linear, model, frozen)
        total += per_layer * layers
    if "router" in frozen_groups:
        total += router_weights(model)
    logits_weight = "embedding" if model.tie_embeddings else "head"
    if logits_weight in frozen_groups or "head" in frozen_groups:
        total += head_weights(model)
    return total


def frozen_base_groups(finetune: Finetune, groups: dict[str, int]) -> frozenset[str]:
    """Base groups fixed in every layer: all but the copies' under an adapter method,
    the named ones under "frozen"."""
    if finetune.adapters:
        return frozenset(groups)
    return frozenset(g for g in finetune.frozen if g in groups)


def quantized_bytes_per_weight(spec: Spec, finetune: Finetune) -> float:
    """QLoRA: bytes per base linear weight in `base_format`, its scales included."""
    model = spec.model
    assert model.hidden_size is not None
    if finetune.base_format == "int8":
        return 1.0 + INT8_ROW_SCALE_BYTES / model.hidden_size
    return blockwise_bytes_per_element(finetune.base_format, finetune.block_size,
                                       finetune.double_quantization)


def linear_weights_by_group(model: Model) -> dict[str, float]:
    weights: dict[str, float] = {}
    for linear in block_linears(model):
        weights[linear.group] = weights.get(linear.group, 0.0) + linear.weights
    return weights


def dequantization_bytes(spec: Spec, finetune: Finetune,
                         groups: dict[str, int]) -> dict[str, float]:
    """QLoRA: bytes one pass moves per parameter of each quantized group to dequantize
    its linear layers: it reads the stored weight and writes it in the compute format
    (bitsandbytes' `dequantize_4bit` before each product of `Linear4bit`, forward and
    backward: QLoRA, Dettmers et al. 2023, Sec. 3, "we dequantize the storage data type to
    the computation data type to perform the forward and backward pass")."""
    if finetune.method != "qlora" or finetune.base_format == "bf16":
        return {}
    moved = quantized_bytes_per_weight(spec, finetune) + bytes_per_element(
        spec.precision.activations)
    return {group: matrices / groups[group] * moved
            for group, matrices in linear_weights_by_group(spec.model).items()
            if groups.get(group)}


def weight_factors(spec: Spec, finetune: Finetune, groups: dict[str, int]) -> dict[str, float]:
    """QLoRA: bytes per weight of each quantized group over the 16-bit weights': the
    linear layers' weights in `base_format`, biases and norms inside the group as they
    were."""
    if finetune.method != "qlora" or finetune.base_format == "bf16":
        return {}
    size = bytes_per_element(spec.precision.weights)
    quantized = quantized_bytes_per_weight(spec, finetune)
    found = {}
    for group, matrices in linear_weights_by_group(spec.model).items():
        count = groups.get(group, 0)
        if count:
            found[group] = (matrices * quantized + (count - matrices) * size) / (count * size)
    return found


def layer_groups(model: Model, index: int) -> frozenset[str]:
    """The per-layer parameter groups block `index` has."""
    if not model.is_moe_layer(index):
        return frozenset({"attention", "norms", "mlp"})
    assert model.moe is not None
    shared = {"shared_experts"} if model.moe.num_shared_experts else set()
    return frozenset({"attention", "norms", "experts", "router"} | shared)


def backward_free_layers(model: Model, finetune: Finetune, frozen_groups: frozenset[str],
                         frozen: frozenset[int]) -> int:
    """Under method "frozen", the leading blocks before the first trainable parameter
    (the embedding frozen too): autograd runs no backward through them, since nothing
    before them needs a gradient (PyTorch builds no graph for operations whose inputs and
    parameters do not require gradients), so they keep no activations and skip their
    input-gradient products as well."""
    if finetune.method != "frozen" or "embedding" not in frozen_groups:
        return 0
    layers = model.num_layers or 0
    for index in range(layers):
        if index not in frozen and not layer_groups(model, index) <= frozen_groups:
            return index
    return layers


def backward_free_layers_of(spec: Spec, frozen: frozenset[int]) -> int:
    """`backward_free_layers` of `spec`'s `[finetune]` (0 without one)."""
    finetune = spec.tuning
    if finetune is None:
        return 0
    groups = parameter_groups(spec.model)
    return backward_free_layers(spec.model, finetune, frozen_base_groups(finetune, groups),
                                frozen)


def backward_free_flops(model: Model, layers: int, sequence_length: int,
                        executed_attention: float) -> float:
    """What the blocks without a backward pass skip beyond their weight gradients: their
    input-gradient products (as large as the forward products) and attention's backward
    (twice its forward: Dao et al. 2022, FlashAttention, arXiv:2205.14135, Sec. 3.1's
    dQ, dK, dV), one sequence."""
    if not layers:
        return 0.0
    prefix = frozenset(range(layers))
    products = sum(linear.in_features * linear.out_features * linear.active
                   * linear_layers_frozen(linear, model, prefix) for linear in block_linears(model))
    assert model.num_layers
    return 2.0 * sequence_length * products + 2.0 * executed_attention * layers / model.num_layers


def finetune_footprint(spec: Spec, groups: dict[str, int],
                       executed_attention: float = 0.0) -> FinetuneFootprint | None:
    """The method's footprint for `spec`'s model with base groups `groups`; None where
    `[finetune]` changes nothing (absent, or method = "full")."""
    finetune = spec.tuning
    if finetune is None:
        return None
    model = spec.model
    assert model.num_layers is not None
    s = spec.training.sequence_length
    frozen = frozenset() if finetune.adapters else frozen_layers_of(finetune, model.num_layers)
    frozen_groups = frozen_base_groups(finetune, groups)
    adapters: dict[str, float] = {}
    split: dict[str, float] = {}
    whole_flops: dict[str, float] = {}
    adapter_flops = 0.0
    linears = targeted(model, finetune.targets, finetune.all_linear) if finetune.adapters else ()
    for linear in linears:
        name = ADAPTER_GROUPS[linear.group]
        adapters[name] = adapters.get(name, 0.0) + adapter_parameters(linear, finetune)
        per_token = finetune.rank * (linear.in_features + linear.out_features)
        adapter_flops += 3 * 2 * s * per_token * linear.active * linear.layers
        divided, whole = tensor_split(linear, finetune)
        split[name] = split.get(name, 0.0) + divided
        # whole counts every copy; a token passes `active` of them
        whole_flops[name] = (whole_flops.get(name, 0.0)
                             + 3 * 2 * s * whole / linear.copies * linear.active)
    copies = ({g + COPY_SUFFIX: float(groups[g]) for g in finetune.saved_groups if g in groups}
              if finetune.adapters else {})
    base_frozen = frozen_groups - set(finetune.saved_groups) if finetune.adapters else \
        frozen_groups
    skipped = 2.0 * s * frozen_active_weights(model, finetune, base_frozen, frozen)
    free = backward_free_layers(model, finetune, frozen_groups, frozen)
    skipped += backward_free_flops(model, free, s, executed_attention)
    transient = 0.0
    quantized = finetune.method == "qlora" and finetune.base_format != "bf16"
    if quantized or finetune.method == "dora":
        largest = max((linear.in_features * linear.out_features for linear in (
            block_linears(model) if quantized else linears)), default=0)
        transient = largest * bytes_per_element(spec.precision.activations)
    return FinetuneFootprint(
        method=finetune.method, adapters_by_group=adapters, copies_by_group=copies,
        frozen_groups=frozen_groups, frozen_layers=frozen,
        weight_factors=weight_factors(spec, finetune, groups),
        dequantized_bytes=dequantization_bytes(spec, finetune, groups),
        backward_free_layers=free,
        skipped_flops_per_sequence=skipped, adapter_flops_per_sequence=adapter_flops,
        transient_bytes=transient, tensor_split_by_group=split,
        tensor_whole_flops_by_group=whole_flops)
