"""The transient buffers of a training step's memory peak, per kind of stage, before the
layout's splits (`llmpar.evaluation.peak` adds them to the steady state at each moment).

They depend on the footprint, the training table (micro-batch, sequence, recomputation,
framework profile) and the stage, never on the layout's degrees: they are training facts,
computed once per training table and stacked along a search node's training axis, and
each layout divides them by its own splits (`Part.tags`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.stages import hybrid_kinds
from llmpar.footprint.activations.common import FP32_BYTES, INSIDE_TP, OUTSIDE_TP
from llmpar.footprint.baseline import Footprint
from llmpar.footprint.inventory import SPLIT_TENSOR, ActivationInventory
from llmpar.spec import Spec
from llmpar.spec.framework import KERNEL_ACTIVATION_MODELS
from llmpar.strategy import Stage

TagBytes = Mapping[frozenset[str], float]
TensorKey = tuple[tuple[tuple[str, int], ...], int, float, frozenset[str]]
"""(shape, divisor, bytes per element, split tags) of saved tensors: tensors alike in
these are alike in size."""
VARYING = ("b", "s")
"""The shape symbols a search varies between training tables: the micro-batch and the
sequence."""

LOSS_SOURCE = (
    "PyTorch tools/autograd/derivatives.yaml: _log_softmax saves its result and backward "
    "allocates _log_softmax_backward_data(grad, result) (aten/src/ATen/native/SoftMax.cpp); "
    "nll_loss_backward allocates a gradient of its input's size; logits.float() "
    "(_to_copy) keeps no tensor, its backward casts the gradient back")
VOCAB_PARALLEL_SOURCE = (
    "Megatron-Core megatron/core/tensor_parallel/cross_entropy.py (core_r0.8.0 on, commit "
    "9634c0e4 'Reduce logit memory pressure by using in-place operation'): "
    "_VocabParallelCrossEntropy upcasts the logits (calculate_logits_max: .float()), "
    "subtracts the max and exponentiates in place and saves that tensor; backward turns "
    "the saved softmax into the gradient in place and the autograd engine casts it to the "
    "logits' dtype (torch/csrc/autograd/engine.cpp validate_outputs)")
VOCAB_PARALLEL_COPY_SOURCE = (
    "Megatron-Core megatron/core/tensor_parallel/cross_entropy.py before core_r0.8.0: "
    "_VocabParallelCrossEntropy subtracts the max from logits.float() into a new fp32 "
    "tensor, exponentiates in place and saves it; backward turns the saved softmax into "
    "the gradient in place")
FUSED_SOURCE = ("a fused cross-entropy (Megatron-Core cross_entropy_loss_fusion) keeps the "
                "softmax in the logits' dtype and writes the gradient in place")
CHUNKED_SOURCE = (
    "torchtune torchtune/modules/loss/ce_chunked_output_loss.py (commit 0031bfb0): "
    "CEWithChunkedOutputLoss runs F.cross_entropy(chunk.float(), ...) on one chunk of "
    "the tokens at a time (Tensor.chunk along the sequence), so the fp32 upcast and the "
    "backward's fp32 gradients are one chunk's; ") + LOSS_SOURCE
COMPILED_SOURCE = (
    "torch.compile'd F.cross_entropy(logits.float(), ...) (torchtune's compile_loss), "
    "measured with torch 2.13.0's inductor (validation/measure_compiled_loss.py): it saves "
    "the logits, the labels and an fp32 max and log-sum-exp per token; its backward "
    "allocates the logits' gradient in their dtype")
WGRAD_SOURCE = ("torch.autograd AccumulateGrad: a micro-batch's weight gradient is computed "
                "into a new tensor of the weight's size, then added to .grad")
TE_SOURCE = ("Transformer Engine transformer_engine/pytorch/module/base.py get_dummy_wgrad: "
             "with fuse_wgrad_accumulation each linear returns a cached empty tensor per "
             "(shape, dtype) to autograd, alive from the first backward on")
RECOMPUTE_SOURCE = ("torch.utils.checkpoint / Megatron-Core CheckpointFunction: backward "
                    "reruns one layer's forward, whose saved tensors live through that "
                    "layer's backward (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 5)")
WORKING_SET_SOURCE = ("a layer's backward holds the gradient arriving at its output and the "
                      "one it passes to its input (residual stream, b*s*h each) and the "
                      "gradient of its largest saved tensor")


@attrs.frozen(kw_only=True)
class Part:
    """One transient buffer of one GPU, before the layout's splits."""

    name: str
    source: str
    tags: TagBytes = attrs.field(factory=dict)
    """Its unsplit bytes by the split tags they carry: on one GPU, the sum of each entry
    over its tags' divisor (never below 0)."""
    largest: bool = False
    """The largest entry after splits instead of their sum (the largest saved tensor)."""
    kept: bool = False
    """A loss tensor of which the activation model may already count a part
    (`KindParts.counted`): that part is taken off it."""


