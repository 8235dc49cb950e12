"""`[workload.dpo]`: what DPO runs beside the trained policy.

DPO (Rafailov et al. 2023, arXiv:2305.18290, Eq. 7) trains the policy on pairs of a chosen
and a rejected response with a loss of four log-probabilities: the policy's and a frozen
reference model's, of each response. As Hugging Face TRL's `DPOTrainer` runs it
(trl/trainer/dpo_trainer.py, `_compute_loss`, TRL 1.10.0.dev0):

- the policy runs forward and backward on the batch `[chosen, rejected]`: a step of B pairs
  is 2B sequences, which `[training]` counts as it counts any sequences (this module
  checks that they come in pairs);
- the reference runs forward only, under `torch.no_grad()`, on the same 2B sequences: its
  FLOPs are a forward pass's (2 N per token plus attention: Kaplan et al. 2020,
  arXiv:2001.08361, Sec. 2.1), its activations are not kept for a backward pass; what it
  holds at once is its logits (`ref_outputs.logits`, micro-batch x sequence x vocabulary
  in the model's format) and one sequence's log-softmax (`selective_log_softmax` in
  trl/trainer/utils.py loops over the rows "to reduce peak mem consumption"), beside the
  policy's saved activations, whose backward has not run yet;
- the reference's weights: a second model (TRL's `create_model_from_path`), prepared with
  the policy's ZeRO stage under ZeRO-3 and whole otherwise (trl/models/utils.py,
  `prepare_deepspeed`: "If ZeRO-3 is used, we shard both the active and reference model");
  or none beyond the policy's, for a PEFT policy (`ref_model = None`: the adapters are
  disabled for the reference forward) or with `precompute_ref_log_probs` (a pass over the
  data set before training computes them: "the reference model does not need to be kept
  in memory during training").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmpar import FrozenWeights, Rule, StrategyContext, Transform, Workload
from llmpar.arrays import is_array
from llmpar.spec import Spec
from llmpar.strategies.common import bytes_per_element

from llmpar_dpo.config import DpoConfig

SEQUENCES_PER_PAIR = 2
"""A chosen and a rejected response."""
REFERENCE = "reference"


def reference_of(config: DpoConfig, spec: Spec) -> str:
    """The reference `config` asks for, "auto" resolved as TRL resolves it: the base with
    adapters disabled under an adapter method, else a copy."""
    if config.reference != "auto":
        return config.reference
    tuning = spec.tuning
    return "base" if tuning is not None and tuning.adapters else "copy"


def forward_flops_per_sequence(spec: Spec, ctx: StrategyContext) -> float:
    """Model FLOPs of the reference's forward pass over one sequence: the architecture's
    forward (projections, attention, logits), or 2 N per token from a size."""
    forward = ctx.footprint.forward_flops_per_sequence
    if forward is not None:
        return float(forward.total)
    return 2.0 * ctx.footprint.parameters.active * spec.training.sequence_length


def reference_forward_bytes(spec: Spec, ctx: StrategyContext) -> Any:
    """What the reference's forward holds at once on one GPU: the logits of the
    micro-batch and one sequence's log-softmax, in the activations' format, the
    vocabulary split over tensor ranks (Megatron-style vocabulary-parallel output layer)
    and the sequence over context ranks. Charged to every pipeline stage (an upper
    bound: only the last computes logits)."""
    model, training = spec.model, spec.training
    if model.vocab_size is None:
        return 0.0
    layout = ctx.layout
    per_sequence = (training.sequence_length * model.vocab_size
                    * bytes_per_element(spec.precision.activations)
                    / (layout.degree("tensor") * layout.degree("context")))
    return (training.micro_batch_size + 1) * per_sequence


class DpoWorkload(Workload[DpoConfig]):
    name = "dpo"
    config_type = DpoConfig

    def rules(self, config: DpoConfig, spec: Spec) -> Sequence[Rule]:
        training = spec.training
        path = "$.workload.dpo.reference"
        reference = reference_of(config, spec)
        tuning = spec.tuning
        batch = training.global_batch_size
        return [
            Rule("$.training.global_batch_size",
                 batch is not None and not is_array(batch) and batch % SEQUENCES_PER_PAIR != 0,
                 lambda: f"a DPO step trains pairs (a chosen and a rejected response): "
                         f"global_batch_size counts sequences and must be even, got {batch}"),
            Rule(path, reference == "base" and (tuning is None or not tuning.adapters),
                 lambda: "reference = \"base\" is the policy with its adapters disabled: it "
                         "needs [finetune] method = \"lora\", \"qlora\" or \"dora\", got "
                         f"{'full training' if tuning is None else repr(tuning.method)}"),
            Rule("$.workload.dpo.reference_format",
                 config.reference_format is not None and reference != "copy",
                 lambda: f"only a reference copy has a format of its own; the reference here "
                         f"is {reference!r}"),
        ]

    def transform(self, config: DpoConfig, ctx: StrategyContext) -> Transform:
        spec, layout = ctx.spec, ctx.layout
        reference = reference_of(config, spec)
        training = spec.training
        batch = training.global_batch_size or training.micro_batch_size * layout.degree("data")
        pairs = batch / SEQUENCES_PER_PAIR
        notes = [f"{pairs:g} pairs per step: {batch} sequences (chosen and rejected) through "
                 "the policy's forward and backward"]
        forward = forward_flops_per_sequence(spec, ctx)
        if reference == "precomputed":
            notes.append(f"reference log-probabilities precomputed before training "
                         f"(precompute_ref_log_probs): no reference in memory or in the step; "
                         f"the pass costs {forward:.3g} FLOPs per sequence once")
            return Transform(strategy=self.name, notes=tuple(notes))
        frozen: tuple[FrozenWeights, ...] = ()
        warnings: list[str] = []
        if reference == "copy":
            size = bytes_per_element(config.reference_format or spec.precision.weights)
            frozen = (FrozenWeights(
                name=REFERENCE, bytes_per_parameter=size,
                reason="DPO's frozen reference, a copy of the policy's base, split as its "
                       "weights are (TRL prepare_deepspeed)"),)
            notes.append(f"reference: a frozen copy of the policy in "
                         f"{config.reference_format or spec.precision.weights}")
            zero = layout.setting("data.zero_stage", 0)
            if not is_array(zero) and zero == 3 and layout.degree("data") > 1:
                warnings.append("the reference's ZeRO-3 weight gathers for its forward pass "
                                "are not costed")
        else:
            notes.append("reference: the policy's base weights with the adapters disabled")
        notes.append("reference forward (no backward) on every sequence: its logits and "
                     "one sequence's log-softmax held beside the policy's activations")
        return Transform(strategy=self.name, frozen_weights=frozen,
                         model_flops_per_step=forward * batch,
                         buffer_bytes=reference_forward_bytes(spec, ctx),
                         notes=tuple(notes), warnings=tuple(warnings))
