"""FSDP settings under ZeRO-3 (`[parallel.data] reshard_after_forward`, `gradient_sync`):
how many gathers and reduce-scatters a step runs, and what the GPUs hold for them."""

from __future__ import annotations

from typing import Any

import pytest
from search_specs import MOE_MODEL, agreeing_pairs, small_spec

import llmpar
from llmpar.testing.fast_form import disagreements

SESSION = llmpar.Session(load_entry_points=False)
LAST = "last-micro-batch"


def spec_8b(**data: Any) -> dict[str, Any]:
    """Llama-3-8B on 8 H100s, FSDP, 32 sequences per step: 4 micro-batches of 1 per GPU."""
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": {"sequence_length": 4096, "micro_batch_size": 1,
                         "global_batch_size": 32, "recompute": "full", "tokens": 1e12},
            "parallel": {"data": {"fsdp": True, **data}}}


def _data_calls(plan: llmpar.Plan) -> dict[tuple[str, str | None], float]:
    return {(c.name, c.hides_behind): c.calls_per_step for c in plan.collectives
            if c.strategy == "data"}


def _collectives(plan: llmpar.Plan) -> list[tuple[Any, ...]]:
    return [(c.name, c.operation, c.buffer_bytes, c.group_size, c.calls_per_step, c.seconds,
             c.exposed_seconds, c.hides_behind, c.pieces) for c in plan.collectives]


def test_the_defaults_are_the_plan_without_the_settings():
    plain = llmpar.evaluate(spec_8b())
    stated = llmpar.evaluate(spec_8b(reshard_after_forward=True,
                                     gradient_sync="every-micro-batch"))
    assert _collectives(stated) == _collectives(plain)
    for field in ("weights_bytes", "gradients_bytes", "buffers_bytes", "total_bytes",
                  "step_seconds"):
        assert getattr(stated, field) == getattr(plain, field), field


def test_llama_3_8b_on_8_h100s_hand_check():
    # 4 micro-batches per step: the default gathers each layer's weights twice per
    # micro-batch (2 x 4 = 8) and reduce-scatters its gradients once per micro-batch (4).
    plain = llmpar.evaluate(spec_8b())
    assert _data_calls(plain) == {("data.dense-param-all-gather", "layers"): 8.0,
                                  ("data.dense-grad-reduce-scatter", "layers"): 4.0}
    # Kept gathered from forward to backward: one gather per micro-batch.
    kept = llmpar.evaluate(spec_8b(reshard_after_forward=False))
    assert _data_calls(kept) == {("data.dense-param-all-gather", "layers"): 4.0,
                                 ("data.dense-grad-reduce-scatter", "layers"): 4.0}
    # Gradients synchronised on the last micro-batch: one reduce-scatter per step.
    once = llmpar.evaluate(spec_8b(gradient_sync=LAST))
    assert _data_calls(once) == {("data.dense-param-all-gather", "layers"): 8.0,
                                 ("data.dense-grad-reduce-scatter", "last-backward"): 1.0}
    assert kept.step_seconds < plain.step_seconds
    assert once.step_seconds < plain.step_seconds
    # Memory. Weights kept gathered: all 8.03e9 parameters in bf16, in FSDP2's gather
    # buffers beside the shard each GPU keeps (FSDPParam.all_gather_outputs), which hold
    # the running and prefetched blocks too: 2 blocks of (8,030,261,248 - 2 x
    # 525,336,576) / 32 = 218,112,128 parameters are no longer buffers of their own.
    # Gradients accumulated unsharded: the bf16 gradients less the eighth each GPU keeps.
    shard_bytes = plain.weights_bytes  # the bf16 weight shard: N * 2 / 8
    unsharded_less_shard = 8 * shard_bytes - shard_bytes
    gathered = 8 * shard_bytes - 2 * 218_112_128 * 2
    for plan, added in ((kept, gathered), (once, unsharded_less_shard)):
        assert plan.buffers_bytes - plain.buffers_bytes == pytest.approx(added, abs=8)
        assert plan.total_bytes - plain.total_bytes == pytest.approx(added, abs=8)
        for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
            assert getattr(plan, field) == getattr(plain, field), field
    both = llmpar.evaluate(spec_8b(reshard_after_forward=False, gradient_sync=LAST))
    assert both.buffers_bytes - plain.buffers_bytes == pytest.approx(
        gathered + unsharded_less_shard, abs=8)


