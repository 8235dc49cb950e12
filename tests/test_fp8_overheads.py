"""What fp8 training costs beside its faster products: the weight copies Transformer Engine
keeps, current scaling's amax reads, and the casts around fp8 attention."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmpar
from llmpar.evaluation.casts import cast_bytes, fp8_scaling, weight_copy_bytes
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.matmuls import RankShape

SESSION = llmpar.Session(load_entry_points=False)
FP8_RECIPES = ("fp8-tensorwise", "fp8-rowwise", "fp8-blockwise", "mxfp8")
# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json): h 4096, FFN 14336, 32 query heads
# and 8 KV heads of 128, 32 layers, vocabulary 128256.
H, F, Q, KV, LAYERS, VOCAB = 4096, 14336, 4096, 1024, 32, 128256
LAYER_LINEAR = H * (Q + 2 * KV) + Q * H + H * 2 * F + F * H
"""One layer's linear weights: Q/K/V, output, gate/up, down."""


def one_gpu(recompute: str = "none", framework: str | None = None,
            **precision: Any) -> dict[str, Any]:
    """Llama-3-8B on one H100, micro-batch 2 of 4096 tokens, 4 micro-batches."""
    training: dict[str, Any] = {"sequence_length": 4096, "micro_batch_size": 2,
                                "global_batch_size": 8, "activation_model": "fused",
                                "recompute": recompute}
    if framework is not None:
        training["framework"] = framework
    return {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "precision": precision,
            "training": training}


def _elementwise_bytes(plan: llmpar.Plan) -> float:
    return float(plan.derivation("step_seconds").inputs["elementwise_bytes"])


def _added(spec: dict[str, Any], base: dict[str, Any]) -> float:
    return _elementwise_bytes(SESSION.evaluate(spec)) - _elementwise_bytes(SESSION.evaluate(base))


def _copies(plan: llmpar.Plan) -> int:
    assert plan.training is not None and plan.training.memory_peak is not None
    return plan.training.memory_peak.fp8_weight_copies_bytes


# -- fp8 weight copies ----------------------------------------------------------------

def test_transformer_engine_keeps_two_fp8_copies_of_each_layer_weight_by_hand():
    # Megatron-Core passes is_first_microbatch, so each TE linear keeps its fp8 weight
    # row-wise and column-wise (transformer_engine/pytorch/module/linear.py): 1 byte each,
    # for every layer's linear weights; the output layer is no TE module.
    bf16 = SESSION.evaluate(one_gpu())
    fp8 = SESSION.evaluate(one_gpu(linear="fp8-tensorwise"))
    expected = LAYERS * LAYER_LINEAR * 2 * 1
    assert expected == 13_958_643_712
    assert _copies(fp8) == expected and _copies(bf16) == 0
    assert fp8.training is not None and bf16.training is not None
    peak, base = fp8.training.memory_peak, bf16.training.memory_peak
    assert peak is not None and base is not None
    # alive at every moment: the peak rises by exactly the copies, the steady state not
    assert peak.allocated_bytes - base.allocated_bytes == expected
    assert fp8.total_bytes == bf16.total_bytes
    assert any(b.name == "fp8 weight copies" and b.bytes == expected for b in peak.alive)
    recorded = fp8.derivation("memory_peak.fp8_weight_copies_bytes")
    assert recorded.value == expected and "workspace" in recorded.source
    assert "_fp8_workspaces" in fp8.explain("training.memory_peak.fp8_weight_copies_bytes")


def test_copies_follow_tensor_parallelism_but_not_the_fsdp_shard():
    def plan(zero: int) -> llmpar.Plan:
        spec = one_gpu(linear="mxfp8")
        spec["hardware"] = {"cluster": "dgx-h100", "num_gpus": 4}
        spec["parallel"] = {"tensor": {"degree": 2}, "sequence": {}, "data": {"zero": zero}}
        return SESSION.evaluate(spec)

    # mxfp8: 1 + 1/32 bytes per element with its E8M0 scales (OCP MX v1.0)
    expected = LAYERS * LAYER_LINEAR / 2 * 2 * (1 + 1 / 32)
    for zero in (1, 3):
        assert _copies(plan(zero)) == pytest.approx(expected, abs=1)
    assert plan(3).weights_bytes < plan(1).weights_bytes


def test_no_copies_without_a_weight_cache_or_with_fp8_primary_weights():
    # torchao.float8 casts each weight per use; fp8 primary weights are cast in place.
    assert _copies(SESSION.evaluate(one_gpu(framework="torchtitan",
                                            linear="fp8-tensorwise"))) == 0
    assert _copies(SESSION.evaluate(one_gpu(linear="fp8-tensorwise",
                                            weights="fp8-tensorwise"))) == 0
    # fp8 attention alone keeps no weight copies
    assert _copies(SESSION.evaluate(one_gpu(attention="fp8-tensorwise"))) == 0


