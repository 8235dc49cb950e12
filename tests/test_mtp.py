"""Multi-token-prediction modules (`[model] mtp_layers`): read from every config spelling,
counted in the checkpoint beside the main model, checked against DeepSeek-V3's stated
figures (README and README_WEIGHTS.md of deepseek-ai/DeepSeek-V3; arXiv:2412.19437,
Sec. 2.2), drafted with in serving, and trained on the last pipeline stage with
`[training] multi_token_prediction`."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from search_specs import MOE_MODEL, agreeing_pairs, small_spec

import llmpar
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.mtp import (
    MTP_NORMS,
    checkpoint_parameters,
    mtp_block_model,
    mtp_forward_flops,
    mtp_parameter_groups,
    mtp_stored_copies,
)
from llmpar.footprint.parameters import (
    attention_matmul_weights,
    count_parameters,
    idle_expert_parameters,
)
from llmpar.hf import model_table_from_hf

CONFIGS = Path(__file__).resolve().parent.parent / "validation" / "configs"
SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h100-sxm"}
B = 1e9


def preset(name: str) -> llmpar.Model:
    return SESSION.load_spec({"model": name, "hardware": GPU}).model


def test_deepseek_v3_checkpoint_is_685b_and_its_main_model_671b():
    # README of deepseek-ai/DeepSeek-V3: "The total size of DeepSeek-V3 models on Hugging
    # Face is 685B, which includes 671B of the Main Model weights and 14B of the
    # Multi-Token Prediction (MTP) Module weights": each within one unit of its last digit
    # (the catalogue's convention, tests/test_model_catalogue.py). The 685B holds the
    # embedding and head copies stored in model.layers.61 (without them: 682.6B).
    model = preset("deepseek-v3")
    main = count_parameters(model).total
    module = sum(mtp_parameter_groups(model).values()) + mtp_stored_copies(model)
    assert abs(main - 671 * B) < 1 * B
    assert abs(module - 14 * B) < 1 * B
    assert abs(checkpoint_parameters(model, main) - 685 * B) < 1 * B
    assert checkpoint_parameters(model, main) == main + module


def test_deepseek_v3_module_by_hand_against_readme_weights():
    # README_WEIGHTS.md: the MTP module has "11.5B unique parameters (excluding the shared
    # 0.9B Embedding and 0.9B output Head)", "Activation parameters: 1.5B (including 0.9B
    # for the output Head)"; its hidden layer model.layers.61 is "structure identical to
    # the Main Model hidden layers" (an MoE layer). Those figures match the block alone;
    # the projection M_k (arXiv:2412.19437, Eq. 21: h x 2h) adds 2 x 7168^2 = 102.8M and
    # enorm, hnorm and shared_head.norm 3 x 7168.
    model = preset("deepseek-v3")
    h = 7168
    groups = mtp_parameter_groups(model)
    assert groups["projection"] == 2 * h * h
    block = mtp_block_model(model)
    assert block.num_layers == 1 and block.num_moe_layers == 1
    main_layer = count_parameters(model).by_group
    assert groups["experts"] == main_layer["experts"] // 58  # one of the 58 MoE layers
    assert groups["attention"] == main_layer["attention"] // 61
    block_total = sum(groups.values()) - groups["projection"] - MTP_NORMS * h
    assert abs(block_total - 11.5 * B) < 0.1 * B
    active = block_total - idle_expert_parameters(block) + 129280 * h  # + the output head
    assert abs(active - 1.5 * B) < 0.1 * B
    assert mtp_stored_copies(model) == 2 * 129280 * h


@pytest.mark.parametrize(("config", "layers", "copies"), [
    ("deepseek-v3", 1, True), ("deepseek-r1", 1, True), ("deepseek-v3.2-exp", 1, True),
    ("glm-4.5", 1, False), ("glm-4.5-air", 1, False), ("qwen3.5-27b", 1, False),
    ("qwen3.5-397b-a17b", 1, False), ("kimi-k2", 0, False)])
def test_import_reads_every_spelling(config, layers, copies):
    # num_nextn_predict_layers (DeepSeek, GLM-4.5; Kimi K2 writes 0), mtp_num_hidden_layers
    # (Qwen3.5, inside text_config).
    model = llmpar.model_from_hf(CONFIGS / f"{config}.json")
    assert model.mtp_layers == layers
    assert model.mtp_table_copies is copies
    assert ("mtp_layers" in model.source) is bool(layers)


def test_qwen3_next_mtp_layer_is_an_attention_layer_with_experts():
    # Qwen3-Next's mtp.layers.0 is a full-attention layer with its experts (vLLM's
    # qwen3_next_mtp.py), the kind of its last layer (layer_types end in full_attention).
    config = json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text(encoding="utf-8"))
    model = llmpar.model_from_hf({**config, "mtp_num_hidden_layers": 1,
                                  "mtp_use_dedicated_embeddings": False})
    assert model.mtp_layers == 1 and not model.mtp_table_copies
    block = mtp_block_model(model)
    assert block.mixer_pattern == "A" and block.num_moe_layers == 1
    groups = mtp_parameter_groups(model)
    assert "linear_attention" not in groups and groups["attention"] > 0
    assert groups["projection"] == 2 * 2048 * 2048


def test_import_refuses_what_it_cannot_count():
    config = json.loads((CONFIGS / "deepseek-v3.json").read_text(encoding="utf-8"))
    with pytest.raises(llmpar.SpecError) as caught:
        model_table_from_hf({**config, "mtp_num_hidden_layers": 2})
    [problem] = caught.value.problems
    assert problem.path == "$.mtp_num_hidden_layers" and "disagrees" in problem.message
    qwen = json.loads((CONFIGS / "qwen3.5-27b.json").read_text(encoding="utf-8"))
    text = {**qwen["text_config"], "mtp_use_dedicated_embeddings": True}
    with pytest.raises(llmpar.SpecError) as caught:
        model_table_from_hf({**qwen, "text_config": text})
    [problem] = caught.value.problems
    assert problem.path.endswith("mtp_use_dedicated_embeddings")


@pytest.mark.parametrize(("override", "path"), [
    ({"model.mtp_layers": -1}, "$.model.mtp_layers"),
    ({"model.mtp_layers": 0}, "$.model.mtp_table_copies"),
])
def test_bad_mtp_keys_are_spec_errors(override, path):
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": "deepseek-v3", "hardware": GPU}, override)
    assert path in [problem.path for problem in caught.value.problems]


def test_a_model_given_by_size_has_no_modules_to_count():
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": {"parameters": 7e9, "mtp_layers": 1}, "hardware": GPU})
    assert "$.model.mtp_layers" in [problem.path for problem in caught.value.problems]


MODELS = ("deepseek-v3", "glm-4.5-air", "qwen3.5-27b", "llama-3.1-8b", "nemotron-h-8b")


@pytest.mark.parametrize("name", MODELS)
def test_no_modules_changes_nothing(name):
    model = attrs.evolve(preset(name), mtp_layers=0, mtp_table_copies=False)
    main = count_parameters(model).total
    assert mtp_parameter_groups(model) == {}
    assert checkpoint_parameters(model, main) == main
    assert count_parameters(model) == count_parameters(preset(name))


@given(name=st.sampled_from(MODELS), depth=st.integers(1, 4))
def test_module_parameters_grow_with_depth(name, depth):
    # Each depth is one more module of the same parts (arXiv:2412.19437, Sec. 2.2).
    model = attrs.evolve(preset(name), mtp_layers=depth)
    one = mtp_parameter_groups(model, 1)
    many = mtp_parameter_groups(model)
    assert many == {group: depth * count for group, count in one.items()}
    main = count_parameters(model).total
    fewer = attrs.evolve(model, mtp_layers=depth - 1, mtp_table_copies=False)
    assert checkpoint_parameters(model, main) > checkpoint_parameters(fewer, main)


@pytest.mark.parametrize(("name", "ships"), [
    ("deepseek-v3", True), ("deepseek-r1", True), ("glm-4.5-air", True),
    ("qwen3.5-27b", True), ("kimi-k2", False), ("llama-3.1-8b", False)])
def test_serving_drafts_with_the_modules_the_model_ships(name, ships):
    # The engines run a shipped MTP module as the draft (vLLM "mtp", SGLang NEXTN,
    # TensorRT-LLM MTP), any other model an EAGLE head: read from mtp_layers, not the
    # preset's name (DeepSeek-R1 ships the module too).
    from llmpar.launch.serving import ships_draft_module

    spec = SESSION.load_spec({"model": name, "hardware": GPU})
    assert ships_draft_module(spec) is ships


def test_a_hybrid_models_draft_head_is_its_last_layers_kind():
    # The draft head of Qwen3.5 is an attention layer (its last layer's and its MTP
    # module's kind), not the first letter of its pattern (a gated DeltaNet layer).
    model = preset("qwen3.5-27b")
    head = mtp_block_model(model, 2)
    assert head.mixer_pattern == "A" and head.num_layers == 2
    assert head.num_attention_layers == 2


# Training with the modules (`[training] multi_token_prediction`).

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
DEEPSEEK = str(EXAMPLES / "deepseek-v3-2048-h800.toml")
MTP_ON = {"training.multi_token_prediction": True}


def test_off_by_default_and_refused_without_modules():
    spec = SESSION.load_spec({"model": "deepseek-v3", "hardware": GPU})
    assert spec.training.multi_token_prediction is False
    assert baseline_footprint(spec).mtp_by_group == {}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec({"model": "llama-3.1-8b", "hardware": GPU,
                           "training": {"multi_token_prediction": True}})
    [problem] = caught.value.problems
    assert problem.path == "$.training.multi_token_prediction"
    assert "mtp_layers = 0" in problem.message


def test_the_last_stage_holds_the_modules_states_and_tensors():
    # DeepSeek-V3's layout (PP16, EP64, ZeRO-1): only the last stage changes; its weights
    # grow by the module's non-expert parameters (671.6M, replicated: no tensor
    # parallelism) and a 64th of its experts, in bf16, its gradients alike.
    plain, trained = llmpar.evaluate(DEEPSEEK), llmpar.evaluate(DEEPSEEK, MTP_ON)
    *firsts, last = zip(plain.stages, trained.stages)
    assert all(a == b for a, b in firsts)
    before, after = last
    groups = mtp_parameter_groups(preset("deepseek-v3"))
    own = sum(groups.values()) - groups["experts"]
    assert after.weights_bytes - before.weights_bytes == 2 * own + 2 * groups["experts"] // 64
    assert after.gradients_bytes - before.gradients_bytes == (after.weights_bytes
                                                              - before.weights_bytes)
    assert after.optimizer_bytes > before.optimizer_bytes
    assert after.activations_bytes > before.activations_bytes
    assert trained.step_seconds > plain.step_seconds


def test_model_flops_add_the_modules_forward_and_backward():
    # By hand, per token and depth, forward (Megatron-LM's num_floating_point_operations,
    # megatron/training/training.py, counts the same terms): 2 x the MoE block's active
    # weights (MLA's matrices, 8 routed + 1 shared expert of 3 x h x 2048, the router's
    # h x 256), 2 x 2h x h for eh_proj and 2 x h x V for one more output layer, plus the
    # block's Q.K^T and scores.V over the full s x s square; 3x forward for training.
    plain, trained = llmpar.evaluate(DEEPSEEK), llmpar.evaluate(DEEPSEEK, MTP_ON)
    model, s = preset("deepseek-v3"), 4096
    h, vocab, heads = 7168, 129280, 128
    weights = attention_matmul_weights(model) + 9 * 3 * h * 2048 + h * 256
    scores = 2 * s * s * heads * (192 + 128)  # qk_head_dim 128 + 64, v_head_dim 128
    by_hand = 2 * s * (weights + 2 * h * h + h * vocab) + scores
    extra = mtp_forward_flops(model, s, False, "fused")
    assert extra.total == pytest.approx(by_hand, rel=1e-12)
    assert trained.flops_per_step - plain.flops_per_step == pytest.approx(
        3 * extra.total * 15360, rel=1e-9)


@given(depth=st.integers(1, 3))
def test_flops_and_parameters_grow_with_depth(depth):
    spec = SESSION.load_spec({"model": "deepseek-v3", "hardware": GPU,
                              "training": {"multi_token_prediction": True}},
                             {"model.mtp_layers": depth})
    deeper = attrs.evolve(spec, model=attrs.evolve(spec.model, mtp_layers=depth + 1))
    one, two = baseline_footprint(spec), baseline_footprint(deeper)
    assert two.train_flops_per_sequence() > one.train_flops_per_sequence()
    assert sum(two.mtp_by_group.values()) > sum(one.mtp_by_group.values())


def test_the_search_agrees_with_each_layout_alone():
    model = {**MOE_MODEL, "mtp_layers": 1}
    spec = small_spec(model=model, training={"sequence_length": 512, "global_batch_size": 24,
                                             "multi_token_prediction": True})
    assert agreeing_pairs(SESSION, spec, every=2)


def test_the_flops_derivation_says_the_modules_are_counted():
    plan = llmpar.evaluate(DEEPSEEK, MTP_ON)
    assert "multi-token-prediction" in plan.derivation("flops_per_step").source
    assert "multi-token-prediction" not in llmpar.evaluate(DEEPSEEK).derivation(
        "flops_per_step").source


def test_serving_never_trains_the_modules():
    # A serving spec has no [training] table (a SpecError); its default one never trains
    # the modules, which serving drafts with instead.
    with pytest.raises(llmpar.SpecError):
        SESSION.load_spec(str(EXAMPLES / "inference-deepseek-v3-h200.toml"),
                          {"training.multi_token_prediction": True})
    spec = SESSION.load_spec(str(EXAMPLES / "inference-deepseek-v3-h200.toml"))
    forced = attrs.evolve(spec, training=attrs.evolve(spec.training,
                                                      multi_token_prediction=True))
    assert baseline_footprint(forced).mtp_by_group == {}
