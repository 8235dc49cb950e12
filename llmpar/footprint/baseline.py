"""The baseline footprint of one unsplit replica, before any strategy applies."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from llmpar.finetune.footprint import FinetuneFootprint
from llmpar.footprint.activation_models import (
    ACTIVATION_MODELS,
    ActivationModel,
    ActivationUnavailable,
)
from llmpar.footprint.flops import (
    BACKWARD_TO_FORWARD,
    AttentionKernel,
    ForwardFlops,
    forward_flops_per_sequence,
)
from llmpar.footprint.inventory import ActivationInventory
from llmpar.footprint.mtp import mtp_forward_flops, plus_flops, trained_mtp_groups
from llmpar.footprint.parameters import ParameterCount, count_parameters
from llmpar.spec import Spec


@attrs.frozen(kw_only=True)
class Footprint:
    """Parameters, FLOPs and saved activations of one replica and one micro-batch."""

    parameters: ParameterCount
    forward_flops_per_sequence: ForwardFlops | None
    """None for a model given only by its size (then 6ND is all there is)."""
    activations: ActivationInventory | None
    activations_unavailable: str | None = None
    """Why there is no activation estimate, when there is none."""
    attention_kernel: AttentionKernel = "fused"
    """How attention runs, as the activation model has it (`attention_kernel_of`)."""
    finetune: FinetuneFootprint | None = None
    """What `[finetune]` adds, trains and skips (None: full training)."""
    mtp_by_group: dict[str, int] = attrs.field(factory=dict, hash=False)
    """The trained multi-token-prediction modules' parameters, by the group they are held
    in, all on the last pipeline stage (`[training] multi_token_prediction`,
    `llmpar.footprint.mtp`); empty without them. Not in `parameters`, the main model's."""

    @property
    def parameters_by_group(self) -> dict[str, float]:
        """Parameters by group; one group "all" for a model given by its size. A
        fine-tuning method's adapters and trained copies are groups of their own."""
        groups: dict[str, float] = {**self.parameters.by_group} or {"all": self.parameters.total}
        tuned = self.finetune
        if tuned is not None:
            groups.update(tuned.adapters_by_group)
            groups.update(tuned.copies_by_group)
        return groups

    @property
    def trainable_by_group(self) -> dict[str, float]:
        """Parameters that get gradients and optimizer states, by group: all of them in
        pre-training, what `[finetune]` trains in fine-tuning."""
        if self.finetune is None:
            return self.parameters_by_group
        return dict(self.finetune.trainable_by_group)

    @property
    def stored_weights_by_group(self) -> dict[str, float]:
        """Parameters by group, a quantized fine-tuning base counted at its bytes per
        weight over `[precision] weights`' (16-bit equivalents); `parameters_by_group`
        otherwise."""
        groups = self.parameters_by_group
        factors = {} if self.finetune is None else self.finetune.weight_factors
        return {g: c * factors.get(g, 1.0) for g, c in groups.items()} if factors else groups

    def train_flops_per_sequence(self) -> float | None:
        """Forward plus backward model FLOPs of one sequence."""
        if self.forward_flops_per_sequence is None:
            return None
        return (1.0 + BACKWARD_TO_FORWARD) * self.forward_flops_per_sequence.total

    def executed_train_flops_per_sequence(self) -> float | None:
        """Forward plus backward FLOPs the GPU executes for one sequence, before any
        recomputation: the model FLOPs with attention as its kernel runs it."""
        if self.forward_flops_per_sequence is None:
            return None
        return (1.0 + BACKWARD_TO_FORWARD) * self.forward_flops_per_sequence.executed_total


def attention_kernel_of(activations: ActivationInventory | None) -> AttentionKernel:
    """The attention kernel a run uses, decided in one place: eager where its activation
    model keeps the s x s scores for backward (korthikanti: Megatron-LM's unfused
    attention, Korthikanti et al. 2022, Sec. 4; hf-eager; hf-sdpa where SDPA falls back
    to its math path), fused (FlashAttention, cuDNN, SDPA's flash and memory-efficient
    backends) where it keeps none (fused; hf-sdpa's usual case; coefficient, which
    counts no scores; no estimate at all)."""
    if activations is not None and activations.has_attention_scores:
        return "eager"
    return "fused"


def tuned_footprint(spec: Spec, groups: dict[str, int],
                    executed_attention: float = 0.0) -> FinetuneFootprint | None:
    """`[finetune]`'s part of the footprint, with what the whole model trains."""
    from llmpar.evaluation.stages import whole_model_stage  # it imports this module
    from llmpar.finetune.footprint import finetune_footprint
    from llmpar.finetune.trainable import trainable_held

    tuned = finetune_footprint(spec, groups, executed_attention)
    if tuned is None:
        return None
    held = {**groups, **tuned.adapters_by_group, **tuned.copies_by_group}
    trainable = trainable_held(spec.model, tuned, whole_model_stage(spec), held)
    return attrs.evolve(tuned, trainable_by_group=trainable)


def baseline_footprint(spec: Spec,
                       models: Mapping[str, ActivationModel] | None = None) -> Footprint:
    """Count parameters, FLOPs and activations of `spec`'s model and workload; `models`
    are the activation models by name (default llmpar's own)."""
    model, training = spec.model, spec.training
    activations, unavailable = None, None
    try:
        model_of = (ACTIVATION_MODELS if models is None else models).get(
            training.activation_model)
        if model_of is None:
            raise ActivationUnavailable(f"no activation model {training.activation_model!r}")
        activations = model_of(spec)
        if spec.tuning is not None:
            from llmpar.finetune.activations import with_adapters, without_frozen_inputs

            activations = with_adapters(spec, without_frozen_inputs(spec, activations))
    except ActivationUnavailable as exc:
        unavailable = str(exc)
    kernel = attention_kernel_of(activations)
    flops = None
    if model.has_architecture:
        causal = training.attention_flops == "causal"
        flops = forward_flops_per_sequence(model, training.sequence_length, causal, kernel)
    mtp = trained_mtp_groups(spec)
    if mtp and flops is not None:  # the modules' forward joins the model's (model FLOPs)
        flops = plus_flops(flops, mtp_forward_flops(model, training.sequence_length, causal,
                                                    kernel))
    parameters = count_parameters(model)
    return Footprint(
        parameters=parameters,
        forward_flops_per_sequence=flops,
        activations=activations,
        activations_unavailable=unavailable,
        attention_kernel=kernel,
        mtp_by_group=mtp,
        finetune=None if spec.tuning is None else tuned_footprint(
            spec, parameters.by_group, 0.0 if flops is None else flops.executed_attention),
    )
