"""Framework profiles (`[training] framework`): loading, errors, the default that keeps
llmpar's numbers, the defaults a profile sets, and its host overheads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import parallel_training_specs

import llmpar
from llmpar.errors import SpecError
from llmpar.footprint.activations import ACTIVATION_MODELS
from llmpar.loading.converter import make_converter, structure
from llmpar.loading.presets import builtin_specs_dir
from llmpar.spec.framework import (
    ATTENTION_KERNELS,
    DEFAULT_FRAMEWORK,
    KERNEL_ACTIVATION_MODELS,
    Framework,
)

EXAMPLES = builtin_specs_dir() / "examples"
SHIPPED = ("megatron-core", "nemo", "torchtitan", "pytorch-fsdp2", "deepspeed", "hf-trainer")
TRAINING_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.toml")
                           if "inference" not in tomllib.loads(p.read_text()))
UNNAMED_EXAMPLES = [name for name in TRAINING_EXAMPLES if "framework" not in tomllib.loads(
    (EXAMPLES / name).read_text()).get("training", {})]
"""The training examples that leave the framework to the default."""
DESCRIPTIVE = ("source", "version", "overhead_source", "host_source")
"""Fields that describe a profile and change no number."""


def _plan_dict(spec: llmpar.Spec) -> dict:
    return llmpar.evaluate(spec).to_dict()


def test_every_shipped_profile_loads_and_states_its_source(session):
    assert set(SHIPPED) <= set(session.presets.names("frameworks"))
    for name in session.presets.names("frameworks"):
        table = session.presets.read("frameworks", name)
        profile, problems = structure(session.converter, table, Framework, "$")
        assert problems == [], name
        assert profile.source and profile.version and profile.overhead_source, name
        assert profile.default_activation_model in ACTIVATION_MODELS, name


def test_default_profile_is_the_megatron_core_file():
    """No preset is read when a spec names none: DEFAULT_FRAMEWORK stands for the file,
    and must state what it states."""
    path = builtin_specs_dir() / "frameworks" / "megatron-core.toml"
    import tomllib

    table = tomllib.loads(path.read_text())
    profile, problems = structure(make_converter(), {**table, "name": "megatron-core"},
                                  Framework, "$")
    assert problems == []
    blank = {field: "" for field in DESCRIPTIVE}
    assert attrs.evolve(profile, **blank) == attrs.evolve(DEFAULT_FRAMEWORK, **blank)


@pytest.mark.parametrize("example", UNNAMED_EXAMPLES)
def test_megatron_core_reproduces_the_plan_without_a_framework(example):
    """Naming megatron-core (or nemo, its stack's other front end) changes no number:
    the plan is the one a spec without a framework gets."""
    path = EXAMPLES / example
    without = _plan_dict(llmpar.load_spec(path))
    assert without["training"]["framework"] == "megatron-core"
    named = llmpar.load_spec(path, overrides={"training.framework": "megatron-core"})
    assert _plan_dict(named) == without
    nemo = _plan_dict(llmpar.load_spec(path, overrides={"training.framework": "nemo"}))
    nemo["training"]["framework"] = "megatron-core"
    for derivation in nemo["derivations"]:
        if derivation["inputs"].get("framework_profile") == "nemo":
            derivation["inputs"]["framework_profile"] = "megatron-core"
    assert nemo == without


def test_inline_and_file_profiles_load_like_other_presets(tmp_path: Path):
    spec_path = tmp_path / "run.toml"
    (tmp_path / "stack.toml").write_text('name = "our-stack"\nsource = "our fork"\n'
                                         'attention_kernel = "flash-attention-3"\n')
    spec_path.write_text((EXAMPLES / "llama-3-8b-fsdp-8-h100.toml").read_text())
    from_file = llmpar.load_spec(spec_path, overrides={
        "training.framework": {"file": "stack.toml", "step_overhead_seconds": "2 ms"}})
    profile = from_file.training.framework
    assert profile is not None and profile.name == "our-stack"
    assert profile.attention_kernel == "flash-attention-3"
    assert profile.step_overhead_seconds == pytest.approx(2e-3)
    inline = llmpar.load_spec(spec_path, overrides={
        "training.framework": {"preset": "torchtitan", "kernel_overhead_seconds": "3 us"}})
    assert inline.training.framework is not None
    assert inline.training.framework.name == "torchtitan"
    assert inline.training.framework.kernel_overhead_seconds == pytest.approx(3e-6)
    assert inline.training.framework.tensor_overlap_backward is False


def _problems(overrides: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml", overrides=overrides)
    return [str(p) for p in caught.value.problems]


def test_an_unknown_profile_suggests_the_nearest():
    (problem,) = _problems({"training.framework": "torchtitn"})
    assert problem.startswith("$.training.framework: no framework preset named 'torchtitn'")
    assert "did you mean 'torchtitan'" in problem


def test_a_bad_profile_names_each_key_path():
    problems = _problems({"training.framework": {
        "preset": "torchtitan", "attention_kernel": "flash", "activation_model": "fusd",
        "kernel_overhead_seconds": -1, "prefetch": 2}})
    joined = "\n".join(problems)
    assert "$.training.framework.attention_kernel: must be one of" in joined
    assert "did you mean 'flash-attention-2'" in joined
    assert "$.training.framework.activation_model: must be one of" in joined
    assert "did you mean 'fused'" in joined
    assert "$.training.framework.kernel_overhead_seconds: must be a finite number >= 0" in joined
    assert "$.training.framework.prefetch: unknown key" in joined


def test_a_profile_is_named_not_a_path():
    (problem,) = _problems({"training.framework": "../x.toml"})
    assert problem.startswith("$.training.framework: a framework preset is named by a file stem")


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_the_attention_kernel_sets_the_default_activation_model(kernel):
    spec = llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml", overrides={
        "training.framework": {"attention_kernel": kernel}})
    assert spec.training.activation_model == KERNEL_ACTIVATION_MODELS[kernel]


def test_a_stated_activation_model_wins_over_the_profile():
    spec = llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml", overrides={
        "training.framework": "torchtitan", "training.activation_model": "korthikanti"})
    assert spec.training.activation_model == "korthikanti"
    default = llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml", overrides={
        "training.framework": "torchtitan"})
    assert default.training.activation_model == "fused"
    hf = llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml", overrides={
        "training.framework": "hf-trainer"})
    assert hf.training.activation_model == "hf-sdpa"  # the profile's own, over its kernel's


def test_the_profile_sets_the_strategies_defaults_the_spec_leaves_out():
    path = EXAMPLES / "llama-3-8b-tp8-sp-a100.toml"
    assert llmpar.load_spec(path).parallel["tensor"].overlap_backward is True
    titan = llmpar.load_spec(path, overrides={"training.framework": "torchtitan"})
    assert titan.parallel["tensor"].overlap_backward is False
    stated = llmpar.load_spec(path, overrides={"training.framework": "torchtitan",
                                               "parallel.tensor.overlap_backward": True})
    assert stated.parallel["tensor"].overlap_backward is True
    # reshard_after_forward only where ZeRO-3 / FSDP runs
    fsdp = EXAMPLES / "llama-3-8b-fsdp-8-h100.toml"
    kept = llmpar.load_spec(fsdp, overrides={"training.framework": {
        "preset": "pytorch-fsdp2", "reshard_after_forward": False}})
    assert kept.parallel["data"].reshard_after_forward is False
    replicated = llmpar.load_spec(path, overrides={"training.framework": {
        "reshard_after_forward": False}})
    assert replicated.parallel["data"].reshard_after_forward is True


def _step(example: str, **profile: object) -> llmpar.Plan:
    return llmpar.evaluate(llmpar.load_spec(EXAMPLES / example, overrides={
        "training.framework": {"preset": "megatron-core", **profile}}))


@pytest.mark.parametrize("field", ["kernel_overhead_seconds", "micro_batch_overhead_seconds",
                                   "step_overhead_seconds"])
def test_host_overhead_raises_step_time_monotonically(field):
    steps = [_step("llama-3-8b-pp8-a100.toml", **{field: value}).step_seconds
             for value in (0.0, 1e-5, 1e-4, 1e-3)]
    assert all(a < b for a, b in zip(steps, steps[1:]))


def test_per_step_and_micro_batch_overheads_add_as_stated():
    base = _step("llama-3-8b-pp8-a100.toml")
    plan = _step("llama-3-8b-pp8-a100.toml", micro_batch_overhead_seconds=1e-3,
                 step_overhead_seconds=0.05)
    m = plan.micro_batches_per_step
    expected = m * 1e-3 + 0.05
    assert plan.training is not None and plan.training.host_overhead_seconds == pytest.approx(
        expected)
    assert plan.step_seconds == pytest.approx(base.step_seconds + expected)
    assert plan.compute_seconds == pytest.approx(base.compute_seconds)
    assert "host_overhead_seconds" in plan.explain()


def test_kernel_overhead_is_paid_per_launch_like_the_gpus_fixed_time():
    """A profile's per-launch time adds to the GPU's matmul_fixed_seconds: the same plan
    comes from moving the time between the two."""
    path = EXAMPLES / "llama-3-8b-pp8-a100.toml"
    moved = llmpar.evaluate(llmpar.load_spec(path, overrides={
        "hardware.gpu.matmul_fixed_seconds": "2 us",
        "training.framework": {"preset": "megatron-core", "kernel_overhead_seconds": "4 us"}}))
    base = llmpar.evaluate(llmpar.load_spec(path))  # the A100's 6 us, no profile overhead
    assert moved.step_seconds == pytest.approx(base.step_seconds, rel=1e-12)


def test_the_report_and_explain_name_the_profile():
    from llmpar.report.text import text_report as render

    plan = llmpar.evaluate(llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml",
                                            overrides={"training.framework": "torchtitan"}))
    assert "framework profile: torchtitan" in render(plan)
    assert "framework_profile = torchtitan" in plan.explain("step_seconds")
    assert plan.to_dict()["training"]["framework"] == "torchtitan"


def test_a_spec_round_trips_with_its_profile():
    from llmpar.loading.dump import dump_spec

    spec = llmpar.load_spec(EXAMPLES / "llama-3-8b-fsdp-8-h100.toml",
                            overrides={"training.framework": "deepspeed"})
    assert llmpar.load_spec(dump_spec(spec)) == spec


def test_concepts_quotes_the_step_times_of_three_profiles():
    """docs/concepts.md's "Software stack" quotes these three step times."""
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "concepts.md")
                    .read_text().split())
    path = EXAMPLES / "llama-3-8b-fsdp-8-h100.toml"
    megatron = llmpar.evaluate(path).step_seconds
    titan = llmpar.evaluate(path, {"training.framework": "torchtitan"}).step_seconds
    legacy = llmpar.evaluate(path, {"training.framework": "megatron-core-legacy"}).step_seconds
    assert f"takes {megatron:.1f} s a step under `megatron-core`" in text
    assert f"{titan:.1f} s under `torchtitan`" in text
    assert f"{legacy:.1f} s under `megatron-core-legacy`" in text


