"""FP8 training's mechanisms beyond the products' rate: every linear layer a model has
among the fp8 products (the recurrent mixers' projections too)."""

from __future__ import annotations

from typing import Any

import pytest

import llmpar
from llmpar.evaluation.casts import WEIGHT_COPY_GROUPS, cast_bytes
from llmpar.evaluation.matmuls import RankShape, products
from llmpar.footprint.flops import active_matmul_weights

SESSION = llmpar.Session(load_entry_points=False)
SEQUENCE = 4096


def _spec(model: str | dict[str, Any], framework: str | None = None,
          **precision: Any) -> llmpar.Spec:
    training: dict[str, Any] = {"sequence_length": SEQUENCE, "micro_batch_size": 1,
                                "global_batch_size": 4, "activation_model": "fused"}
    if framework is not None:
        training["framework"] = framework
    return SESSION.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "precision": precision, "training": training})


# -- every linear layer, by the parameters' inventory ---------------------------------

@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "deepseek-v3",
                                   "deepseek-v3.2-exp", "falcon-h1-7b", "granite-4.0-h-small",
                                   "qwen3-next-80b-a3b", "qwen3.5-27b"])
def test_the_layers_products_are_the_models_matrix_weights(model):
    # One inventory: the layers' products on one GPU multiply through exactly the matrix
    # weights the FLOP count (and the parameter count) has, 2 FLOPs per weight and token:
    # Mamba-2's and gated DeltaNet's projections where a layer has them in place of (or,
    # Falcon-H1, beside) attention's, a gated attention's output gate, the sparse
    # attention indexer, the shared expert's gate.
    spec = _spec(model)
    found = sum(2 * p.m * p.n * p.k * p.count for p in products(spec, RankShape(), False)
                if p.layer)
    assert found == pytest.approx(2 * SEQUENCE * active_matmul_weights(spec.model), rel=1e-12)


def test_attention_projections_only_where_a_layer_attends():
    spec = _spec("granite-4.0-h-small")  # "MMMMMAMMMM": 4 of 40 layers attend
    found = {p.name: p.count for p in products(spec, RankShape(), False)}
    assert found["Q/K/V"] == found["attention output"] == 4
    assert found["mamba in"] == found["mamba out"] == 36


# Granite 4.0-H-Small (specs/models/granite-4.0-h-small.toml): h 4096, Mamba-2 with 128
# heads of 64 (inner 8192), state 128 in one group, so in_proj is 4096 -> 8192 (z) + 8192
# (x) + 2 x 128 (B, C) + 128 (dt) = 16768 and out_proj 8192 -> 4096.
H, INNER, IN_PROJ = 4096, 8192, 8192 + 8192 + 2 * 128 + 128


def test_mamba_projections_split_over_the_tensor_ranks_by_hand():
    # Megatron-Core's MambaMixer: in_proj a ColumnParallelLinear, out_proj a
    # RowParallelLinear (megatron/core/ssm/mamba_mixer.py).
    spec = _spec("granite-4.0-h-small")
    for t in (1, 2, 4):
        found = {p.name: p for p in products(spec, RankShape(tensor=t), False)}
        assert (found["mamba in"].n, found["mamba in"].k) == (IN_PROJ / t, H)
        assert (found["mamba out"].n, found["mamba out"].k) == (H, INNER / t)
        assert found["mamba in"].m == SEQUENCE


def test_mamba_projections_are_cast_like_any_fp8_linear_layer_by_hand():
    # The same model with every layer a Mamba-2 layer against every other layer attention
    # ("MA"): the casts differ by 20 layers' mixers' products alone. Each fp8 product's
    # input is read in bf16 and written in fp8 twice (2 + 2 bytes per element), its output
    # gradient alike, in Megatron-Core's Transformer Engine layers (its
    # TELayerNormColumnParallelLinear in_proj and TERowParallelLinear out_proj); the
    # weights once per step.
    per_element = 2 + 2 * 1
    layers = 20

    def casts(pattern: str) -> tuple[float, float]:
        model = {"preset": "granite-4.0-h-small", "mixer_pattern": pattern}
        return cast_bytes(_spec(model, linear="fp8-tensorwise"), RankShape(), "none", 0.0)

    mamba, attention = casts("M"), casts("MA")
    # Llama-style attention of the same model: Q/K/V 4096 -> 4096 + 2 x 1024, output
    # 4096 -> 4096
    mamba_io = (H + INNER) + (IN_PROJ + H)
    attention_io = (H + H) + (H + 2 * 1024 + H)
    assert mamba[0] - attention[0] == pytest.approx(
        layers * SEQUENCE * (mamba_io - attention_io) * per_element, rel=1e-12)
    mamba_weights = H * IN_PROJ + INNER * H
    attention_weights = H * (H + 2 * 1024) + H * H
    assert mamba[1] - attention[1] == pytest.approx(
        layers * (mamba_weights - attention_weights) * per_element, rel=1e-12)