@attrs.frozen(kw_only=True)
class KindParts:
    """The transient buffers of one kind of stage, by moment, before splits."""

    persistent: tuple[Part, ...] = ()
    """Allocated once by the stack and kept (alive at every moment)."""
    has_loss: bool = False
    """The stage computes the loss: the loss's and the output layer's moments exist."""
    loss_forward: tuple[Part, ...] = ()
    loss_backward: tuple[Part, ...] = ()
    output_backward: tuple[Part, ...] = ()
    counted: TagBytes = attrs.field(factory=dict)
    """What the activation model already keeps of the loss's tensors."""
    has_layers: bool = False
    """The stage runs a layer's backward."""
    layers: int = 0
    """The stage's transformer layers (its FSDP units besides the embeddings' and the
    output layer's)."""
    layer_options: tuple[tuple[Part, ...], ...] = ()
    """A layer's backward, one option per kind of layer the stage holds: the option with
    the most bytes is the one alive."""
    tensors: Mapping[TensorKey, float] = attrs.field(factory=dict)
    """The stage's saved tensors of one micro-batch, unsplit bytes of one instance of each
    sort: what the caching allocator rounds one by one."""
    tensor_counts: Mapping[TensorKey, float] = attrs.field(factory=dict)
    """How many tensors of each sort the stage keeps per micro-batch."""

    @functools.cached_property
    def tensors_by_tags(self) -> dict[frozenset[str], tuple[Any, Any]]:
        """(sizes, counts) of the tensors of each split: tuples of numbers, or, where the
        numbers are arrays (a search node's training axis), arrays with the tensors along
        a first axis, so that a layout's splits round them in one pass."""
        grouped: dict[frozenset[str], list[tuple[Any, Any]]] = {}
        for key, size in self.tensors.items():
            grouped.setdefault(key[3], []).append((size, self.tensor_counts[key]))
        found: dict[frozenset[str], tuple[Any, Any]] = {}
        for tags, items in grouped.items():
            sizes, counts = [size for size, _ in items], [count for _, count in items]
            if any(isinstance(v, np.ndarray) for v in sizes + counts):
                shape = np.broadcast_shapes(*(np.shape(v) for v in sizes + counts))
                found[tags] = (np.stack([np.broadcast_to(v, shape) for v in sizes]),
                               np.stack([np.broadcast_to(v, shape) for v in counts]))
            else:
                found[tags] = (tuple(sizes), tuple(counts))
        return found


def _part(name: str, source: str, tags: TagBytes, **flags: bool) -> Part:
    return Part(name=name, source=source, tags=dict(tags), **flags)


def scores_materialized(spec: Spec) -> bool:
    """Whether the attention kernel the stack runs writes the s x s scores: a fused
    kernel (FlashAttention, cuDNN, SDPA's flash backend) never does, whatever the
    activation model's accounting keeps (Dao 2023, arXiv:2307.08691)."""
    kernel = spec.training.profile.attention_kernel
    return KERNEL_ACTIVATION_MODELS[kernel] != "fused"