def test_a_search_gives_layouts_the_profiles_defaults():
    """A layout the search makes with tensor parallelism, on a spec with no [parallel.tensor]
    table, runs it as the profile does; its plan is the one the layout's spec evaluates to
    alone (the fast path agrees)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from search_specs import small_spec

    table = small_spec(training={"sequence_length": 512, "global_batch_size": 24,
                                 "framework": "torchtitan"},
                       search={"micro_batch_sizes": [1], "recompute": ["none"],
                               "values": {"tensor.degree": [1, 2], "pipeline.degree": [1]}})
    result = llmpar.search(table, top=100)
    tensor = [r for r in result.results if r.layout.get("tensor", 1) > 1]
    assert tensor, "the search space has tensor-parallel layouts"
    for ranked in tensor:
        assert ranked.spec.parallel["tensor"].overlap_backward is False
        alone = llmpar.evaluate(ranked.spec)
        assert alone.step_seconds == pytest.approx(ranked.plan.step_seconds, rel=1e-9)
    plain = [r for r in result.results if r.layout.get("tensor", 1) == 1]
    assert all("tensor" not in r.spec.parallel for r in plain)


def _modelled(spec: dict) -> dict:
    """The drawn spec with its step time modelled (no assumed mfu)."""
    training = {k: v for k, v in spec["training"].items() if k != "mfu"}
    return {**spec, "training": training}


OVERHEADS = st.sampled_from([0.0, 1e-6, 2e-5, 3e-4, 1e-3])


@given(parallel_training_specs(), st.sampled_from(SHIPPED), OVERHEADS, OVERHEADS)
def test_profiles_hold_for_every_layout(spec, profile, per_launch, per_micro_batch):
    """Under any layout: megatron-core named is the plan of no profile named; every
    shipped profile evaluates; a host overhead never shortens the step."""
    spec = _modelled(spec)
    plain = llmpar.evaluate(spec)
    named = llmpar.evaluate(spec, {"training.framework": "megatron-core"})
    assert named.to_dict() == plain.to_dict()
    llmpar.evaluate(spec, {"training.framework": profile})
    slower = llmpar.evaluate(spec, {"training.framework": {
        "preset": "megatron-core", "kernel_overhead_seconds": per_launch,
        "micro_batch_overhead_seconds": per_micro_batch}})
    assert plain.step_seconds is not None and slower.step_seconds is not None
    assert slower.step_seconds >= plain.step_seconds * (1 - 1e-12)
