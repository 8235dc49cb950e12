"""`[precision] weight_gather`: the format the data strategy's weight all-gathers carry
and its gathered weights are held in (torchao's `enable_fsdp_float8_all_gather`,
Megatron-Core's `--fp8-param-gather`)."""

from __future__ import annotations

import attrs
import pytest

import llmpar
from llmpar.errors import SpecError

FSDP = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
GATHER = "data.dense-param-all-gather"


def _plan(**precision: str) -> llmpar.Plan:
    session = llmpar.Session(load_entry_points=False)
    overrides = {f"precision.{key}": value for key, value in precision.items()}
    return session.evaluate(session.load_spec(FSDP, overrides=overrides))


def _gather(plan: llmpar.Plan) -> int:
    return next(c.buffer_bytes for c in plan.training.collectives if c.name == GATHER)


def test_unset_is_the_weights_format():
    assert _plan().to_dict() == _plan(weight_gather="bf16").to_dict()


def test_fp8_gathers_carry_one_byte_per_parameter():
    """Llama-3-8B under ZeRO-3 on 8 GPUs: each layer's gather moves its bf16 weights, 2 B
    per parameter; cast to fp8 before the gather, 1 B (fp8-tensorwise keeps one scale
    per tensor, no bytes per element), so the buffer halves and so does the time the
    link takes beyond its latency. With fp8 linear layers the step is shorter: the
    shards' casts take the place of the products' weight casts."""
    bf16, fp8 = _plan(), _plan(weight_gather="fp8-tensorwise")
    assert _gather(fp8) * 2 == pytest.approx(_gather(bf16), abs=2)
    linear = _plan(linear="fp8-tensorwise")
    gathered = _plan(linear="fp8-tensorwise", weight_gather="fp8-tensorwise")
    assert gathered.training.step_seconds < linear.training.step_seconds
    assert fp8.gradients_bytes == bf16.gradients_bytes  # the reduce-scatter is not touched


def test_fp8_gathered_weights_take_half_the_buffer():
    """FSDP holds the running block's and the prefetched block's gathered weights (two
    blocks of (8,030,261,248 - 2 x 128,256 x 4,096) / 32 = 218,112,128 parameters: the
    embeddings and the output layer are units of their own): in fp8 each parameter takes
    1 B instead of bf16's 2, so the buffers and the peak fall by 2 x 218,112,128 B."""
    from llmpar.strategies.data import FSDP_PREFETCH_LAYERS

    bf16, fp8 = _plan(), _plan(weight_gather="fp8-tensorwise")
    saved = FSDP_PREFETCH_LAYERS * (bf16.parameters - 2 * 128_256 * 4_096) / 32 * (2 - 1)
    assert saved == 2 * 218_112_128
    assert bf16.buffers_bytes - fp8.buffers_bytes == pytest.approx(saved, abs=2)
    peak_bf16, peak_fp8 = bf16.training.memory_peak, fp8.training.memory_peak
    assert peak_bf16 is not None and peak_fp8 is not None
    assert peak_bf16.allocated_bytes - peak_fp8.allocated_bytes == pytest.approx(saved, abs=2)
    assert fp8.weights_bytes == bf16.weights_bytes  # the shards stay in bf16


def _under(framework: str, **precision: str) -> llmpar.Plan:
    session = llmpar.Session(load_entry_points=False)
    overrides = {"training.framework": framework,
                 **{f"precision.{key}": value for key, value in precision.items()}}
    return session.evaluate(session.load_spec(FSDP, overrides=overrides))


LLAMA_3_8B_PARAMETERS = 8_030_261_248  # meta-llama/Meta-Llama-3-8B's config.json, counted


@pytest.mark.parametrize("framework", ["pytorch-fsdp2", "torchtitan"])
def test_fsdp2_gathers_fp32_weights_in_the_compute_format(framework: str):
    """fp32 sharded weights with bf16 compute under FSDP2: MixedPrecisionPolicy(param_dtype
    =bf16) casts each shard to bf16 before the all-gather (FSDPParam.all_gather_inputs),
    so the gather moves 2 B per parameter, not fp32's 4, and the two gathered layers
    FSDP holds are bf16 too; the fp32 shards themselves stay fp32."""
    plan = _under(framework, weights="fp32", compute="bf16")
    assert plan.parameters == LLAMA_3_8B_PARAMETERS
    assert _gather(plan) == 2 * LLAMA_3_8B_PARAMETERS
    bf16 = _under(framework)
    assert plan.buffers_bytes == bf16.buffers_bytes  # the gathered layers, bf16 both
    assert plan.weights_bytes == 2 * bf16.weights_bytes  # the shards, fp32 against bf16
    # The stated key wins: gathering the fp32 shards as they are moves 4 B per parameter.
    assert _gather(_under(framework, weights="fp32", weight_gather="fp32")) == (
        4 * LLAMA_3_8B_PARAMETERS)
    # fp32 compute: param_dtype fp32, nothing to cast.
    assert _gather(_under(framework, weights="fp32", compute="fp32")) == (
        4 * LLAMA_3_8B_PARAMETERS)


@pytest.mark.parametrize("framework", ["megatron-core", "deepspeed"])
def test_stacks_that_gather_the_model_parameters_gather_the_weights_format(framework: str):
    """Megatron-Core's distributed optimizer and DeepSpeed ZeRO-3 gather the model
    parameters as they hold them (`[precision] weights`), 4 B per parameter in fp32."""
    plan = _under(framework, weights="fp32", compute="bf16")
    assert _gather(plan) == 4 * LLAMA_3_8B_PARAMETERS
    assert _gather(_under(framework)) == 2 * LLAMA_3_8B_PARAMETERS


def test_the_gather_format_follows_the_profile():
    from llmpar.spec.framework import DEFAULT_FRAMEWORK
    from llmpar.spec.workload import Precision

    casts = attrs.evolve(DEFAULT_FRAMEWORK, weight_gather_in_compute=True)
    fp32 = Precision(weights="fp32", compute="bf16")
    assert fp32.weight_gather_under(DEFAULT_FRAMEWORK) == "fp32"
    assert fp32.weight_gather_under(casts) == "bf16"
    assert attrs.evolve(fp32, weight_gather="fp8-tensorwise").weight_gather_under(
        casts) == "fp8-tensorwise"
    # A compute format FSDP2's param_dtype cannot be (fp8): the weights as stored.
    assert Precision(weights="bf16", compute="fp8").weight_gather_under(casts) == "bf16"


def test_an_unknown_format_names_its_key():
    with pytest.raises(SpecError) as error:
        _plan(weight_gather="fp9")
    assert "$.precision.weight_gather" in str(error.value)