@pytest.mark.parametrize("model", ["granite-4.0-h-small", "qwen3-next-80b-a3b", "falcon-h1-7b"])
def test_transformer_engine_keeps_fp8_copies_of_the_mixers_projections(model):
    plan = SESSION.evaluate({"model": model, "hardware": {"gpu": "h200-sxm"},
                             "precision": {"linear": "fp8-tensorwise"},
                             "training": {"sequence_length": 1024, "global_batch_size": 1,
                                          "activation_model": "fused"}})
    assert plan.training is not None and plan.training.memory_peak is not None
    groups = plan.parameters_by_group
    assert {"mamba", "linear_attention"} & set(groups)
    linear = sum(groups[g] for g in WEIGHT_COPY_GROUPS if g in groups)
    # two fp8 copies (as it is and transposed) of every layer's linear weights
    assert plan.training.memory_peak.fp8_weight_copies_bytes == pytest.approx(2 * linear,
                                                                              abs=1)


# -- torchao's backward recasts -------------------------------------------------------

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json): h 4096, FFN 14336, 32 query heads
# and 8 KV heads of 128, 32 layers, vocabulary 128256; one micro-batch of 4096 tokens.
L8_H, L8_F, L8_KV, L8_LAYERS, L8_VOCAB = 4096, 14336, 1024, 32, 128256
L8_INPUTS = L8_LAYERS * (L8_H + L8_H + L8_H + L8_F) + L8_H
"""Input widths of the fp8 products (Q/K/V, output, gate/up, down; the output layer)."""
L8_OUTPUTS = L8_LAYERS * ((L8_H + 2 * L8_KV) + L8_H + 2 * L8_F + L8_H) + L8_VOCAB
L8_WEIGHTS = (L8_LAYERS * (L8_H * (L8_H + 2 * L8_KV) + L8_H * L8_H + 3 * L8_H * L8_F)
              + L8_H * L8_VOCAB)


def _llama(framework: str, recompute: str = "none", **precision: Any) -> llmpar.Spec:
    training: dict[str, Any] = {"sequence_length": SEQUENCE, "micro_batch_size": 1,
                                "global_batch_size": 1, "activation_model": "fused",
                                "recompute": recompute, "framework": framework}
    return SESSION.load_spec({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                              "precision": precision, "training": training})


@pytest.mark.parametrize("scaling", ["delayed", "current"])
def test_torchao_casts_the_saved_input_weight_and_output_gradient_again_by_hand(scaling):
    # matmul_with_hp_or_float8_args (torchao/float8/float8_linear.py): the forward casts
    # the input and the weight (one fp8 orientation each); the backward casts the output
    # gradient and the weight for the input gradient, the output gradient and the saved
    # input again for the weight gradient. Each cast reads bf16 (2 bytes; twice under
    # current scaling, its amax first) and writes 1 byte.
    reads = 2 if scaling == "current" else 1
    per_cast = reads * 2 + 1
    spec = _llama("torchtitan", linear="fp8-tensorwise", fp8_scaling=scaling)
    micro_batch, step = cast_bytes(spec, RankShape(), "none", 0.0)
    inputs, outputs = L8_INPUTS * SEQUENCE, L8_OUTPUTS * SEQUENCE
    assert micro_batch == pytest.approx(
        (2 * inputs + 2 * outputs + 2 * L8_WEIGHTS) * per_cast, rel=1e-12)
    assert step == 0  # no weight cache: every use casts


def test_recasts_write_the_same_fp8_bytes_and_read_more():
    # Transformer Engine writes both orientations in one pass and keeps them; torchao
    # writes one per cast, from a second read in the backward: the same bytes written,
    # one more read of each input, weight and output gradient (2 bytes each, delayed).
    te = _llama("hf-trainer", linear="fp8-tensorwise", fp8_scaling="delayed")
    torchao = _llama("torchtitan", linear="fp8-tensorwise", fp8_scaling="delayed")
    one, other = (cast_bytes(s, RankShape(), "none", 0.0)[0] for s in (te, torchao))
    assert other - one == pytest.approx(
        (L8_INPUTS * SEQUENCE + L8_OUTPUTS * SEQUENCE + L8_WEIGHTS) * 2, rel=1e-12)


