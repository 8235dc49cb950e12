"""`[finetune]`: which parameters a training run updates, and how the frozen ones are kept.

Full training (the default, and `method = "full"`) updates every parameter. The other
methods keep the base model fixed and train only a part of it or a small adapter beside
it; the memory, FLOPs and communication follow from what is trainable
(`llmpar.finetune`).
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

import attrs

from llmpar.errors import did_you_mean
from llmpar.spec import validators as v

Method = Literal["full", "frozen", "lora", "qlora", "dora"]
METHODS: tuple[Method, ...] = typing.get_args(Method)
ADAPTER_METHODS = ("lora", "qlora", "dora")
"""Methods that train low-rank adapters beside a frozen base (Hu et al. 2021, LoRA,
arXiv:2106.09685; Dettmers et al. 2023, QLoRA, arXiv:2305.14314; Liu et al. 2024, DoRA,
arXiv:2402.09353)."""
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Hugging Face PEFT's names of the linear layers of a decoder block (transformers' Llama
naming); "all-linear" targets all of them (PEFT's `target_modules="all-linear"`, which
leaves out the output layer)."""
ALL_LINEAR = "all-linear"
BASE_FORMATS = ("nf4", "bnb-fp4", "int8", "bf16")
"""How QLoRA stores the frozen base linear layers (bitsandbytes' `Linear4bit` with
`bnb_4bit_quant_type` "nf4" or "fp4", `Linear8bitLt`, or unquantized)."""
LAYER_RANGE = re.compile(r"^layers\[(\d*):(\d*)\]$")
"""`layers[a:b]`: the blocks a to b - 1 (Python slice, either end may be left out)."""
FROZEN_GROUPS = ("embedding", "attention", "mlp", "experts", "shared_experts", "router",
                 "norms", "head", "pooler")
"""The parameter groups `frozen` and `modules_to_save` name (llmpar.footprint.parameters)."""
MODULE_ALIASES = {"embed_tokens": "embedding", "lm_head": "head"}
"""PEFT's `modules_to_save` names of the embedding and the output layer."""


def _frozen_entries(_instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    for entry in value:
        if entry in FROZEN_GROUPS or LAYER_RANGE.match(entry):
            continue
        known = ", ".join(repr(g) for g in FROZEN_GROUPS)
        raise v.FieldError(attribute.name, f"{entry!r} is neither a parameter group ({known}) "
                           "nor a layer range 'layers[a:b]'"
                           f"{did_you_mean(entry, FROZEN_GROUPS)}")


def _targets(_instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    if not value:
        raise v.FieldError(attribute.name, "must name at least one module")
    for entry in value:
        if entry not in TARGET_MODULES and entry != ALL_LINEAR:
            known = ", ".join(repr(t) for t in (*TARGET_MODULES, ALL_LINEAR))
            raise v.FieldError(attribute.name, f"{entry!r} is not one of {known}"
                               f"{did_you_mean(entry, (*TARGET_MODULES, ALL_LINEAR))}")


def _saved_modules(_instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    names = (*FROZEN_GROUPS, *MODULE_ALIASES)
    for entry in value:
        if entry not in names:
            raise v.FieldError(attribute.name, f"{entry!r} is not a parameter group or one of "
                               f"'embed_tokens', 'lm_head'{did_you_mean(entry, names)}")


def _dropout(_instance: Any, attribute: Any, value: bool | float) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise v.FieldError(attribute.name, f"must be true, false or a probability in [0, 1), "
                           f"got {value!r}")


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen(kw_only=True, cache_hash=True)
class Finetune:
    """`[finetune]`: what a training run updates. Absent (or `method = "full"`): every
    parameter, as in pre-training."""

    method: Method = attrs.field(default="full", validator=v.one_of(*METHODS))
    """"full" (every parameter), "frozen" (every parameter but the `frozen` ones), "lora"
    (low-rank adapters on `target_modules`, the base frozen: Hu et al. 2021,
    arXiv:2106.09685), "qlora" (LoRA over a base stored in `base_format`: Dettmers et al.
    2023, arXiv:2305.14314) or "dora" (LoRA plus a trained magnitude per output feature:
    Liu et al. 2024, arXiv:2402.09353)."""
    frozen: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple,
                                          validator=_frozen_entries)
    """With method = "frozen": parameter groups ("embedding", "attention", "mlp",
    "experts", "shared_experts", "router", "norms", "head", "pooler") and layer ranges
    ("layers[0:8]": every group of blocks 0 to 7) kept fixed."""
    rank: int = attrs.field(default=16, validator=v.positive)
    """LoRA rank r: each target linear of in x out features gains r x (in + out)
    parameters (PEFT's `r`)."""
    alpha: float = attrs.field(default=32.0, validator=v.positive)
    """LoRA scaling alpha / r (PEFT's `lora_alpha`): changes the update, not the memory
    or the FLOPs; accepted for completeness."""
    target_modules: tuple[str, ...] = attrs.field(default=("q_proj", "v_proj"),
                                                  converter=_as_tuple, validator=_targets)
    """Linear layers that get adapters, in PEFT's names: q_proj, k_proj, v_proj, o_proj,
    gate_proj, up_proj, down_proj, or "all-linear" (all of them). Default: PEFT's for
    Llama-style models, q_proj and v_proj. In MoE layers gate_proj / up_proj / down_proj
    are every routed and shared expert's."""
    modules_to_save: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple,
                                                   validator=_saved_modules)
    """Groups trained in full beside the adapters (PEFT's `modules_to_save`; "embed_tokens"
    and "lm_head" name the embedding and the output layer). PEFT trains a copy and keeps
    the original frozen, so their weights are held twice."""
    dropout: bool | float = attrs.field(default=False, validator=_dropout)
    """LoRA dropout on the adapters' input (PEFT's `lora_dropout`; true or a probability
    above 0 turns it on): it keeps the dropped-out input and its mask for backward."""
    base_format: str = attrs.field(default="nf4", validator=v.one_of(*BASE_FORMATS))
    """QLoRA: the frozen base linear layers' format, "nf4" (4-bit NormalFloat), "bnb-fp4",
    "int8" (bitsandbytes LLM.int8) or "bf16" (unquantized). Only with method = "qlora"."""
    block_size: int = attrs.field(default=64, validator=v.positive)
    """QLoRA: weights per block sharing one absmax scale (bitsandbytes' blocksize, 64)."""
    double_quantization: bool = True
    """QLoRA: store the block scales in 8 bits with one fp32 constant per 256 of them
    (QLoRA, Sec. 3: 0.127 instead of 0.5 bits per parameter)."""

    @property
    def adapters(self) -> bool:
        """Whether the method trains low-rank adapters."""
        return self.method in ADAPTER_METHODS

    @property
    def dropout_on(self) -> bool:
        return bool(self.dropout) if isinstance(self.dropout, bool) else self.dropout > 0

    @property
    def all_linear(self) -> bool:
        """`target_modules` includes "all-linear"."""
        return ALL_LINEAR in self.target_modules

    @property
    def targets(self) -> tuple[str, ...]:
        """The target modules, "all-linear" spelled out."""
        if ALL_LINEAR in self.target_modules:
            return TARGET_MODULES
        return tuple(t for t in TARGET_MODULES if t in self.target_modules)

    @property
    def saved_groups(self) -> tuple[str, ...]:
        """`modules_to_save` as parameter groups."""
        return tuple(dict.fromkeys(MODULE_ALIASES.get(m, m) for m in self.modules_to_save))

    @property
    def changes_training(self) -> bool:
        """False for `method = "full"`: the plan is the one without `[finetune]`."""
        return self.method != "full"
