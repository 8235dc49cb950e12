"""Physical rules that hold for every valid spec (Hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import parallel_training_specs, training_specs

import llmpar
from llmpar import SpecError

MEMORY_FIELDS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                 "buffers_bytes", "total_bytes")


def with_training(spec: dict, **changes) -> dict:
    return {**spec, "training": {**spec["training"], **changes}}


def with_model(spec: dict, **changes) -> dict:
    return {**spec, "model": {**spec["model"], **changes}}


@given(st.integers(1, 10**13))
def test_mixed_precision_adam_is_exactly_16_bytes_per_parameter(parameters):
    plan = llmpar.evaluate({"model": {"parameters": parameters},
                            "hardware": {"gpu": "h100-sxm"}, "optimizer": "adam"})
    assert plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes == 16 * parameters


@given(training_specs())
def test_memory_numbers_are_finite_and_non_negative(spec):
    plan = llmpar.evaluate(spec)
    for name in MEMORY_FIELDS:
        value = getattr(plan, name)
        assert value is not None and math.isfinite(value) and value >= 0, name
    assert plan.total_bytes == sum(getattr(plan, n) for n in MEMORY_FIELDS[:-1])
    assert plan.steady_state_fits == (plan.total_bytes <= plan.capacity_bytes)
    device = plan.derivation("device_bytes").value  # the peak, as the device holds it
    assert plan.fits == (device <= plan.capacity_bytes)
    assert device >= plan.total_bytes


@given(training_specs())
def test_activations_are_linear_in_micro_batch(spec):
    batch = spec["training"]["micro_batch_size"]
    one = llmpar.evaluate(with_training(spec, micro_batch_size=batch,
                                        global_batch_size=None)).activations_bytes
    two = llmpar.evaluate(with_training(spec, micro_batch_size=2 * batch,
                                        global_batch_size=None)).activations_bytes
    assert math.isclose(two, 2 * one, rel_tol=1e-12, abs_tol=1)


@given(training_specs())
def test_activations_are_linear_in_layers(spec):
    layers = spec["model"]["num_layers"]
    m1, m2, m3 = (llmpar.evaluate(with_model(spec, num_layers=k * layers)).activations_bytes
                  for k in (1, 2, 3))
    assert math.isclose(m3 - m2, m2 - m1, rel_tol=1e-12, abs_tol=1)


@given(training_specs())
def test_activations_linear_in_sequence_unless_attention_scores_are_kept(spec):
    s = spec["training"]["sequence_length"]
    f1 = llmpar.evaluate(with_training(spec, sequence_length=s)).activations_bytes
    f2 = llmpar.evaluate(with_training(spec, sequence_length=2 * s)).activations_bytes
    training = spec["training"]
    quadratic = training["activation_model"] == "korthikanti" and training["recompute"] == "none"
    model = spec["model"]
    # Korthikanti et al. 2022: softmax output (2) + dropout mask (1) + dropout output (2)
    # bytes per score element, a * b * s^2 elements per layer.
    score = 5 * model["num_attention_heads"] * training["micro_batch_size"] * model["num_layers"]
    expected_excess = 2 * score * s * s if quadratic else 0
    assert math.isclose(f2 - 2 * f1, expected_excess, rel_tol=1e-9, abs_tol=2)


@given(training_specs())
def test_recomputation_never_adds_activation_memory(spec):
    none, selective, full = (
        llmpar.evaluate(with_training(spec, recompute=mode)).activations_bytes
        for mode in ("none", "selective", "full"))
    assert full <= selective <= none


@given(training_specs())
def test_spec_round_trips_through_toml(spec):
    loaded = llmpar.load_spec(spec)
    assert llmpar.load_spec(llmpar.dump_spec(loaded)) == loaded


@given(st.one_of(training_specs(), parallel_training_specs()),
       st.one_of(st.none(), st.floats(0.05, 1.0)), st.sampled_from(["full", "causal"]))
def test_hfu_never_exceeds_one(spec, mfu, attention_flops):
    """HFU counts the FLOPs the GPUs execute: a modelled step time cannot run them
    faster than peak, and an assumed mfu that would is an error naming the largest one
    possible (which then plans at HFU <= 1)."""
    training = {**spec["training"], "attention_flops": attention_flops, "mfu": mfu}
    if mfu is None:
        del training["mfu"]
    try:
        plan = llmpar.evaluate({**spec, "training": training})
    except SpecError as error:
        [problem] = error.problems
        assert problem.path == "$.training.mfu" and "HFU" in problem.message
        largest = float(problem.message.rsplit("<= ", 1)[1])
        assert largest < mfu
        plan = llmpar.evaluate({**spec, "training": {**training, "mfu": largest}})
    part = plan.training
    if part.hfu is None:
        assert part.step_seconds is None
        return
    assert part.hfu <= 1.0
    if attention_flops == "causal":
        # The causal count is the least any kernel executes (a fused one adds its
        # diagonal tiles); under "full" MFU counts the masked half a fused kernel skips.
        assert part.hardware_flops_per_step >= part.flops_per_step
        assert part.mfu <= part.hfu


TIME_FIELDS = ("step_seconds", "compute_seconds", "communication_seconds",
               "exposed_communication_seconds", "bubble_seconds", "optimizer_seconds",
               "offload_seconds", "exposed_offload_seconds", "train_seconds", "gpu_hours",
               "tokens_per_second", "hardware_flops_per_step", "hfu")


@given(st.one_of(training_specs(), parallel_training_specs()),
       st.sampled_from(["korthikanti", "fused", "coefficient"]))
def test_attention_flops_changes_mfu_never_time(spec, activation_model):
    """`attention_flops` is a counting convention: the kernel's executed FLOPs, and so
    every time and HFU, stay; MFU moves by the ratio of the model FLOPs."""
    training = {k: v for k, v in spec["training"].items() if k != "mfu"}
    training["activation_model"] = activation_model
    full, causal = (llmpar.evaluate({**spec, "training": {**training,
                                                            "attention_flops": convention}})
                    for convention in ("full", "causal"))
    assert causal.training.time_model == full.training.time_model
    for field in TIME_FIELDS:
        assert getattr(causal.training, field) == getattr(full.training, field), field
    if full.step_seconds is None:  # no peak in the compute format (V100 and bf16)
        return
    assert full.training.time_model == "modelled"
    assert causal.flops_per_step < full.flops_per_step
    assert causal.mfu == pytest.approx(full.mfu * causal.flops_per_step / full.flops_per_step,
                                       rel=1e-12)


def assert_plan_or_spec_error(document) -> None:
    """A document either plans or fails with located problems; nothing else escapes."""
    try:
        plan = llmpar.evaluate(document)
    except SpecError as error:
        assert error.problems
        assert all(problem.path.startswith("$") for problem in error.problems)
    else:
        assert math.isfinite(plan.total_bytes)


toml_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), st.booleans(),
    st.text(max_size=12),
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=10), children, max_size=4)),
    max_leaves=12,
)
section_names = st.sampled_from(["model", "hardware", "optimizer", "precision", "training",
                                 "parallel", "version", "gpu", "data"])


@given(st.dictionaries(st.one_of(section_names, st.text(max_size=8)), toml_values, max_size=6))
def test_malformed_tables_raise_only_spec_errors(document):
    assert_plan_or_spec_error(document)


@given(training_specs(), st.sampled_from(["model", "hardware", "training", "optimizer"]),
       st.text(max_size=10), toml_values)
def test_a_corrupted_valid_spec_raises_only_spec_errors(spec, section, key, value):
    table = spec[section] if isinstance(spec[section], dict) else {"preset": spec[section]}
    document = {**spec, section: {**table, key: value}}
    assert_plan_or_spec_error(document)


toml_like_text = st.text(alphabet='[]={}"\'.,-_# \nabcdelmoprstuy0123456789', max_size=200)


@given(st.one_of(st.text(max_size=200), toml_like_text))
def test_arbitrary_text_raises_only_spec_errors(text):
    assert_plan_or_spec_error("\n" + text)
