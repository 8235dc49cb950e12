"""The hf-eager, hf-sdpa and fused activation models: against the bytes measured on
real Hugging Face transformers models (validation/data, written by
validation/measure_hf.py with torch 2.13.0 and transformers 5.24.0 on the CPU), and
their tensors' tags."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from inventories import assert_split_tags
from validation_scripts import load_script

import llmpar
from llmpar.footprint.activation_models import (
    ACTIVATION_MODELS,
    ActivationUnavailable,
    coefficient,
    korthikanti,
)
from llmpar.footprint.activations.hf import Dropout, HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "validation" / "data"
TOLERANCE = 0.03


def _runs():
    for path in M.data_files(DATA):
        data = M.load(path)
        for run in M.measured_runs(data):
            yield pytest.param(path, run, id=run.label)


@pytest.mark.parametrize(("path", "run"), list(_runs()))
def test_hf_models_match_the_measured_bytes(path, run):
    comparison = M.compare(M.load(path), run, ROOT)
    if comparison.per_layer_error is not None:
        assert abs(comparison.per_layer_error) <= TOLERANCE, (
            f"per layer: predicted {comparison.per_layer_bytes:,.0f}, "
            f"measured {run.per_layer_bytes:,}")
    for layers, error in comparison.total_errors.items():
        assert abs(error) <= TOLERANCE, (
            f"{layers} layers: predicted {comparison.total_bytes[layers]:,.0f}, "
            f"measured {run.total_bytes[layers]:,}")


def spec(model, s=256, b=1, activation_model="hf-eager", **training):
    return llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                             "training": {"sequence_length": s, "micro_batch_size": b,
                                          "activation_model": activation_model, **training}})


def per_layer(inventory):
    (group,) = inventory.groups
    return group.layer_bytes


# Measured with torch 2.13.0 / transformers 5.24.0 (CPU, bf16), validation/data: bytes
# saved per layer, as 2-layer minus 1-layer runs.
LLAMA_3_8B = {("eager", 1, 256): 67_110_912, ("sdpa", 1, 256): 51_415_040,
              ("eager", 2, 512): 318_775_296, ("sdpa", 2, 128): 51_415_040}
GPT2 = {("eager", 1, 256): 12_584_960, ("sdpa", 1, 256): 11_024_384,
        ("eager", 2, 512): 56_631_296, ("sdpa", 2, 512): 44_097_536}
GPT2_DROPOUT_0_1 = {("eager", 1, 256): 16_517_120, ("sdpa", 1, 256): 22_415_360,
                    ("eager", 2, 128): 14_157_824, ("sdpa", 2, 512): 127_410_176}


@pytest.mark.parametrize(("key", "measured"), LLAMA_3_8B.items())
def test_llama_3_8b_layer_is_exact(key, measured):
    attention, b, s = key
    inventory = ACTIVATION_MODELS[f"hf-{attention}"](spec("llama-3-8b", s, b))
    assert per_layer(inventory) == measured


def test_llama_3_8b_eager_layer_is_the_mechanism():
    # Per token: two RMSNorms (fp32 input 4h, fp32 rsqrt 4, normalized 2h), the Q/K/V
    # input 2h, Q and K, V expanded to every head by repeat_kv (3 x 2ad), the fp32 softmax
    # and its bf16 copy (6as), the o_proj and MLP inputs (4h), SwiGLU's four tensors (8f).
    h, a, d, f, s = 4096, 32, 128, 14336, 256
    expected = s * (2 * (6 * h + 4) + 2 * h + 3 * 2 * a * d + 6 * a * s + 4 * h + 8 * f)
    assert per_layer(hf_inventory(spec("llama-3-8b", s), HfRun())) == expected == 67_110_912


@pytest.mark.parametrize(("key", "measured"), GPT2.items())
def test_gpt2_layer_is_exact(key, measured):
    attention, b, s = key
    assert per_layer(hf_inventory(spec("gpt2", s, b), HfRun(attention=attention))) == measured


@pytest.mark.parametrize(("key", "measured"), GPT2_DROPOUT_0_1.items())
def test_gpt2_dropout_masks_and_the_sdpa_math_fallback(key, measured):
    # With dropout, CPU SDPA falls back to its math path: fp32 Q, K, V, scores and masks.
    attention, b, s = key
    run = HfRun(attention=attention, dropout=Dropout(attention=0.1, hidden=0.1, embedding=0.1))
    assert per_layer(hf_inventory(spec("gpt2", s, b), run)) == measured


def test_outside_the_layers_llama_3_8b():
    # Final RMSNorm, lm_head input, fp32 log-probabilities, the shifted labels (their
    # padded storage of s + 1 ids when b = 1), nll_loss's total_weight, RoPE cos and sin
    # (s x d_head each), and the input ids: 139,856,908 + 2,048 measured.
    inventory = hf_inventory(spec("llama-3-8b"), HfRun())
    assert inventory.fixed_bytes == 139_856_908 + 2_048


def test_fused_llama_3_8b_layer():
    # Fused norms keep input and fp32 rstd; flash attention Q, K, V (8 KV heads), O and
    # the fp32 log-sum-exp; SwiGLU its two inputs; fc2 its input.
    h, a, kv, d, f, s = 4096, 32, 8, 128, 14336, 4096
    expected = s * (2 * (2 * h + 4) + 2 * h + 2 * a * d + 2 * 2 * kv * d + 4 * a + 2 * a * d
                    + 2 * h + 2 * 2 * f + 2 * f)
    inventory = ACTIVATION_MODELS["fused"](spec("llama-3-8b", s, activation_model="fused"))
    assert per_layer(inventory) == expected
    assert not inventory.has_attention_scores


def test_fused_loss_keeps_no_fp32_logits():
    inventory = ACTIVATION_MODELS["fused"](spec("llama-3-8b", 4096))
    s, v = 4096, 128_256
    logits = [t for t in inventory.fixed if t.shape_text == "b x s x V"]
    assert [t.bytes for t in logits] == [2 * s * v]


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3-4b", "mixtral-8x7b", "deepseek-v3",
                                   "gemma-2-9b", "gpt2", "bert-large", "olmo-2-7b",
                                   "phi-3-mini", "qwen3-30b-a3b"])
@pytest.mark.parametrize("name", ["hf-eager", "hf-sdpa", "fused"])
def test_every_tensor_is_tagged(model, name):
    try:
        inventory = ACTIVATION_MODELS[name](spec(model, 512))
    except ActivationUnavailable as exc:
        assert "soft-capping" in str(exc) and name == "hf-sdpa"
        return
    for group in inventory.groups:
        for t in group.tensors:
            assert_split_tags(t)
            assert t.placement == ""
    for t in inventory.fixed:
        assert t.placement in ("embedding", "head", ""), t.name
    kinds = {g.kind for g in inventory.groups}
    assert ("moe" in kinds) == (spec(model, 512).model.moe is not None)


def test_selective_recomputation_drops_the_eager_scores():
    eager = llmpar.evaluate(spec("llama-3-8b", 256, recompute="selective"))
    sdpa = llmpar.evaluate(spec("llama-3-8b", 256, activation_model="hf-sdpa"))
    per_token = 67_110_912 // 256 - 6 * 32 * 256
    rows = [r for r in eager.activation_tensors if r.per_layer]
    assert sum(r.bytes for r in rows) == 256 * per_token
    assert sdpa.activations_bytes < llmpar.evaluate(spec("llama-3-8b", 256)).activations_bytes


def test_gemma_2_soft_capping_has_no_sdpa_estimate():
    plan = llmpar.evaluate(spec("gemma-2-9b", activation_model="hf-sdpa"))
    assert plan.activations_bytes is None
    assert any("soft-capping" in w for w in plan.warnings)


def test_old_import_path_and_the_defaults():
    """The default profile (megatron-core, Transformer Engine's cuDNN attention) keeps no
    scores; its legacy profile keeps Korthikanti et al.'s accounting."""
    assert ACTIVATION_MODELS["korthikanti"] is korthikanti
    assert ACTIVATION_MODELS["coefficient"] is coefficient
    table = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}}
    assert llmpar.load_spec(table).training.activation_model == "fused"
    legacy = {**table, "training": {"framework": "megatron-core-legacy"}}
    assert llmpar.load_spec(legacy).training.activation_model == "korthikanti"