def test_recomputation_reruns_only_the_forwards_casts_under_torchao():
    # full recomputation reruns each layer's forward: its input and weight casts, not the
    # backward's recasts; the output layer is never rerun.
    spec = _llama("torchtitan", "full", linear="fp8-tensorwise", fp8_scaling="delayed")
    plain = _llama("torchtitan", linear="fp8-tensorwise", fp8_scaling="delayed")
    full = cast_bytes(spec, RankShape(), "full", 1.0)[0]
    none = cast_bytes(plain, RankShape(), "none", 0.0)[0]
    layer_inputs = (L8_INPUTS - L8_H) * SEQUENCE
    layer_weights = L8_WEIGHTS - L8_H * L8_VOCAB
    assert full - none == pytest.approx((layer_inputs + layer_weights) * (2 + 1), rel=1e-12)


def test_profiles_say_who_recasts():
    for name, recasts in (("megatron-core", False), ("nemo", False), ("torchtitan", True),
                          ("pytorch-fsdp2", True), ("hf-trainer", False)):
        assert _llama(name).training.profile.fp8_backward_recasts is recasts


# -- the cast before an fp8 weight all-gather -----------------------------------------

FSDP_EXAMPLE = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
"""Llama-3-8B under FSDP on 8 H100: 8,192 tokens a micro-batch, 8 micro-batches a step."""


def _fsdp(**overrides: Any) -> llmpar.Plan:
    return SESSION.evaluate(FSDP_EXAMPLE, {"training.framework": "torchtitan",
                                           "precision.linear": "fp8-tensorwise", **overrides})


def _elementwise_bytes(plan: llmpar.Plan) -> float:
    return float(plan.derivation("step_seconds").inputs["elementwise_bytes"])


def test_each_gather_casts_its_shard_and_the_products_cast_no_weight_by_hand():
    # torchao's fsdp_pre_all_gather casts the GPU's shard (bf16 read twice under current
    # scaling, its amax first; fp8 written) before every all-gather, forward and
    # backward; the products then get Float8TrainingTensor weights and cast none, where
    # without the fp8 gather each forward and each backward cast the gathered weights
    # (the output layer's too: torchtitan converts it).
    per_element = 2 * 2 + 1
    bf16_gather, fp8_gather = _fsdp(), _fsdp(**{"precision.weight_gather": "fp8-tensorwise"})
    gathers = [c for c in fp8_gather.training.collectives
               if c.name == "data.dense-param-all-gather"]
    shards = sum(c.calls_per_step * c.buffer_bytes / 1 / c.group_size for c in gathers)
    assert shards > 0 and all(c.group_size == 8 for c in gathers)
    micro_batches = 8
    product_weight_casts = micro_batches * 2 * L8_WEIGHTS * per_element
    added = _elementwise_bytes(fp8_gather) - _elementwise_bytes(bf16_gather)
    assert added == pytest.approx(shards * per_element - product_weight_casts, rel=1e-9)
    assert fp8_gather.step_seconds < bf16_gather.step_seconds


def test_an_fp8_gather_of_16_bit_products_still_casts_its_shards():
    # weights gathered in fp8 for bf16 products: the shard casts cost, nothing else does
    plain = SESSION.evaluate(FSDP_EXAMPLE)
    gathered = SESSION.evaluate(FSDP_EXAMPLE, {"precision.weight_gather": "fp8-tensorwise"})
    gathers = [c for c in gathered.training.collectives
               if c.name == "data.dense-param-all-gather"]
    shards = sum(c.calls_per_step * c.buffer_bytes / c.group_size for c in gathers)
    added = _elementwise_bytes(gathered) - _elementwise_bytes(plain)
    assert added == pytest.approx(shards * (2 + 1), rel=1e-9)  # delayed: one bf16 read


def test_weights_stored_in_fp8_need_no_cast_before_their_gather():
    stored = {"precision.weights": "fp8-tensorwise", "precision.linear": "fp8-tensorwise"}
    assert (_elementwise_bytes(SESSION.evaluate(FSDP_EXAMPLE, stored))
            == _elementwise_bytes(SESSION.evaluate(
                FSDP_EXAMPLE, {**stored, "precision.weight_gather": "fp8-tensorwise"})))


def test_a_stages_unsharded_weights_are_held_in_the_gathers_format():
    # torchtitan under pipeline parallelism keeps each stage's weights gathered through
    # the step: the blocks FSDP's all-gathers fill, in the format they carry (the gather
    # buffers' and the collectives' one format, `Precision.weight_gather_under`).
    def block(**precision: str) -> int:
        plan = SESSION.evaluate({
            "model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "precision": precision,
            "training": {"sequence_length": 4096, "micro_batch_size": 1,
                         "global_batch_size": 16, "framework": "torchtitan"},
            "parallel": {"pipeline": {"degree": 2}, "data": {"zero": 3}}})
        peak = plan.training.memory_peak
        assert peak is not None
        return next(b.bytes for b in peak.alive if b.name == "unsharded weights of the stage")

    bf16, fp8 = block(), block(linear="fp8-tensorwise", weight_gather="fp8-tensorwise")
    assert fp8 * 2 == pytest.approx(bf16, abs=2 * 2**21)  # each rounded to the allocator
    # fp32 weights gather in the compute format under FSDP2's MixedPrecisionPolicy
    # (`Framework.weight_gather_in_compute`), in their own where the gather format says so
    assert block(weights="fp32") == bf16
    assert block(weights="fp32", weight_gather="fp32") == pytest.approx(2 * bf16,
                                                                         abs=2 * 2**21)