# -- current scaling's amax pass ------------------------------------------------------

TOKENS, MICRO_BATCHES = 2 * 4096, 4
INPUTS = LAYERS * (H + H + H + F)
"""Input widths of the layers' linear products: Q/K/V, output, gate/up, down (the default
profile, Megatron-Core, keeps its output layer in bf16: no cast there)."""
GRADIENTS = LAYERS * ((Q + 2 * KV) + H + 2 * F + H)
"""Output widths of the layers' linear products, whose gradients are cast in the backward."""
WEIGHTS = LAYERS * LAYER_LINEAR
OUTPUT_INPUTS, OUTPUT_GRADIENTS, OUTPUT_WEIGHTS = H, VOCAB, H * VOCAB
"""The output layer's, cast where the profile runs it in fp8 (torchtitan's float8)."""


def test_current_scaling_reads_each_cast_input_once_more_by_hand():
    # Float8CurrentScalingQuantizer::quantize_impl runs nvte_compute_amax over the input
    # before the cast (transformer_engine/pytorch/csrc/quantizer.cpp): one more bf16 read
    # (2 bytes) of every input, output gradient and weight the casts read.
    expected = ((INPUTS + GRADIENTS) * TOKENS * MICRO_BATCHES + WEIGHTS) * 2
    added = _added(one_gpu(linear="fp8-tensorwise", fp8_scaling="current"),
                   one_gpu(linear="fp8-tensorwise", fp8_scaling="delayed"))
    assert added == pytest.approx(expected, rel=1e-12)


def test_delayed_scaling_is_transformer_engines_default_and_torchaos_is_current():
    assert fp8_scaling(SESSION.load_spec(one_gpu())) == "delayed"
    assert fp8_scaling(SESSION.load_spec(one_gpu(framework="torchtitan"))) == "current"
    assert fp8_scaling(SESSION.load_spec(one_gpu(framework="pytorch-fsdp2"))) == "current"
    # unset, the profile's: the same numbers as stating it
    assert SESSION.evaluate(one_gpu(linear="fp8-tensorwise")).to_dict() == SESSION.evaluate(
        one_gpu(linear="fp8-tensorwise", fp8_scaling="delayed")).to_dict()


@pytest.mark.parametrize("recipe", ["fp8-rowwise", "fp8-blockwise", "mxfp8"])
def test_row_and_block_scales_are_found_in_the_casts_own_pass(recipe):
    assert _added(one_gpu(linear=recipe, fp8_scaling="current"),
                  one_gpu(linear=recipe, fp8_scaling="delayed")) == 0


def test_an_unknown_scaling_names_its_key():
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(one_gpu(linear="fp8-tensorwise", fp8_scaling="dynamic"))
    assert [p.path for p in error.value.problems] == ["$.precision.fp8_scaling"]


# -- fp8 attention --------------------------------------------------------------------

QKV_ELEMENTS, O_ELEMENTS = Q + 2 * KV, Q
"""Per layer and token: queries, keys, values; the output (and its gradient)."""


@pytest.mark.parametrize(("recompute", "reruns"), [("none", 0), ("selective", 1), ("full", 1)])
def test_fp8_attention_casts_queries_keys_values_output_and_its_gradient_by_hand(recompute,
                                                                              reruns):
    # TE's FusedAttnFunc with fp8_dpa (backends.py): Q, K, V quantized before the forward,
    # O kept in fp8 for the backward, dO quantized before it; each read in bf16 (2 bytes)
    # and written once in fp8 (1 byte). A rerun of the attention (selective core_attn,
    # full) casts Q, K, V and O again.
    per_token = (QKV_ELEMENTS + O_ELEMENTS) * (1 + reruns) + O_ELEMENTS
    expected = LAYERS * per_token * TOKENS * MICRO_BATCHES * (2 + 1)
    added = _added(one_gpu(recompute, attention="fp8-tensorwise"), one_gpu(recompute))
    assert added == pytest.approx(expected, rel=1e-12)
    plan = SESSION.evaluate(one_gpu(recompute, attention="fp8-tensorwise"))
    assert not any("not costed" in w for w in plan.warnings)


def test_fp8_attention_under_current_scaling_reads_its_operands_twice():
    delayed = _added(one_gpu(attention="fp8-tensorwise"), one_gpu())
    current = _added(one_gpu(attention="fp8-tensorwise", fp8_scaling="current"), one_gpu())
    assert current / delayed == pytest.approx((2 * 2 + 1) / (2 + 1))