@pytest.mark.parametrize(("data", "path", "fragment"), [
    ({"zero": 2, "reshard_after_forward": False}, "$.parallel.data.reshard_after_forward",
     "reshard_after_forward = false needs parallel.data.zero = 3 or parallel.data.fsdp"),
    ({"zero": 1, "gradient_sync": LAST}, "$.parallel.data.gradient_sync",
     'gradient_sync = "last-micro-batch" needs parallel.data.zero = 3'),
    ({"fsdp": True, "gradient_sync": "never"}, "$.parallel.data.gradient_sync",
     "must be one of 'every-micro-batch', 'last-micro-batch'"),
])
def test_settings_outside_zero_3_name_the_key(data, path, fragment):
    spec = spec_8b()
    spec["parallel"] = {"data": data}
    with pytest.raises(llmpar.SpecError) as raised:
        llmpar.evaluate(spec)
    problems = raised.value.problems
    assert [p.path for p in problems] == [path]
    assert fragment in problems[0].message


SPACES = {
    "dense-kept": small_spec(parallel={"data": {"fsdp": True,
                                                "reshard_after_forward": False}}),
    "moe-once": small_spec(model=MOE_MODEL, parallel={"data": {"fsdp": True,
                                                               "gradient_sync": LAST}}),
    "dense-both-zero-searched": small_spec(parallel={"data": {
        "reshard_after_forward": False, "gradient_sync": LAST}}),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_fast_path_agrees_with_each_layout_alone(name):
    assert agreeing_pairs(SESSION, SPACES[name])


def test_fast_form_agrees_around_a_pipelined_expert_layout():
    spec = SESSION.load_spec({
        "model": "mixtral-8x7b",
        "hardware": {"cluster": "dgx-h100", "num_gpus": 32, "gpus_per_node": 8},
        "training": {"sequence_length": 4096, "global_batch_size": 64},
        "parallel": {"expert": {"degree": 4}, "pipeline": {"degree": 2},
                     "data": {"fsdp": True, "reshard_after_forward": False,
                              "gradient_sync": LAST}}})
    assert list(disagreements(SESSION, spec)) == []


def _gradient_bytes_per_step(plan: llmpar.Plan) -> float:
    return sum(c.buffer_bytes * c.calls_per_step for c in plan.collectives
               if c.strategy == "data" and "grad" in c.name)


def test_gradients_reduced_in_fp32_send_twice_the_bytes_of_bf16():
    # FSDP2's MixedPrecisionPolicy(reduce_dtype=torch.float32) over bf16 gradients.
    bf16 = llmpar.evaluate(spec_8b())
    fp32 = llmpar.evaluate(spec_8b(reduce_dtype="fp32"))
    assert _gradient_bytes_per_step(fp32) == pytest.approx(2 * _gradient_bytes_per_step(bf16),
                                                           rel=1e-6)
    assert fp32.gradients_bytes == bf16.gradients_bytes  # kept in bf16 all the same
    assert fp32.step_seconds >= bf16.step_seconds
    assert "gradients reduced in fp32 (kept in bf16)" in {n.text for n in fp32.training.notes}


def test_reducing_in_the_gradients_own_format_is_the_default():
    assert _collectives(llmpar.evaluate(spec_8b(reduce_dtype="bf16"))) == _collectives(
        llmpar.evaluate(spec_8b()))


def test_megatron_main_gradients_reduced_in_bf16_halve_the_bytes():
    # Megatron-LM's fp32 main gradients with --grad-reduce-in-bf16, ZeRO-1 (distributed optimizer).
    spec = spec_8b()
    spec["optimizer"] = "adam-fp32-grads"
    spec["parallel"] = {"data": {"zero": 1}}
    fp32 = llmpar.evaluate(spec)
    spec["parallel"]["data"]["reduce_dtype"] = "bf16"
    bf16 = llmpar.evaluate(spec)
    assert _gradient_bytes_per_step(bf16) == pytest.approx(_gradient_bytes_per_step(fp32) / 2,
                                                           rel=1e-6)
