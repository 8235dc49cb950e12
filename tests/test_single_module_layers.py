"""Layers of one module each: a token mixer alone or an MLP alone behind one norm
(Nemotron-H's NemotronHBlock, transformers 5.24). Their closed-form counts, parameters by
hand, what serving keeps, the fused inventory per kind, the pipeline's and tensor
parallelism's splits, and what stays refused."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from inventories import fused_groups

import llmpar
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.flops import forward_flops_per_sequence
from llmpar.footprint.parameters import count_parameters
from llmpar.spec.model import ALONE, EXPERTS_ALONE, MIXERS, MLP_ALONE, PATTERN_LETTERS, mixer_parts

SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h100-sxm"}
CONFIGS = Path(__file__).resolve().parents[1] / "validation" / "configs"


def preset(name: str) -> llmpar.spec.Model:
    return SESSION.load_spec({"model": name, "hardware": GPU}).model


def config_of(name: str) -> dict:
    raw = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


@given(pattern=st.text(alphabet=PATTERN_LETTERS, min_size=1, max_size=7),
       first=st.integers(0, 40), count=st.integers(0, 60))
def test_closed_forms_are_the_layers_counted_one_by_one(pattern, first, count):
    model = llmpar.spec.Model(mixer_pattern=pattern)
    layers = range(first, first + count)
    letters = [pattern[i % len(pattern)] for i in layers]
    mixers: dict[str, int] = {}
    for letter in letters:
        for kind in mixer_parts(MIXERS[ALONE.get(letter, letter)]):
            mixers[kind] = mixers.get(kind, 0) + 1
    assert model.mixers_in(first, count) == mixers
    assert model.mlp_layers_in(first, count) == sum(letter not in ALONE for letter in letters)
    assert model.mlp_layers_in(first, count) == sum(model.has_mlp(i) for i in layers)
    # one norm before each single-module layer's module, two in a mixer-and-MLP layer
    assert model.norms_in(first, count) == sum(
        1 if letter in ALONE or letter in MLP_ALONE else 2 for letter in letters)
    # with experts, the "E" layers are the MoE layers wherever the pattern has them
    experts = llmpar.spec.model.MoE(num_experts=4, experts_per_token=2,
                                    expert_ffn_hidden_size=8)
    with_experts = llmpar.spec.Model(mixer_pattern=pattern, moe=experts)
    if EXPERTS_ALONE in pattern:
        assert with_experts.moe_layers_in(first, count) == letters.count(EXPERTS_ALONE)
        assert with_experts.moe_layers_in(first, count) == sum(
            with_experts.is_moe_layer(i) for i in layers)


def test_nemotron_h_8b_by_hand():
    # NemotronHForCausalLM (transformers 5.24), Nemotron-H-8B: h 4096, 52 blocks of one
    # RMSNorm and one module: 24 Mamba-2 (128 heads of 64, inner 8192, 8 groups of state 128:
    # in_proj h x (8192 + 10240 + 128), conv1d 10240 x 4 with bias, dt_bias, A_log, D, the
    # gated norm 8192, out_proj 8192 x h), 4 attention (32 heads and 8 key/value heads of
    # 128, no bias, no RoPE) and 24 relu2 MLPs (up and down, 21504); the final norm.
    model = preset("nemotron-h-8b")
    assert model.num_layers == 52 and model.mixer_pattern is not None
    assert model.mixers_in(0, 52) == {"mamba": 24, "attention": 4}
    assert model.num_dense_layers == 24 and model.num_attention_layers == 4
    h, inner, conv = 4096, 8192, 8192 + 2 * 8 * 128
    mamba = h * (inner + conv + 128) + conv * 5 + 3 * 128 + inner + inner * h
    groups = count_parameters(model).by_group
    assert groups["mamba"] == 24 * mamba
    assert groups["attention"] == 4 * (2 * h * 4096 + 2 * h * 1024)
    assert groups["mlp"] == 24 * 2 * h * 21504
    assert groups["norms"] == (52 + 1) * h
    assert groups["embedding"] == groups["head"] == 131072 * h


@pytest.mark.parametrize(("name", "stated"), [
    ("nemotron-h-8b", 8.1e9), ("nemotron-h-47b", 46.8e9), ("nemotron-h-56b", 56.3e9),
    ("nemotron-nano-9b-v2", 8.89e9)])
def test_nemotron_h_sizes_round_to_the_stated_ones(name, stated):
    # the model cards' 8B, 47B, 56B and 9B (NVIDIA-Nemotron-Nano-9B-v2: 8.89B)
    assert count_parameters(preset(name)).total == pytest.approx(stated, rel=0.01)


def test_a_layer_of_mixer_and_mlp_is_two_single_module_layers():
    # Llama's block is its attention alone followed by its MLP alone: "a-" over 2L layers
    # is the same parameters, FLOPs, saved tensors and KV cache as L plain layers.
    base = SESSION.load_spec({"model": "llama-3.1-8b", "hardware": GPU,
                              "training": {"sequence_length": 2048,
                                           "activation_model": "fused"}})
    split = attrs.evolve(base, model=attrs.evolve(base.model, num_layers=64,
                                                  mixer_pattern="a-"))
    assert count_parameters(split.model) == count_parameters(base.model)
    assert (forward_flops_per_sequence(split.model, 2048)
            == forward_flops_per_sequence(base.model, 2048))

    def saved(spec):
        inventory = baseline_footprint(spec).activations
        assert inventory is not None
        return sum(g.count * g.layer_bytes for g in inventory.groups)
    assert saved(split) == saved(base)
    plain, halves = SESSION.evaluate(base), SESSION.evaluate(split)
    assert halves.activations_bytes == plain.activations_bytes
    assert halves.weights_bytes == plain.weights_bytes
    serving = {"model": "llama-3.1-8b", "hardware": {**GPU, "num_gpus": 2},
               "parallel": {"tensor": {"degree": 2}},
               "inference": {"batch_size": 4, "prompt_tokens": 1024, "generated_tokens": 8}}
    spec = SESSION.load_spec(serving)
    halved = attrs.evolve(spec, model=attrs.evolve(spec.model, num_layers=64,
                                                   mixer_pattern="a-"))
    plain, halves = SESSION.evaluate(spec), SESSION.evaluate(halved)
    assert halves.kv_cache_bytes == plain.kv_cache_bytes
    assert halves.weights_bytes == plain.weights_bytes
    # the same bytes read per step: each module's norm and residual once, the TP
    # all-reduces once per module
    assert halves.step_seconds == pytest.approx(plain.step_seconds, rel=1e-12)


def test_serving_keeps_tokens_in_the_attention_layers_and_states_in_the_mamba_layers():
    # Nemotron-H-8B, 2 sequences of 1024 + 1 tokens, bf16: 4 attention layers keep K and V
    # (8 heads of 128) per token, 24 Mamba-2 layers 128 states of 64 x 128 and 3 inputs of
    # the 10240 convolved channels; the 24 MLP layers keep nothing.
    plan = SESSION.evaluate({"model": "nemotron-h-8b", "hardware": GPU,
                             "inference": {"batch_size": 2, "prompt_tokens": 1024,
                                           "generated_tokens": 1, "weights": "bf16",
                                           "kv_cache": "bf16"}})
    tokens = 2 * 4 * 1025 * 2 * 8 * 128 * 2
    state = 2 * 24 * (128 * 64 * 128 + 3 * 10240) * 2
    assert plan.kv_cache_bytes == tokens + state


def test_fused_single_module_layers_keep_their_module_behind_one_norm():
    groups = fused_groups("nemotron-h-8b")
    assert {kind: g.count for kind, g in groups.items()} == {
        "none mamba": 24, "none attention": 4, "dense none": 24}
    for group in groups.values():
        names = [t.name for t in group.tensors]
        assert names.count("input norm rstd (fp32)") + names.count("input norm input") >= 1
        assert "post-attention norm input" not in names
    mamba = [t.name for t in groups["none mamba"].tensors]
    assert "mlp input" not in mamba and {"z, x and dt", "B and C", "scan output"} <= set(mamba)
    mlp = [t.name for t in groups["dense none"].tensors]
    assert "mlp input" in mlp and "mixer input" not in mlp and "query" not in mlp
    # the MLP alone keeps b x s x h for its input and fc1's output and fc2's input (relu2,
    # two matrices: no gate), 2 bytes each, besides its norm
    ffn = sum(t.bytes for t in groups["dense none"].tensors if t.name in (
        "mlp input", "fc1 output", "fc2 input"))
    assert ffn == 4096 * (4096 + 2 * 21504) * 2


def test_pipeline_stages_hold_their_layers_of_each_kind():
    from llmpar.evaluation.stages import layer_kinds, stage_parameters
    from llmpar.strategy import Stage

    spec = SESSION.load_spec({"model": "nemotron-h-8b", "hardware": {**GPU, "num_gpus": 2},
                              "parallel": {"pipeline": {"degree": 2}}})
    footprint = baseline_footprint(spec)
    halves = [Stage(index=i, first_layer=26 * i, num_layers=26, has_embedding=i == 0,
                    has_head=i == 1, micro_batches_in_flight=1.0) for i in (0, 1)]
    model = spec.model
    for stage in halves:
        assert layer_kinds(spec, stage) == (model.mlp_layers_in(stage.first_layer, 26), 0)
    held = [stage_parameters(spec, footprint, stage) for stage in halves]
    for group in ("mamba", "attention", "mlp", "norms"):
        assert sum(h[group] for h in held) == pytest.approx(
            footprint.parameters_by_group[group])
    # the attention layers are layers 7, 18, 29 and 40 ("*" of hybrid_override_pattern):
    # two on each stage
    assert [i for i in range(52) if model.mixer_of(i) == "attention"] == [7, 18, 29, 40]
    assert held[0]["attention"] == held[1]["attention"]


def test_tensor_parallel_serving_reduces_once_per_module():
    from llmpar.strategies.tensor import SERVING_LAYER_OUTPUT

    plan = SESSION.evaluate({"model": "nemotron-h-8b", "hardware": {**GPU, "num_gpus": 2},
                             "parallel": {"tensor": {"degree": 2}},
                             "inference": {"batch_size": 2, "prompt_tokens": 512,
                                           "generated_tokens": 16}})
    calls = {c.calls_per_step for c in plan.collectives if c.name == SERVING_LAYER_OUTPUT}
    assert calls == {52 + 1}  # one module a layer, and the embedding


def test_training_tensor_collectives_count_modules_not_layers():
    from llmpar.strategies.common import blocks_per_stage
    from llmpar.strategy import Layout

    spec = SESSION.load_spec({"model": "nemotron-h-8b", "hardware": {**GPU, "num_gpus": 2},
                              "parallel": {"tensor": {"degree": 2}}})
    layout = Layout(num_gpus=2, degrees={"tensor": 2})
    assert blocks_per_stage(spec, layout) == 26  # 52 modules, two to a block
    # a plain model's blocks are its layers
    plain = SESSION.load_spec({"model": "llama-3.1-8b", "hardware": {**GPU, "num_gpus": 2}})
    assert blocks_per_stage(plain, layout) == 32


@pytest.mark.parametrize("activation_model", ["korthikanti"])
def test_activation_models_without_single_module_inventories_say_so(activation_model):
    plan = SESSION.evaluate({"model": "nemotron-h-8b", "hardware": GPU,
                             "training": {"sequence_length": 2048,
                                          "activation_model": activation_model}})
    assert any("mamba layers keep for backward" in w or "one module" in w
               for w in plan.warnings)


def test_experts_beside_a_mixer_alone_are_refused():
    table = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
             "ffn_hidden_size": 512, "vocab_size": 1000, "mixer_pattern": "a-",
             "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 128}}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": table, "hardware": GPU})
    assert "$.model.mixer_pattern" in [p.path for p in caught.value.problems]


def test_nemotron_h_layer_list_in_every_spelling_gives_one_pattern():
    config = config_of("nemotron-h-8b")
    model = llmpar.model_from_hf(config)
    letters = {"M": "mamba", "*": "attention", "-": "mlp"}
    renamed = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    pattern = config.pop("hybrid_override_pattern")
    for key, names in (("layers_block_type", letters), ("layer_types", renamed)):
        listed = {**config, key: [names[letter] for letter in pattern]}
        assert llmpar.model_from_hf(listed) == model
    assert model.position_embedding == "none" and model.ffn_activation == "relu2"


@pytest.mark.parametrize(("change", "path"), [
    ({"hybrid_override_pattern": "M*X"}, "$.hybrid_override_pattern"),
    ({"layers_block_type": ["mamba", "sliding_attention"]}, "$.layers_block_type"),
    ({"mlp_hidden_act": "swish"}, "$.mlp_hidden_act"),
    # experts of a latent width (Nemotron 3 Super's LatentMoE) are not modelled
    ({"hybrid_override_pattern": "MEM*E-", "moe_latent_size": 1024}, "$.moe_latent_size"),
    # unbiased experts beside a biased shared MLP
    ({"hybrid_override_pattern": "MEM*E-", "mlp_bias": True}, "$.mlp_bias"),
])
def test_nemotron_h_config_errors_name_the_key(change, path):
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf({**config_of("nemotron-h-8b"), **change})
    assert [p.path for p in caught.value.problems] == [path]