def _loss_parts(spec: Spec) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
    """The loss's tensors at its forward and backward, bytes per element of tokens x
    vocabulary (split as the logits are)."""
    model, training, profile = spec.model, spec.training, spec.training.profile
    assert model.vocab_size is not None
    d = bytes_per_element(spec.precision.activations)
    elements = training.micro_batch_size * training.sequence_length * model.vocab_size
    # Tensor.float() of fp32 logits returns them, allocating nothing (aten/src/ATen/native/
    # TensorConversions.cpp: `to` returns self when the dtype does not change)
    upcast = 0.0 if d == FP32_BYTES else FP32_BYTES
    Parts = tuple[tuple[str, float, str], ...]
    forward: Parts
    backward: Parts
    if profile.fused_cross_entropy:
        forward = (("logits", d, FUSED_SOURCE), ("softmax (kept)", d, FUSED_SOURCE))
        backward = (("softmax turned gradient (kept)", d, FUSED_SOURCE),)
    elif profile.compiled_cross_entropy:
        chunk = -(-training.sequence_length // profile.cross_entropy_chunks) / (
            training.sequence_length)
        statistics = 2 * FP32_BYTES / model.vocab_size  # max and log-sum-exp per token
        forward = (("logits (kept by the compiled loss)", d, COMPILED_SOURCE),
                   ("max and log-sum-exp per token (fp32, kept)", statistics,
                    COMPILED_SOURCE))
        # a chunk's backward frees its logits as the gradients of the others appear
        backward = (("logits, or their gradient once a chunk's backward ran (kept)", d,
                     COMPILED_SOURCE),
                    ("max and log-sum-exp per token (fp32, kept)", statistics,
                     COMPILED_SOURCE),
                    ("one chunk's gradient of the logits", d * chunk, COMPILED_SOURCE))
    elif profile.loss_kernel == "vocab-parallel":
        # fp32 logits: .float() returns them, the softmax is made in them and the
        # gradient returned needs no cast
        forward = (("logits", d, VOCAB_PARALLEL_SOURCE),
                   ("logits.float(), turned softmax in place (fp32, kept)", upcast,
                    VOCAB_PARALLEL_SOURCE))
        backward = (("softmax turned gradient (fp32, kept)", FP32_BYTES, VOCAB_PARALLEL_SOURCE),
                    ("gradient of the logits", d if upcast else 0.0, VOCAB_PARALLEL_SOURCE))
    elif profile.loss_kernel == "vocab-parallel-copy":
        forward = (("logits", d, VOCAB_PARALLEL_COPY_SOURCE),
                   ("logits.float()", upcast, VOCAB_PARALLEL_COPY_SOURCE),
                   ("softmax (fp32, kept)", FP32_BYTES, VOCAB_PARALLEL_COPY_SOURCE))
        backward = (("softmax turned gradient (fp32, kept)", FP32_BYTES,
                     VOCAB_PARALLEL_COPY_SOURCE),
                    ("gradient of the logits", d, VOCAB_PARALLEL_COPY_SOURCE))
    elif profile.cross_entropy_chunks > 1:
        # one chunk of b x ceil(s / n) tokens of the b x s at a time (Tensor.chunk)
        chunks = profile.cross_entropy_chunks
        chunk = -(-training.sequence_length // chunks) / training.sequence_length
        forward = (("logits", d, CHUNKED_SOURCE),
                   ("one chunk's logits.float()", upcast * chunk, CHUNKED_SOURCE),
                   ("log-probabilities (fp32, kept)", FP32_BYTES, CHUNKED_SOURCE))
        backward = (("log-probabilities (fp32, kept)", FP32_BYTES, CHUNKED_SOURCE),
                    ("one chunk's gradient of the log-probabilities (fp32)",
                     FP32_BYTES * chunk, CHUNKED_SOURCE),
                    ("one chunk's gradient of logits.float() (fp32)", FP32_BYTES * chunk,
                     CHUNKED_SOURCE))
    else:
        forward = (("logits", d, LOSS_SOURCE), ("logits.float()", upcast, LOSS_SOURCE),
                   ("log-probabilities (fp32, kept)", FP32_BYTES, LOSS_SOURCE))
        backward = (("log-probabilities (fp32, kept)", FP32_BYTES, LOSS_SOURCE),
                    ("gradient of the log-probabilities (fp32)", FP32_BYTES, LOSS_SOURCE),
                    ("gradient of logits.float() (fp32)", FP32_BYTES, LOSS_SOURCE))

    def parts(listed: Parts) -> tuple[Part, ...]:
        return tuple(_part(name, source, {INSIDE_TP: elements * size}, kept="kept" in name)
                     for name, size, source in listed)

    return parts(forward), parts(backward)


def _counted_loss(inventory: ActivationInventory) -> dict[frozenset[str], float]:
    """What the activation model already keeps of the loss: the head's vocabulary-wide
    tensors other than soft-capping's tanh output."""
    found: dict[frozenset[str], float] = {}
    for t in inventory.fixed:
        if t.placement == "head" and "tanh" not in t.name and any(
                symbol == "V" for symbol, _ in t.shape):
            found[t.splits] = found.get(t.splits, 0.0) + t.bytes
    return found


def _output_parts(spec: Spec, footprint: Footprint,
                  parameters: Mapping[str, float]) -> tuple[Part, ...]:
    """The output layer's backward: the logits' gradient, its weight's gradient (none
    where fine-tuning freezes it: autograd computes no gradient of a weight that does not
    require one) and the gradient of its input."""
    model, training = spec.model, spec.training
    assert model.vocab_size is not None and model.hidden_size is not None
    d = bytes_per_element(spec.precision.activations)
    tokens = training.micro_batch_size * training.sequence_length
    group = "head" if parameters.get("head", 0.0) else "embedding"
    head = parameters.get("head", 0.0) or (parameters.get("embedding", 0.0)
                                            if model.tie_embeddings else 0.0)
    tuned = footprint.finetune
    if tuned is not None and not tuned.trainable_by_group.get(group, 0.0):
        head = 0.0
    return (
        _part("gradient of the logits", LOSS_SOURCE, {INSIDE_TP: tokens * model.vocab_size * d}),
        _part("output layer's weight gradient", WGRAD_SOURCE, {frozenset({SPLIT_TENSOR}): min(
            head, model.vocab_size * model.hidden_size) * d}),
        _part("gradient of the output layer's input", LOSS_SOURCE,
              {OUTSIDE_TP: tokens * model.hidden_size * d}),
    )


def _linear_parameters(spec: Spec, footprint: Footprint, stage: Stage, dense: int,
                       moe: int) -> float:
    """Parameters of one layer's distinct linear weights, of each kind of layer the stage
    holds (one routed expert's for MoE layers; each token mixer's of a hybrid model)."""
    model = spec.model
    groups = footprint.parameters_by_group
    layers = model.num_layers or 1
    found = 0.0
    if model.mixer_pattern is not None:  # each token mixer the stage's layers have
        held, total = (model.mixers_in(stage.first_layer, stage.num_layers),
                       model.mixers_in(0, layers))
        found += sum(groups.get(kind, 0.0) / total[kind] for kind in held)
    elif dense or moe:
        found += groups.get("attention", 0.0) / layers
    if dense and model.num_dense_layers:
        found += groups.get("mlp", 0.0) / model.num_dense_layers
    if moe and model.moe is not None and model.num_moe_layers:
        per_layer = groups.get("experts", 0.0) / model.num_moe_layers
        found += per_layer / model.moe.num_experts
        found += groups.get("shared_experts", 0.0) / model.num_moe_layers
    return found


def _layer_options(spec: Spec, inventory: ActivationInventory, stage: Stage, dense: int,
                   moe: int, rerun: int) -> tuple[tuple[Part, ...], ...]:
    """One layer's backward per kind of layer the stage holds: its recomputed tensors
    (under recomputation) and its working set."""
    assert spec.model.hidden_size is not None
    training = spec.training
    d = bytes_per_element(spec.precision.activations)
    hidden = training.micro_batch_size * training.sequence_length * spec.model.hidden_size * d
    present = {"dense": dense, "moe": moe, "layer": dense + moe}
    mixed = hybrid_kinds(spec, stage)
    if mixed is not None:  # a hybrid model's groups by (MLP, mixer) kind
        present.update({**{k: 0 for k in inventory.kinds if " " in k}, **mixed})
    scores = scores_materialized(spec)
    mode = training.recompute
    options = []
    for group in inventory.groups:
        if not present.get(group.kind, group.count):
            continue
        total: dict[frozenset[str], float] = {}
        largest: dict[frozenset[str], float] = {}
        attention: dict[frozenset[str], float] = {}
        for t in group.tensors:
            if t.attention_score:
                attention[t.splits] = attention.get(t.splits, 0.0) + t.bytes
                if not scores:
                    continue
            total[t.splits] = total.get(t.splits, 0.0) + t.bytes
            largest[t.splits] = max(largest.get(t.splits, 0.0), t.bytes)
        # One part whatever the mode, named alike: a search stacks the parts of its
        # training tables. Full: the layer's saved tensors, less the checkpoint (its
        # input, counted in the steady state); selective: its attention scores.
        rerun_tags: dict[frozenset[str], float] = {}
        op_level = mode == "selective" and training.recompute_policy is not None
        if (mode == "full" and rerun) or op_level:  # op-level: the block reruns whole
            rerun_tags = dict(total)
            rerun_tags[OUTSIDE_TP] = rerun_tags.get(OUTSIDE_TP, 0.0) - hidden
        elif mode == "selective" and scores:
            rerun_tags = attention
        found = [_part(f"recomputed tensors of one {group.kind} layer", RECOMPUTE_SOURCE,
                       rerun_tags)]
        found.append(_part("gradients at the layer's output and input", WORKING_SET_SOURCE,
                           {OUTSIDE_TP: 2 * hidden}))
        found.append(_part("gradient of the layer's largest saved tensor", WORKING_SET_SOURCE,
                           largest, largest=True))
        options.append(tuple(found))
    return tuple(options)


def _tensors(inventory: ActivationInventory
             ) -> tuple[dict[TensorKey, float], dict[TensorKey, float]]:
    """(bytes of one, instances) of each sort of saved tensor of a stage."""
    sizes: dict[TensorKey, float] = {}
    counts: dict[TensorKey, float] = {}
    listed = [(t, group.count) for group in inventory.groups if group.count
              for t in group.tensors] + [(t, 1) for t in inventory.fixed]
    for t, count in listed:
        # the micro-batch and the sequence left out, so that the training tables of a
        # search share their keys; the whole shape where that would mix two sizes
        shape = tuple((symbol, 0 if symbol in VARYING else size) for symbol, size in t.shape)
        key = (shape, t.divisor, t.bytes_per_element, t.splits)
        if sizes.get(key, t.bytes) != t.bytes:
            key = (t.shape, t.divisor, t.bytes_per_element, t.splits)
        sizes[key] = t.bytes
        counts[key] = counts.get(key, 0.0) + count
    return sizes, counts


def kind_parts(spec: Spec, footprint: Footprint, stage: Stage,
               parameters: Mapping[str, float], staged: ActivationInventory | None,
               dense: int, moe: int, rerun: int) -> KindParts:
    """The transients of the kind of stage `stage` stands for: `parameters` its
    parameters by group (unsharded), `staged` its saved tensors (`stage_inventory`),
    `dense` and `moe` its layers of each kind, `rerun` the layers full recomputation
    reruns."""
    persistent: tuple[Part, ...] = ()
    if spec.training.profile.dummy_weight_gradients and stage.num_layers:
        size = _linear_parameters(spec, footprint, stage, dense, moe) * bytes_per_element(
            spec.precision.activations)
        persistent = (_part("Transformer Engine dummy weight gradients", TE_SOURCE,
                            {frozenset({SPLIT_TENSOR}): size}),)
    inventory = footprint.activations
    if inventory is None:
        return KindParts(persistent=persistent)
    sizes, counts = ({}, {}) if staged is None else _tensors(staged)
    loss: dict[str, Any] = {}
    if stage.has_head and spec.model.vocab_size:
        forward, backward = _loss_parts(spec)
        loss = dict(has_loss=True, loss_forward=forward, loss_backward=backward,
                    counted=_counted_loss(inventory),
                    output_backward=_output_parts(spec, footprint, parameters))
    layers = bool(stage.num_layers and inventory.groups)
    return KindParts(persistent=persistent, tensors=sizes, tensor_counts=counts,
                     has_layers=layers, layers=stage.num_layers, layer_options=_layer_options(
                         spec, inventory, stage, dense, moe, rerun) if layers else (), **loss)
