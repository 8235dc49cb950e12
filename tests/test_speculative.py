"""Speculative decoding with draft heads (`[inference.speculative]`): the tokens a step
yields (Leviathan et al. 2023, Eq. 1), the head's weights and cache by hand, and TPOT as
verify + draft steps over those tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmpar
from llmpar.inference.speculative import expected_tokens
from llmpar.spec.inference import Speculative

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
LLAMA_70B = str(EXAMPLES / "inference-llama-2-70b-h100.toml")
DEEPSEEK = str(EXAMPLES / "inference-deepseek-v3-h200.toml")


def speculate(spec=LLAMA_70B, batch=1, **speculative):
    return llmpar.evaluate(spec, {"inference.batch_size": batch,
                                  "inference.speculative": speculative})


@pytest.mark.parametrize(("k", "alpha", "tokens"), [
    (3, 0.5, 1.875),        # 1 + 0.5 + 0.25 + 0.125
    (1, 0.85, 1.85),        # DeepSeek-V3's one MTP token at 85% acceptance
    (4, 1.0, 5.0),          # every proposal accepted: k + 1
    (2, 0.1, 1.11),
])
def test_expected_tokens_per_step(k, alpha, tokens):
    assert expected_tokens(Speculative(draft_tokens=k, acceptance_rate=alpha)) == \
        pytest.approx(tokens, rel=1e-12)


def test_the_head_adds_one_layer_of_weights_and_cache_on_each_gpu():
    # Llama-2-70B under TP8: one layer is 2 x 8192^2 + 2 x 8192 x 1024 attention and
    # 3 x 8192 x 28672 MLP weights split eight ways, plus its two 8192-wide norms and the
    # head's final norm on every GPU.
    plain = llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 1})
    plan = speculate(draft_tokens=3, acceptance_rate=0.8)
    layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) * 2 // 8 + 3 * 8192 * 2
    assert plan.weights_bytes - plain.weights_bytes == layer
    assert plan.kv_cache_bytes == plain.kv_cache_bytes * 81 // 80


def test_tpot_is_verify_and_draft_steps_over_the_expected_tokens():
    plain = llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 1}).tpot_seconds
    tpots = [speculate(draft_tokens=3, acceptance_rate=a).tpot_seconds
             for a in (0.01, 0.5, 0.8, 0.95)]
    assert tpots == sorted(tpots, reverse=True)
    # Nothing accepted: each token costs a verify step and three draft steps, more than a
    # plain step; at batch 1 the verify step reads the same weights as a plain one.
    assert tpots[0] > plain
    assert tpots[-1] < plain / 2
    plan = speculate(draft_tokens=3, acceptance_rate=0.8)
    decode = plan.phases[1]
    assert decode.seconds >= decode.floor_seconds
    derivation = plan.derivation("tpot_seconds")
    assert derivation.inputs["expected_tokens_per_step"] == pytest.approx(
        (1 - 0.8 ** 4) / 0.2)
    assert "Leviathan" in derivation.source


def test_deepseek_mtp_head_is_an_moe_layer():
    plain = llmpar.evaluate(DEEPSEEK)
    plan = llmpar.evaluate(DEEPSEEK, {"inference.speculative": {"draft_tokens": 1,
                                                                 "acceptance_rate": 0.85}})
    added = plan.weights_bytes - plain.weights_bytes
    # About one of its 58 MoE layers' share on a GPU (attention, shared expert, router and
    # the 16 routed experts this GPU holds), less than the average over the 58 with the
    # embedding, output layer and dense layers counted in.
    assert 0.8 * plain.weights_bytes / 58 < added < plain.weights_bytes / 58
    assert plan.tpot_seconds < plain.tpot_seconds


def test_a_pipeline_keeps_the_head_on_its_last_stage():
    spec = {"model": "llama-2-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "inference": {"prompt_tokens": 2048, "generated_tokens": 256},
            "parallel": {"tensor": {"degree": 4}, "pipeline": {"degree": 2}}}
    plain = llmpar.evaluate(spec)
    plan = llmpar.evaluate({**spec, "inference": {**spec["inference"], "speculative": {
        "draft_tokens": 2, "acceptance_rate": 0.7}}})
    # The last stage (output layer and final norm, the peak already) gains the head: a
    # layer over the four tensor ranks and three norms.
    layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) * 2 // 4 + 3 * 8192 * 2
    assert plan.weights_bytes == plain.weights_bytes + layer
    assert plan.peak_stage == plain.peak_stage == 1


def test_speculative_under_continuous_batching_is_warned():
    plan = llmpar.evaluate(LLAMA_70B, {"inference.batch_size": 1,
                                       "inference.concurrency": 8,
                                       "inference.speculative": {"draft_tokens": 2,
                                                                 "acceptance_rate": 0.7}})
    assert any("static batching only" in w for w in plan.warnings)


@pytest.mark.parametrize(("table", "path"), [
    ({"draft_tokens": 0, "acceptance_rate": 0.5}, "$.inference.speculative.draft_tokens"),
    ({"draft_tokens": 2, "acceptance_rate": 1.5}, "$.inference.speculative.acceptance_rate"),
    ({"draft_tokens": 2}, "$.inference.speculative.acceptance_rate"),
    ({"draft_tokens": 2, "acceptance_rate": 0.5, "draft_layers": 0},
     "$.inference.speculative.draft_layers"),
])
def test_bad_speculative_input_names_its_key(table, path):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(LLAMA_70B, {"inference.speculative": table})
    assert [p.path for p in error.value.problems] == [path]


def test_speculative_spec_round_trips():
    spec = llmpar.load_spec(LLAMA_70B, {"inference.speculative": {"draft_tokens": 3,
                                                                  "acceptance_rate": 0.7}})
    assert llmpar.load_spec(llmpar.dump_spec(spec)) == spec


def test_the_shipped_mtp_example_is_the_deepseek_example_with_one_mtp_head():
    shipped = llmpar.evaluate(str(EXAMPLES / "serve-deepseek-v3-mtp-h200.toml"))
    same = speculate(DEEPSEEK, batch=32, draft_tokens=1, acceptance_rate=0.85)
    assert shipped.tpot_seconds == pytest.approx(same.tpot_seconds, rel=1e-12)
    assert shipped.tpot_seconds < llmpar.evaluate(DEEPSEEK).tpot_seconds
    assert shipped.fits
