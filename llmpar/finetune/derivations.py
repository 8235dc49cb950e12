"""How a plan's fine-tuning numbers were produced (`llmpar explain`)."""

from __future__ import annotations

from llmpar.plan import Derivation, FinetunePart
from llmpar.spec import Spec

ADAPTER_SOURCE = ("LoRA (Hu et al. 2021, arXiv:2106.09685, Sec. 4.1) as Hugging Face PEFT "
                  "builds it (peft/tuners/lora/layer.py: A = Linear(in, r), B = Linear(r, out), "
                  "no bias; DoRA's lora_magnitude_vector of out); checked against PEFT's "
                  "counts in validation/data/peft_counts.json")
SKIP_SOURCE = ("a product's backward is an input-gradient and a weight-gradient product, each "
               "as large as the forward (Narayanan et al. 2021, arXiv:2104.04473, Sec. 5.1); "
               "a frozen weight needs no weight gradient")


def finetune_derivations(spec: Spec, part: FinetunePart | None) -> tuple[Derivation, ...]:
    """The derivations of the training part's `finetune`; none in full training."""
    finetune = spec.finetune
    if part is None or finetune is None:
        return ()
    targets = ", ".join(finetune.target_modules) if finetune.adapters else "-"
    return (
        Derivation(quantity="trainable_parameters", value=part.trainable_parameters,
                   unit="parameters",
                   rule=("sum over targeted linear layers (in x out) of r x (in + out) "
                         "(+ out for DoRA), + modules_to_save copies, + groups not frozen"),
                   source=ADAPTER_SOURCE,
                   inputs={"method": finetune.method, "r": finetune.rank,
                           "target_modules": targets,
                           "adapter_parameters": part.adapter_parameters,
                           "frozen_parameters": part.frozen_parameters}),
        Derivation(quantity="skipped_flops_per_step", value=part.skipped_flops_per_step,
                   unit="FLOP",
                   rule="2 * tokens_per_step * (active weights of the frozen products)",
                   source=SKIP_SOURCE, inputs={"method": finetune.method}),
        Derivation(quantity="adapter_flops_per_step", value=part.adapter_flops_per_step,
                   unit="FLOP",
                   rule="3 passes * 2 * tokens_per_step * r * (in + out), per targeted layer "
                        "a token passes through",
                   source=ADAPTER_SOURCE, inputs={"r": finetune.rank}),
    )
