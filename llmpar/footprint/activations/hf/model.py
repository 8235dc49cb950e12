"""`hf-eager` and `hf-sdpa`: what a Hugging Face transformers model keeps for backward.

Every tensor autograd keeps in one training forward (model(input_ids, labels=ids),
model.train()), by storage: a tensor kept by several nodes, or a view kept whole, is
counted once. The mechanisms are those of transformers 5.24.0 on torch 2.13.0 (CPU);
validation/data holds the measurements they are checked against, and
docs/validation.md says how CUDA kernels would differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from llmpar.footprint.activations.common import (
    ARCHITECTURE,
    ActivationUnavailable,
    require,
    sizes_of,
)
from llmpar.footprint.activations.hf.attention import attention_tensors
from llmpar.footprint.activations.hf.context import MEASURED, Context
from llmpar.footprint.activations.hf.deltanet import gated_deltanet_tensors
from llmpar.footprint.activations.hf.family import CLASS_IN_SOURCE, FAMILIES, family_of
from llmpar.footprint.activations.hf.mamba import mamba_mixer_tensors
from llmpar.footprint.activations.hf.mla import mla_tensors
from llmpar.footprint.activations.hf.mlp import dense_mlp
from llmpar.footprint.activations.hf.moe import moe_tensors
from llmpar.footprint.activations.hf.norms import norm_tensors
from llmpar.footprint.activations.hf.outside import (
    embedding_tensors,
    head_tensors,
    shared_tensors,
)
from llmpar.footprint.activations.hf.run import HfRun
from llmpar.footprint.inventory import ActivationInventory, LayerGroup, SavedTensor

if TYPE_CHECKING:
    from llmpar.spec import Model, Spec


def _norm(ctx: Context, label: str) -> list[SavedTensor]:
    return norm_tensors(ctx, label, "h", ctx.sizes.h[1])


def layer_tensors(ctx: Context, moe: bool) -> list[SavedTensor]:
    """One block, its norms where the model puts them: before attention and MLP (pre),
    after each (post: BERT's LayerNorm of the residual sum, OLMo 2's norm of the branch
    output) or both (sandwich: Gemma)."""
    mlp = moe_tensors(ctx) if moe else dense_mlp(ctx)
    attention = mla_tensors(ctx) if ctx.model.mla is not None else attention_tensors(ctx, moe)
    placement = ctx.model.norm_placement
    if placement == "sandwich":
        return (_norm(ctx, "input norm") + attention + _norm(ctx, "post-attention norm")
                + _norm(ctx, "pre-MLP norm") + mlp + _norm(ctx, "post-MLP norm"))
    if placement == "post":
        return (attention + _norm(ctx, "post-attention norm") + mlp
                + _norm(ctx, "post-MLP norm"))
    return _norm(ctx, "input norm") + attention + _norm(ctx, "post-attention norm") + mlp


def unmeasured(model: Model, name: str) -> None:
    """Raise ActivationUnavailable for a model whose transformers code was not measured:
    a class its source names that FAMILIES lacks (OLMo 3), or attention sinks outside
    gpt-oss's family (whose eager softmax over one more column is measured)."""
    named = CLASS_IN_SOURCE.search(model.source or "")
    if named and named.group(1) not in FAMILIES:
        raise ActivationUnavailable(
            f"{name}: what transformers' {named.group(1)} keeps for backward is not "
            f"measured (validation/measure_hf.py); use 'fused' or 'korthikanti'")
    if model.attention_sinks and not family_of(model).attention_sinks:
        raise ActivationUnavailable(
            f"{name}: attention sinks' saved tensors are not measured; use 'fused' or "
            "'korthikanti'")


MAMBA2_TORCH_PATH = ("mamba2", "nemotron-h")
"""The families whose Mamba-2 mixer runs the torch path `mamba_mixer_tensors` lists
(Mamba2Mixer; NemotronHMamba2Mixer, the same code in transformers 5.24.0 but for its
config keys and dt's lower clamp at time_step_min, which keeps nothing more)."""


def mixers_alone(model: Model) -> bool:
    """Whether every layer is a Mamba-2 mixer alone (behind one norm) as Mamba2ForCausalLM
    or NemotronHForCausalLM builds it ("M" layers only): the recurrent layer kind whose
    torch path is measured (`mamba_mixer_tensors`)."""
    return (set(model.mixer_pattern or "") == {"m"}
            and family_of(model).name in MAMBA2_TORCH_PATH)


HYBRID_FAMILIES = ("nemotron-h", "granite-moe-hybrid", "falcon-h1", "qwen3-next", "qwen3.5",
                   "qwen3.5-moe")
"""The hybrids whose every layer kind is listed: Nemotron-H's single-module blocks
(NemotronHBlock: one norm, then a Mamba-2 mixer "M", an attention "*", an MLP "-" or the
experts "E"), Granite 4.0-H's two-module blocks (GraniteMoeHybridDecoderLayer: a Mamba-2
mixer or an attention, then the experts beside a shared MLP) and Falcon-H1's parallel
blocks (FalconH1DecoderLayer: the Mamba-2 mixer and the attention on the same normed
input, each on its own scaled copy, then the MLP) and Qwen3-Next's (Qwen3NextDecoderLayer:
a gated DeltaNet or a gated attention, then the experts beside a gated shared expert), as
Qwen3.5's are (Qwen3_5DecoderLayer and Qwen3_5MoeDecoderLayer, a dense MLP in the
former)."""


