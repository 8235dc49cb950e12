"""`[workload.dpo]`: where the reference model's log-probabilities come from."""

from __future__ import annotations

import attrs
from llmpar.spec.validators import dtype, one_of

REFERENCES = ("auto", "copy", "base", "precomputed")
"""Where the reference comes from, as Hugging Face TRL's `DPOTrainer` decides it
(trl/trainer/dpo_trainer.py, `__init__`, "Reference model", TRL 1.10.0.dev0)."""


@attrs.frozen(kw_only=True)
class DpoConfig:
    """`[workload.dpo]`. Present with no keys: the reference TRL's `DPOTrainer` builds
    for the spec: the base with adapters disabled under an adapter method of
    `[finetune]`, else a frozen copy of the policy.

    `[training] micro_batch_size` and `global_batch_size` count sequences, as everywhere
    in llmpar: a pair is two (its chosen and its rejected response), so the global batch
    must be even and a step of B pairs is 2B sequences of the policy's forward and
    backward. TRL concatenates a pair into one forward pass (its batch is `[chosen,
    rejected]`): its `per_device_train_batch_size` of p pairs is `micro_batch_size = 2p`
    (an odd micro-batch is a stack that runs the two responses in separate passes, as
    TRL's first DPOTrainer did)."""

    reference: str = attrs.field(default="auto", validator=one_of(*REFERENCES))
    """"copy": a second model, a frozen copy of the policy (TRL with no `ref_model`, no
    PEFT model and `precompute_ref_log_probs = False`: `create_model_from_path`), held in
    `reference_format` and split as the policy's weights are (TRL's `prepare_deepspeed`
    shards it under ZeRO-3 and keeps it whole under the other stages, as the policy's
    weights are); "base": the policy's own base weights with its adapters disabled (TRL
    with a PEFT model: `ref_model = None`, the reference forward under `use_adapter(model,
    None)`), nothing more in memory, needs an adapter method in `[finetune]`;
    "precomputed": `precompute_ref_log_probs = True`: a pass over the data set before
    training stores the reference log-probabilities, so no reference is in memory and no
    reference forward runs in a step; "auto": "base" under an adapter method, else "copy"."""
    reference_format: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(dtype))
    """The reference copy's number format ("copy" only); None: `[precision] weights` (TRL
    loads the reference with the policy's `model_init_kwargs`, its dtype included)."""
