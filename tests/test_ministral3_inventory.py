"""Ministral 3's language model as transformers 5.24 runs it on the CPU
(Ministral3ForCausalLM, the text_config of its config.json; eager and SDPA): hf-eager and
hf-sdpa against the bytes measured per tensor in validation/data/ministral-3-8b.json
(torch 2.13.0, b 1-2, s 128-512, 1 and 2 layers), the queries' per-position scale by
hand, and the whole model as its measured layers."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.activations.hf.family import FAMILIES
from llmpar.footprint.parameters import count_parameters

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "ministral-3-8b.json")
RUNS = runs_by_key(DATA)


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA, run)


def test_the_language_model_is_measured_without_the_vision_tower():
    # the measurement built Ministral3ForCausalLM from text_config, and its parameters at
    # full size are the preset's (34 layers, h 4096, untied 131072-token vocabulary)
    assert DATA["published_config_part"] == "text_config"
    assert DATA["model_class"] == "Ministral3ForCausalLM"
    model = llmpar.load_spec({"model": "ministral-3-8b", "hardware": {"gpu": "h100-sxm"}}).model
    counted = count_parameters(model).total
    assert counted == DATA["parameters_full_config"]["total_params"] == 8_489_553_920


def spec(s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": "ministral-3-8b", "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_each_layer_keeps_the_query_scale_once_per_position(attention):
    # query_states * get_llama_4_attn_scale(position_ids, ...).to(bf16): position_ids are
    # 1 x s whatever the batch, so each layer keeps s bf16 values more than Mistral's layer
    for s, b in ((256, 1), (512, 2)):
        given = spec(s, b)
        mistral = attrs.evolve(given, model=attrs.evolve(
            given.model, source="counted as transformers' MistralForCausalLM"))
        [scaled] = hf_inventory(given, HfRun(attention=attention)).groups
        [plain] = hf_inventory(mistral, HfRun(attention=attention)).groups
        assert scaled.layer_bytes - plain.layer_bytes == 2 * s
    assert FAMILIES["Ministral3ForCausalLM"].query_scale


def test_the_whole_model_is_its_measured_layers_and_outside():
    for attention in ("eager", "sdpa"):
        for s, b in ((256, 1), (512, 2)):
            run = RUNS["main", attention, b, s]
            inventory = hf_inventory(spec(s, b), HfRun(attention=attention))
            assert inventory.total_bytes == run.fixed_bytes + 34 * run.per_layer_bytes