def listed_hybrid(model: Model) -> bool:
    """Whether the model is a hybrid of `HYBRID_FAMILIES` whose layers' mixers are all
    Mamba-2 mixers, gated DeltaNets and attentions (hybrid_kinds_in's names: "moe mamba",
    "none attention", "moe linear_attention")."""
    if family_of(model).name not in HYBRID_FAMILIES or not model.layer_kinds_vary:
        return False
    kinds = model.hybrid_kinds_in(0, len(model.mixer_pattern or ""))
    return {kind.split(" ", 1)[1] for kind in kinds} <= {"mamba", "attention", "none",
                                                          "attention+mamba",
                                                          "linear_attention"}


def _hybrid_layer(ctx: Context, run: HfRun, name: str, kind: str) -> list[SavedTensor]:
    """One layer of a listed hybrid, of `kind` ("moe mamba": its MLP, then its mixer): the
    input norm, the mixer, the post-mixer norm and the MLP, or a single module's norm and
    module (no residual cast in either)."""
    block, mixer = kind.split(" ", 1)
    if mixer == "none":
        return _norm(ctx, "input norm") + (moe_tensors(ctx) if block == "moe"
                                           else dense_mlp(ctx))
    if mixer == "attention+mamba":
        tensors = _mamba_layer(ctx, run, name) + attention_tensors(ctx)
    elif mixer == "mamba":
        tensors = _mamba_layer(ctx, run, name)
    elif mixer == "linear_attention":
        tensors = _norm(ctx, "input norm") + gated_deltanet_tensors(ctx)
    else:
        tensors = _norm(ctx, "input norm") + attention_tensors(ctx)
    if block == "none":
        return tensors
    return (tensors + _norm(ctx, "post-attention norm")
            + (moe_tensors(ctx) if block == "moe" else dense_mlp(ctx)))


def _mamba_layer(ctx: Context, run: HfRun, name: str) -> list[SavedTensor]:
    """Mamba2Block (NemotronHBlock of an "M" layer; GraniteMoeHybridDecoderLayer up to
    its mixer): the RMSNorm and the mixer, whose torch path runs the same for eager and
    SDPA attention; transformers refuses SDPA for Mamba2ForCausalLM, which never attends,
    and accepts it for the hybrids."""
    if run.attention != "eager" and ctx.family.name == "mamba2":
        raise ActivationUnavailable(
            f"{name}: transformers' Mamba2ForCausalLM has no SDPA path (its layers never "
            "attend); use 'hf-eager', which runs the same mixer")
    return _norm(ctx, "input norm") + mamba_mixer_tensors(ctx)


def hf_inventory(spec: Spec, run: HfRun, name: str = "hf") -> ActivationInventory:
    """The inventory of `spec`'s model run by transformers the way `run` says."""
    model = spec.model
    recurrent = mixers_alone(model)
    single = not recurrent and listed_hybrid(model)
    require(spec, ARCHITECTURE, name, recurrent_inventory=recurrent or single)
    unmeasured(model, name)
    ctx = Context(sizes=sizes_of(spec), model=model, run=run, family=family_of(model))
    groups = []
    if recurrent:
        groups.append(LayerGroup(kind="none mamba", count=model.num_layers or 0,
                                 tensors=tuple(_mamba_layer(ctx, run, name))))
    elif single:
        groups += [LayerGroup(kind=kind, count=count,
                              tensors=tuple(_hybrid_layer(ctx, run, name, kind)))
                   for kind, count in model.hybrid_kinds_in(0, model.num_layers or 0).items()]
    else:
        if model.num_dense_layers:
            groups.append(LayerGroup(kind="dense", count=model.num_dense_layers,
                                     tensors=tuple(layer_tensors(ctx, moe=False))))
        if model.num_moe_layers:
            groups.append(LayerGroup(kind="moe", count=model.num_moe_layers,
                                     tensors=tuple(layer_tensors(ctx, moe=True))))
    fixed = (tuple(attrs.evolve(t, placement="embedding") for t in embedding_tensors(ctx))
             + tuple(shared_tensors(ctx))
             + tuple(attrs.evolve(t, placement="head") for t in head_tensors(ctx)))
    source = (f"transformers {ctx.family.name} modeling code, {run.attention} attention"
              f"{', ' + run.experts + ' experts' if model.moe else ''}; {MEASURED}")
    return ActivationInventory(model=name, groups=tuple(groups), fixed=fixed, source=source)


def hf_eager(spec: Spec) -> ActivationInventory:
    """transformers with attn_implementation="eager", no dropout, grouped_mm experts."""
    return hf_inventory(spec, HfRun(attention="eager"), "hf-eager")


def hf_sdpa(spec: Spec) -> ActivationInventory:
    """transformers with attn_implementation="sdpa" (CPU: flash kernel), no dropout."""
    return hf_inventory(spec, HfRun(attention="sdpa"), "hf-sdpa")