# Mixtral 8x7B (validation/data/mixtral-8x7b.json, torch 2.13.0 / transformers 5.24.0, CPU,
# bf16): bytes per layer, 2-layer minus 1-layer runs, and the 1-layer total of the experts'
# eager loop (measured at b = 1, s = 256 only), without the input ids.
MIXTRAL = {("eager", "grouped_mm", 1, 256): 104_889_376,
           ("eager", "grouped_mm", 2, 512): 469_889_056,
           ("sdpa", "grouped_mm", 1, 128): 44_596_768,
           ("sdpa", "grouped_mm", 2, 512): 356_773_920}


@pytest.mark.parametrize(("key", "measured"), MIXTRAL.items())
def test_mixtral_moe_layer_is_exact(key, measured):
    # Router (fp32 softmax, top-2 indices, in-place renormalization), b*s*2 token copies
    # sorted by expert with their three int64 permutations, grouped_mm's int32 offsets.
    attention, experts, b, s = key
    inventory = hf_inventory(spec("mixtral-8x7b", s, b), HfRun(attention=attention,
                                                                 experts=experts))
    (group,) = inventory.groups
    assert group.kind == "moe"
    assert group.layer_bytes == measured


def test_mixtral_experts_eager_loop():
    model = {"preset": "mixtral-8x7b", "num_layers": 1}
    inventory = hf_inventory(spec(model), HfRun(experts="eager"))
    assert inventory.total_bytes - 8 * 256 == 150_370_316