def test_fp8_attention_and_linear_casts_add_up():
    both = _added(one_gpu(linear="fp8-rowwise", attention="fp8-rowwise"), one_gpu())
    linear = _added(one_gpu(linear="fp8-rowwise"), one_gpu())
    attention = _added(one_gpu(attention="fp8-rowwise"), one_gpu())
    assert both == pytest.approx(linear + attention, rel=1e-12)


# -- properties -----------------------------------------------------------------------

@pytest.mark.parametrize("model", ["llama-3-8b", "deepseek-v3", "qwen3-next-80b-a3b"])
def test_nothing_is_cast_or_copied_in_bf16(model):
    spec = SESSION.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "precision": {"fp8_scaling": "current"}})
    shape = RankShape(micro_batch_size=2)
    assert cast_bytes(spec, shape, "full", 1.0) == (0.0, 0.0)
    assert weight_copy_bytes(spec, Composition(()), {"attention": 1e9, "mlp": 1e9}) == 0.0


@settings(max_examples=25, deadline=None)
@given(recipe=st.sampled_from(FP8_RECIPES), scaling=st.sampled_from(["delayed", "current"]),
       linear=st.booleans(), attention=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]),
       model=st.sampled_from(["llama-3-8b", "deepseek-v3", "qwen3-next-80b-a3b"]),
       tensor=st.sampled_from([1, 2, 4]), micro_batch=st.integers(1, 8))
def test_casts_grow_with_tokens_and_weights_casts_do_not(recipe, scaling, linear, attention,
                                                         recompute, model, tensor,
                                                         micro_batch):
    precision: dict[str, str] = {"fp8_scaling": scaling}
    if linear:
        precision["linear"] = recipe
    if attention:
        precision["attention"] = recipe
    spec = SESSION.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "precision": precision, "training": {"recompute": recompute}})
    one = cast_bytes(spec, RankShape(tensor=tensor, micro_batch_size=micro_batch),
                     recompute, 1.0)
    more = cast_bytes(spec, RankShape(tensor=tensor, micro_batch_size=micro_batch + 1),
                      recompute, 1.0)
    if not (linear or attention):
        assert one == more == (0.0, 0.0)
        return
    # a micro-batch's casts are proportional to its tokens; the weights' are per step
    assert more[0] / one[0] == pytest.approx((micro_batch + 1) / micro_batch, rel=1e-12)
    assert more[1] == one[1] and (one[1] > 0) == linear


def test_amax_reads_never_lower_the_cost():
    for recipe in FP8_RECIPES:
        delayed = SESSION.evaluate(one_gpu(linear=recipe, attention=recipe,
                                           fp8_scaling="delayed"))
        current = SESSION.evaluate(one_gpu(linear=recipe, attention=recipe,
                                           fp8_scaling="current"))
        assert current.step_seconds >= delayed.step_seconds
        assert (current.step_seconds > delayed.step_seconds) == (recipe == "fp8-tensorwise")


def test_without_a_weight_cache_every_forward_casts_the_weights_again():
    # Transformer Engine called without is_first_microbatch re-quantizes its weight at
    # every call (linear.py: update_ws = is_first_microbatch is None or ...), as under
    # hf-trainer (accelerate's Transformer Engine backend): 4 micro-batches cast the
    # weights 4 times, not once.
    def added(framework: str | None) -> float:
        return _added(one_gpu(framework=framework, linear="fp8-tensorwise",
                              fp8_scaling="delayed"), one_gpu(framework=framework))

    per_element = 2 + 2 * 1
    # it also converts its output layer: its input, gradient and weight casts
    output = ((OUTPUT_INPUTS + OUTPUT_GRADIENTS) * TOKENS + OUTPUT_WEIGHTS) * MICRO_BATCHES
    assert added("hf-trainer") - added(None) == pytest.approx(
        (WEIGHTS * (MICRO_BATCHES - 1) + output) * per_element, rel=1e-12)
    # and so does each recomputed forward
    full = _added(one_gpu("full", "hf-trainer", linear="fp8-tensorwise", fp8_scaling="delayed"),
                  one_gpu("full", "hf-trainer"))
    plain = added("hf-trainer")
    layer_weights = LAYERS * LAYER_LINEAR
    inputs = LAYERS * (H + H + H + F)
    assert full - plain == pytest.approx(
        (inputs * TOKENS + layer_weights) * MICRO_BATCHES * per_element, rel=1e-12)