# -- amax all-reduces under sequence parallelism --------------------------------------

SP_EXAMPLE = "specs/examples/llama-3-8b-tp8-sp-a100.toml"
AMAX = "sequence.fp8-amax-all-reduce"


def _sp(**overrides: Any) -> llmpar.Plan:
    return SESSION.evaluate(SP_EXAMPLE, {"hardware.cluster": "dgx-h100", **overrides})


def _collective(plan: llmpar.Plan, name: str) -> Any:
    return next((c for c in plan.training.collectives if c.name == name), None)


def test_current_scaling_reduces_each_sequence_split_casts_amax_over_the_tensor_group():
    # Transformer Engine's current-scaling quantizers of a column-parallel input and a
    # row-parallel output gradient reduce their amax over the tensor group under sequence
    # parallelism (_customize_quantizers_float8_current_scaling): one fp32 all-reduce per
    # tensor cast before a sequence all-gather, as many as those gathers.
    plan = _sp(**{"precision.linear": "fp8-tensorwise", "precision.fp8_scaling": "current"})
    amax, gather = _collective(plan, AMAX), _collective(plan, "sequence.all-gather")
    assert amax is not None and amax.buffer_bytes == 4
    assert amax.group_size == gather.group_size == 8
    assert amax.calls_per_step == gather.calls_per_step
    assert amax.exposed_seconds == amax.seconds > 0  # the cast waits for it
    delayed = _sp(**{"precision.linear": "fp8-tensorwise", "precision.fp8_scaling": "delayed"})
    # the same step but for the amax reductions and the amax reads
    assert plan.compute_seconds > delayed.compute_seconds
    assert (plan.exposed_communication_seconds - delayed.exposed_communication_seconds
            == pytest.approx(amax.exposed_seconds, rel=1e-9))


@pytest.mark.parametrize("overrides", [
    {},  # bf16
    {"precision.linear": "fp8-tensorwise", "precision.fp8_scaling": "delayed"},
    {"precision.linear": "fp8-rowwise", "precision.fp8_scaling": "current"},  # per-row scales
    {"precision.linear": "mxfp8", "precision.fp8_scaling": "current"},
    {"precision.linear": "fp8-tensorwise", "precision.fp8_scaling": "current",
     "parallel.sequence.enabled": False},  # every rank casts the whole tensor
])
def test_no_amax_all_reduce_without_one_current_scale_per_sequence_split_tensor(overrides):
    assert _collective(_sp(**overrides), AMAX) is None


# -- the sequence all-gathers carry fp8 under one scale per tensor ---------------------

@pytest.mark.parametrize("scaling", ["delayed", "current"])
def test_sequence_all_gathers_carry_fp8_under_one_scale_per_tensor_by_hand(scaling):
    # Transformer Engine casts ln_out (forward) and the row-parallel output gradient
    # (backward, grad_output_preprocess) to fp8 before gather_along_first_dim; torchao's
    # Float8ColwiseParallel / NoopFwToFloat8BwDynamic cast before the DTensor
    # redistribute. Llama-3-8B at 8192 tokens, micro-batch 1: b s h = 1 x 8192 x 4096.
    bf16 = _sp()
    fp8 = _sp(**{"precision.linear": "fp8-tensorwise", "precision.fp8_scaling": scaling})
    hidden = 1 * 8192 * 4096
    assert _collective(bf16, "sequence.all-gather").buffer_bytes == 2 * hidden
    gather = _collective(fp8, "sequence.all-gather")
    assert gather.buffer_bytes == 1 * hidden
    assert gather.calls_per_step == _collective(bf16, "sequence.all-gather").calls_per_step
    assert gather.seconds < _collective(bf16, "sequence.all-gather").seconds
    # the reduce-scatters carry the products' bf16 outputs either way
    for name in ("sequence.reduce-scatter", "sequence.input-gradient-reduce-scatter"):
        assert _collective(fp8, name).buffer_bytes == _collective(bf16, name).buffer_bytes


@pytest.mark.parametrize("linear", ["fp8-rowwise", "mxfp8", "fp8-blockwise"])
def test_sequence_all_gathers_stay_in_the_activations_format_otherwise(linear):
    # per-row, per-block and MX scales: the gathers are counted in the activations' format
    plan = _sp(**{"precision.linear": linear})
    assert _collective(plan, "sequence.all-gather").buffer_bytes == 2 * 8192 * 4096