# DeepSeek-V3 with every measured layer an MoE layer of 32 routed experts
# (validation/data/deepseek-v3.json, variant moe_layers, torch 2.13.0 / transformers 5.24.0,
# CPU, bf16): the 1-layer model's bytes, without the input ids.
DEEPSEEK_V3_ONE_MOE_LAYER = {("eager", 1, 128): 180_056_204, ("eager", 2, 512): 1_708_753_028,
                             ("sdpa", 1, 256): 393_666_700, ("sdpa", 2, 128): 376_856_708}


@pytest.mark.parametrize(("key", "measured"), DEEPSEEK_V3_ONE_MOE_LAYER.items())
def test_deepseek_v3_mla_and_moe_layer(key, measured):
    # MLA keeps both latents' norms and inputs, Q and K built per head, and V as a view of
    # kv_b_proj's output; SDPA falls back to its fp32 math path (value head 128 != 192).
    # The router's group-limited top-k yields only indices, which autograd frees.
    attention, b, s = key
    model = {"preset": "deepseek-v3", "num_layers": 1,
             "moe": {"num_experts": 32, "dense_layers": 0}}
    inventory = hf_inventory(spec(model, s, b), HfRun(attention=attention))
    assert [g.kind for g in inventory.groups] == ["moe"]
    assert inventory.total_bytes - 8 * b * s == measured


def test_the_activation_validation_page_is_current():
    """docs/validation.md is what validation/report_activations.py prints today (the
    page's last line links the plot the script draws when matplotlib is installed)."""
    report = load_script("report_activations")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert report.main(["--no-png"]) == 0
    plot_line = "\n![predicted against measured bytes per layer](validation-activations.png)\n"
    page = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert page == printed.getvalue() + plot_line, (
        "regenerate: python validation/report_activations.py > docs/validation.md")
