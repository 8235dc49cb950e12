"""Parameter counts, FLOPs and activations against published numbers."""

from __future__ import annotations

import pytest

import llmpar

GPU = {"gpu": "h100-sxm"}


def plan_for(model, **training):
    return llmpar.evaluate({"model": model, "hardware": GPU, "training": training})


@pytest.mark.parametrize(
    ("preset", "parameters"),
    [
        # Counts of the published checkpoints, as Hugging Face reports them.
        ("llama-2-7b", 6_738_415_616),
        ("llama-2-70b", 68_976_648_192),
        ("qwen3-4b", 4_022_468_096),
        ("mixtral-8x7b", 46_702_792_704),
    ],
)
def test_parameter_counts_match_published_checkpoints(preset, parameters):
    plan = plan_for(preset)
    assert plan.parameters == parameters
    assert sum(plan.parameters_by_group.values()) == parameters


def test_gpt3_175b_has_175b_parameters():
    # Brown et al. 2020, Table 2.1 lists 175.0B.
    assert plan_for("gpt-3-175b").parameters == pytest.approx(175.0e9, rel=0.005)


KORTHIKANTI = {"activation_model": "korthikanti"}
"""Korthikanti et al.'s accounting (Megatron-LM's unfused attention), which these tests
check on purpose; the default profile's fused attention keeps no scores."""
GPT_BLOCK = {"num_layers": 1, "hidden_size": 2048, "num_attention_heads": 16,
             "ffn_hidden_size": 8192, "ffn_activation": "gelu", "vocab_size": 50304,
             "norm": "layernorm", "position_embedding": "learned",
             "max_position_embeddings": 4096, "linear_bias": True}


@pytest.mark.parametrize(("s", "b"), [(2048, 1), (4096, 2), (1024, 8)])
def test_korthikanti_gpt_layer_is_34_plus_5as_over_h(s, b):
    # Korthikanti et al. 2022 (arXiv:2205.05198), Eq. 1: s*b*h*(34 + 5*a*s/h) bytes.
    h, a = GPT_BLOCK["hidden_size"], GPT_BLOCK["num_attention_heads"]
    plan = plan_for(GPT_BLOCK, sequence_length=s, micro_batch_size=b, **KORTHIKANTI)
    per_layer = sum(row.bytes for row in plan.activation_tensors if row.per_layer)
    assert per_layer == s * b * h * (34 + 5 * a * s / h)


@pytest.mark.parametrize(("s", "b"), [(2048, 1), (4096, 2)])
def test_korthikanti_recomputation(s, b):
    h = GPT_BLOCK["hidden_size"]
    selective = plan_for(GPT_BLOCK, sequence_length=s, micro_batch_size=b,
                         recompute="selective", **KORTHIKANTI)
    full = plan_for(GPT_BLOCK, sequence_length=s, micro_batch_size=b, recompute="full",
                    **KORTHIKANTI)
    # Sec. 5: selective keeps 34 sbh per layer; full keeps the 2 sbh layer input.
    assert sum(r.bytes for r in selective.activation_tensors if r.per_layer) == 34 * s * b * h
    assert sum(r.bytes for r in full.activation_tensors if r.per_layer) == 2 * s * b * h


def test_korthikanti_outside_layers_terms():
    # Token ids (int64), embedding dropout mask, final norm and output layer inputs,
    # fp32 logits: Megatron-LM theoretical_memory_usage.py, Korthikanti et al. Sec. 4.3.
    s, b, h, v = 2048, 1, GPT_BLOCK["hidden_size"], GPT_BLOCK["vocab_size"]
    plan = plan_for(GPT_BLOCK, sequence_length=s, micro_batch_size=b, **KORTHIKANTI)
    outside = sum(r.bytes for r in plan.activation_tensors if not r.per_layer)
    assert outside == 8 * s * b + s * b * h + 4 * s * b * h + 4 * s * b * v


def test_flops_match_narayanan_formula_for_gpt_blocks():
    # Narayanan et al. 2021 (arXiv:2104.04473), Eq. 3 without recomputation:
    # 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).
    model = {**GPT_BLOCK, "num_layers": 24}
    s, batch = 2048, 16
    plan = llmpar.evaluate({"model": model, "hardware": {**GPU, "num_gpus": 16},
                            "training": {"sequence_length": s, "global_batch_size": batch}})
    h, L, V = model["hidden_size"], model["num_layers"], model["vocab_size"]
    expected = 72 * batch * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert plan.flops_per_step == pytest.approx(expected, rel=1e-12)


def test_full_recompute_adds_one_forward_in_hardware_flops():
    # Narayanan et al. 2021, Eq. 3 with recomputation: 96 B s L h^2 (1 + s/(6h) + V/(16 L h))
    # counts the recomputed forward of the layers but not of the output layer.
    model = {**GPT_BLOCK, "num_layers": 24}
    s = 2048
    # (the full s x s square: Megatron-LM's unfused attention, as Narayanan et al. ran it)
    plan = plan_for(model, sequence_length=s, recompute="full", mfu=0.5, **KORTHIKANTI)
    h, L, V = model["hidden_size"], model["num_layers"], model["vocab_size"]
    expected = 96 * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert plan.hardware_flops_per_step == pytest.approx(expected, rel=1e-12)
    assert plan.hfu == pytest.approx(plan.mfu * plan.hardware_flops_per_step
                                     / plan.flops_per_step)


def test_causal_convention_halves_attention_score_flops():
    full = plan_for("llama-2-7b", sequence_length=4096)
    causal = plan_for("llama-2-7b", sequence_length=4096, attention_flops="causal")
    attention = 3 * 2 * 2 * 4096 * 4096 * 4096 * 32  # 3 passes x 2 matmuls x 2s^2 * a*d_head * L
    assert full.flops_per_step - causal.flops_per_step == pytest.approx(attention / 2)


def test_size_only_model_has_no_activation_estimate_and_says_so():
    plan = plan_for({"parameters": 7e9})
    assert plan.activations_bytes is None
    assert any("no activation estimate" in warning for warning in plan.warnings)
    assert plan.total_bytes == 16 * 7 * 10**9


def test_selective_recompute_reruns_only_the_attention_matmuls():
    # Korthikanti et al. 2022, Sec. 5: for GPT-3 175B at s = 2048 the overhead is 2.7%.
    none = plan_for("gpt-3-175b", sequence_length=2048, mfu=0.5, **KORTHIKANTI)
    selective = plan_for("gpt-3-175b", sequence_length=2048, mfu=0.5, recompute="selective",
                         **KORTHIKANTI)
    overhead = selective.hardware_flops_per_step / none.hardware_flops_per_step - 1
    assert overhead == pytest.approx(0.027, abs=0.002)


def test_moe_active_parameters_count_only_routed_experts():
    plan = plan_for("mixtral-8x7b", sequence_length=4096)
    expert = 3 * 4096 * 14336
    assert plan.parameters - plan.active_parameters == 32 * (8 - 2) * expert
    assert plan.flops_per_step_6nd == 6 * plan.active_parameters * 4096
