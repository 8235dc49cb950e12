"""Physical rules of `[finetune]` that hold for every valid spec (Hypothesis)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from strategies import parallel_training_specs

import llmpar
from llmpar.footprint.parameters import parameter_groups

SESSION = llmpar.Session(load_entry_points=False)


def with_finetune(spec: dict, **finetune) -> dict:
    return {**spec, "finetune": finetune}


def small_rank(spec: dict) -> int:
    """A rank at most h / 16: each adapter at most 1/8 of its layer's weights."""
    return max(1, spec["model"]["hidden_size"] // 16)


@given(parallel_training_specs())
def test_method_full_is_the_plan_without_finetune(spec):
    plain = SESSION.evaluate(spec)
    full = SESSION.evaluate(with_finetune(spec, method="full"))
    assert full.to_dict() == plain.to_dict()


@given(parallel_training_specs(), st.sampled_from([["q_proj", "v_proj"], ["all-linear"]]),
       st.sampled_from(["lora", "qlora", "dora"]))
def test_lora_needs_less_memory_than_full_training(spec, targets, method):
    """Model states always shrink; the whole peak shrinks but for the adapters' own saved
    tensors (r-wide, per token), which outweigh the states a tiny model saves only at many
    tokens: with h >= 1024, an MLP at least 2h wide (so a layer holds at least ~6 h^2
    weights) and r <= h / 16 they are below 14 r bytes per token and layer against the
    14 bytes per weight saved, so the total shrinks too."""
    full = SESSION.evaluate(spec)
    tuned = SESSION.evaluate(with_finetune(spec, method=method, rank=small_rank(spec),
                                           target_modules=targets))
    assert tuned.gradients_bytes < full.gradients_bytes
    assert tuned.optimizer_bytes < full.optimizer_bytes
    own = (tuned.activations_bytes or 0) - (full.activations_bytes or 0)
    assert own >= 0
    if spec["parallel"].get("tensor", {}).get("degree", 1) > 1:
        # llmpar keeps the adapters whole on every tensor rank (docs/finetuning.md, "What is
        # approximated"): at a large rank over a split base they can outweigh what they save.
        return
    # DoRA's W + BA (and QLoRA's dequantized layer) is a buffer full training does not have.
    working = tuned.training.finetune.transient_bytes
    assert tuned.total_bytes - own - working < full.total_bytes
    model = spec["model"]
    if model["hidden_size"] >= 1024 and model["ffn_hidden_size"] >= 2 * model["hidden_size"]:
        assert tuned.total_bytes < full.total_bytes


@given(parallel_training_specs())
def test_everything_frozen_trains_nothing(spec):
    model = SESSION.load_spec(spec).model
    groups = [g for g, count in parameter_groups(model).items() if count]
    plan = SESSION.evaluate(with_finetune(spec, method="frozen", frozen=groups))
    assert plan.training.finetune.trainable_parameters == 0
    assert plan.gradients_bytes == plan.optimizer_bytes == 0
    assert all(c.buffer_bytes == 0 for c in plan.collectives if c.name.startswith("data.")
               and "grad" in c.name)


@given(parallel_training_specs(), st.integers(1, 64),
       st.sampled_from([["q_proj"], ["all-linear"], ["k_proj", "down_proj"]]))
def test_adapter_memory_grows_linearly_with_rank(spec, rank, targets):
    # A memory property: an assumed MFU is left out, since a large rank's adapter FLOPs
    # on a tiny model can make it imply an HFU above 1, which the loader refuses.
    spec = {**spec, "training": {k: v for k, v in spec["training"].items() if k != "mfu"}}
    plans = [SESSION.evaluate(with_finetune(spec, method="lora", rank=k * rank,
                                            target_modules=targets)) for k in (1, 2, 3)]
    counts = [p.training.finetune.adapter_parameters for p in plans]
    assert counts[2] - counts[1] == counts[1] - counts[0] == counts[0]
    # Stage by stage: the peak stage a plan reports may change with the rank.
    for field in ("gradients_bytes", "optimizer_bytes"):
        for index in range(len(plans[0].stages)):
            one, two, three = (getattr(p.stages[index], field) for p in plans)
            assert math.isclose(three - two, two - one, abs_tol=8), (field, index)
            assert math.isclose(two - one, one, abs_tol=8), (field, index)
