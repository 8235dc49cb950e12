"""Saved tensors of frozen weights (llmpar.finetune.activations): a product x W saves x
only for W's gradient, so a tensor kept only as the input of frozen weights is not kept,
unless an adapter's A saves it; a block no gradient reaches at its input keeps nothing
before its first trained product. Hand-checks on transformers' Llama block (hf-sdpa)
and the fused stack; the measured CPU rows are tests/test_finetune_validation.py's."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.evaluation.stages import stage_inventory, whole_model_stage
from llmpar.footprint.baseline import baseline_footprint

SESSION = llmpar.Session(load_entry_points=False)
BASE = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "training": {"sequence_length": 1024, "micro_batch_size": 1,
                     "activation_model": "hf-sdpa"}}
WEIGHT_INPUTS = {"input norm normalized", "post-attention norm normalized", "attention input",
                 "mlp input", "gated product"}
"""The tensors of transformers' Llama block kept only for a weight gradient."""


def names(spec: dict, group: int = 0) -> list[str]:
    inventory = baseline_footprint(SESSION.load_spec(spec)).activations
    assert inventory is not None
    return [t.name for t in inventory.groups[group].tensors]


def fixed_names(spec: dict) -> set[str]:
    inventory = baseline_footprint(SESSION.load_spec(spec)).activations
    assert inventory is not None
    return {t.name for t in inventory.fixed}


def tuned(**finetune: object) -> dict:
    return {**BASE, "finetune": finetune}


def test_full_training_keeps_every_weight_input():
    full = names(BASE)
    assert set(full) >= WEIGHT_INPUTS
    assert names(tuned(method="full")) == full


def test_lora_on_q_and_v_keeps_only_what_an_adapter_or_an_operation_saves():
    kept = names(tuned(method="lora", rank=16, target_modules=["q_proj", "v_proj"]))
    # q's lora_A saves the normed input of q/k/v; the frozen norms' normalized x, the
    # MLP's normed input and the SwiGLU product feeding down_proj were kept for weight
    # gradients only.
    assert "attention input" in kept
    assert not {"input norm normalized", "post-attention norm normalized", "mlp input",
                "gated product"} & set(kept)
    # What input gradients need stays: the norms' fp32 inputs, SiLU's input, the
    # product's operands, SDPA's inputs and output.
    full = names(BASE)
    assert [n for n in full if n not in WEIGHT_INPUTS] == [
        n for n in kept if "LoRA" not in n and n != "attention input"]
    head = fixed_names(tuned(method="lora", rank=16, target_modules=["q_proj", "v_proj"]))
    assert "output layer input" not in head and "token ids" not in head
    assert {"output layer input", "token ids"} <= fixed_names(BASE)


def test_lora_dropout_reads_its_own_copy():
    plain = names(tuned(method="lora", rank=16, target_modules=["q_proj", "v_proj"]))
    dropped = names(tuned(method="lora", rank=16, target_modules=["q_proj", "v_proj"],
                          dropout=0.1))
    # lora_A reads dropout(x), kept beside with its mask; x itself is no weight's input
    assert "attention input" in plain and "attention input" not in dropped
    assert "q_proj LoRA dropout(x)" in dropped


def test_all_linear_adapters_keep_every_linear_input():
    kept = set(names(tuned(method="lora", rank=8, target_modules=["all-linear"])))
    assert {"attention input", "mlp input", "gated product"} <= kept
    assert not {"input norm normalized", "post-attention norm normalized"} & kept


def test_modules_to_save_keeps_the_output_layer_input():
    head = fixed_names(tuned(method="lora", rank=8, target_modules=["q_proj"],
                             modules_to_save=["lm_head"]))
    assert "output layer input" in head


def test_frozen_groups_drop_their_weights_inputs_only():
    kept = set(names(tuned(method="frozen", frozen=["attention", "norms"])))
    assert "attention input" not in kept and "input norm normalized" not in kept
    assert {"mlp input", "gated product", "input norm input (fp32)"} <= kept


def test_the_first_block_keeps_nothing_before_its_first_adapter():
    spec = SESSION.load_spec(tuned(method="lora", rank=8, target_modules=["down_proj"]))
    footprint = baseline_footprint(spec)
    staged = stage_inventory(spec, footprint, whole_model_stage(spec))
    first, rest = staged.groups[0], staged.groups[1]
    assert (first.count, rest.count) == (1, 31)
    # Nothing before down_proj's adapter has a gradient in block 0: attention, the norms
    # and the gate/up products are recorded by no graph.
    assert [t.name for t in first.tensors][0] == "gated product"
    assert rest.tensors == footprint.activations.groups[0].tensors
    assert first.layer_bytes < rest.layer_bytes


def test_a_trained_embedding_reaches_the_first_block():
    spec = SESSION.load_spec(tuned(method="lora", rank=8, target_modules=["down_proj"],
                                   modules_to_save=["embed_tokens"]))
    staged = stage_inventory(spec, baseline_footprint(spec), whole_model_stage(spec))
    assert [g.count for g in staged.groups] == [32]


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["all-linear"], ["down_proj"]])
def test_fused_stack_drops_frozen_inputs_alike(targets):
    spec = {**BASE, "training": {**BASE["training"], "activation_model": "fused"}}
    full = names(spec)
    kept = names({**spec, "finetune": {"method": "lora", "rank": 8, "target_modules": targets}})
    own = [n for n in kept if "LoRA" not in n]
    adapted_q = targets == ["all-linear"] or "q_proj" in targets
    assert ("attention input" in own) == adapted_q
    assert ("fc2 input" in own) == (targets != ["q_proj", "v_proj"])
    assert set(own) <= set(full)


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt2"])
@pytest.mark.parametrize("method", [{"method": "lora", "rank": 8, "target_modules": ["q_proj"]},
                                    {"method": "frozen", "frozen": ["embedding", "attention"]}])
def test_fine_tuning_never_keeps_more_than_full_training(model, method):
    """Without the adapters' own tensors, a fine-tuning inventory is a part of full
    training's, layer by layer."""
    spec = {**BASE, "model": model, "training": {**BASE["training"],
                                                 "activation_model": "hf-eager"}}
    full = baseline_footprint(SESSION.load_spec(spec)).activations
    part = baseline_footprint(SESSION.load_spec({**spec, "finetune": method})).activations
    for whole, some in zip(full.groups, part.groups, strict=True):
        own = [t for t in some.tensors if "LoRA" not in t.name]
        assert set(own) <= set(whole.tensors)
        assert sum(t.bytes for t in own) <= whole.layer_bytes
