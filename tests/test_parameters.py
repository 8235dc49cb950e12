"""Parameter counts and FLOPs of each architecture, against published and hand-derived numbers."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.footprint.flops import forward_flops_per_sequence
from llmpar.footprint.parameters import count_parameters

SESSION = llmpar.Session(load_entry_points=False)


def preset(name: str) -> llmpar.Spec:
    spec = {"model": name, "hardware": {"gpu": "h100-sxm"}, "training": {"sequence_length": 512}}
    return SESSION.load_spec(spec).model


@pytest.mark.parametrize(
    ("name", "total"),
    [
        # Totals of the published checkpoints as transformers counts them (tied weights once).
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("mistral-7b", 7_241_732_096),
        ("mixtral-8x7b", 46_702_792_704),
        ("mixtral-8x22b", 140_620_634_112),
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen3-4b", 4_022_468_096),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-30b-a3b", 30_532_122_624),
        ("qwen3-235b-a22b", 235_093_634_560),
        ("gemma-2-9b", 9_241_705_984),
        ("phi-3-mini", 3_821_079_552),
        ("gpt2", 124_439_808),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_preset_totals_match_published_checkpoints(name, total):
    count = count_parameters(preset(name))
    assert count.total == total
    assert sum(count.by_group.values()) == total


@pytest.mark.parametrize(
    ("name", "active"),
    [
        # Active parameters the model names state: A3B, A22B; DeepSeek-V3 "37B activated".
        ("qwen3-30b-a3b", 3_353_032_704),
        ("qwen3-235b-a22b", 22_190_763_520),
        ("deepseek-v3", 37_552_282_624),
        ("mixtral-8x22b", 39_152_031_744),
    ],
)
def test_moe_active_parameters(name, active):
    assert count_parameters(preset(name)).active == active


def test_deepseek_v3_groups_by_hand():
    # DeepSeek-V2 (arXiv:2405.04434) Eqs. 9-13 and 37-38 with DeepSeek-V3's config.json:
    # h 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128.
    h, a = 7168, 128
    mla = (h * 1536 + 1536 + 1536 * a * 192          # q_a_proj, q_a_layernorm, q_b_proj
           + h * (512 + 64) + 512 + 512 * a * 256   # kv_a_proj_with_mqa, kv_a_layernorm, kv_b
           + a * 128 * h)                            # o_proj
    assert mla == 187_107_328
    expert = 3 * h * 2048
    groups = count_parameters(preset("deepseek-v3")).by_group
    assert groups == {
        "embedding": 129_280 * h,
        "attention": 61 * mla,
        "mlp": 3 * 3 * h * 18_432,        # first_k_dense_replace = 3 dense layers
        "experts": 58 * 256 * expert,
        "shared_experts": 58 * expert,
        "router": 58 * 256 * h,           # e_score_correction_bias is a buffer
        "norms": 61 * 2 * h + h,
        "head": 129_280 * h,
    }
    assert sum(groups.values()) == 671_026_404_352


def test_bert_large_as_masked_lm():
    # BertForMaskedLM: 334,092,288 in BertModel without its pooler, and the MLM head's
    # transform (h^2 + h), LayerNorm (2h) and output bias (V); the decoder is tied.
    h, vocab = 1024, 30_522
    groups = count_parameters(preset("bert-large")).by_group
    assert groups["head"] == h * h + h + vocab
    assert groups["norms"] == 24 * 2 * 2 * h + 2 * 2 * h  # blocks, embedding and MLM norms
    assert sum(groups.values()) == 334_092_288 + h * h + h + 2 * h + vocab


def test_pooler_is_its_own_group():
    model = {"preset": "bert-large", "pooler": True, "mlm_head": False}
    spec = SESSION.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 512}})
    groups = count_parameters(spec.model).by_group
    assert groups["pooler"] == 1024 * 1024 + 1024
    assert sum(groups.values()) == 335_141_888  # BertModel with its pooler


def test_norm_placements_and_qk_norm_scopes():
    gemma, olmo, qwen = preset("gemma-2-9b"), preset("olmo-2-7b"), preset("qwen3-8b")
    # Gemma 2: four RMSNorms per block plus the final one; no norm inside attention.
    assert count_parameters(gemma).by_group["norms"] == 42 * 4 * 3584 + 3584
    # OLMo 2: q_norm and k_norm over the whole projections (4096 each: no GQA).
    olmo_groups = count_parameters(olmo).by_group
    assert olmo_groups["attention"] == 32 * (4 * 4096 * 4096 + 2 * 4096)
    assert olmo_groups["norms"] == 32 * 2 * 4096 + 4096
    # Qwen3: one head_dim weight for queries and one for keys, in the attention group.
    assert count_parameters(qwen).by_group["attention"] == 36 * (
        2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128)


def test_gemma2_windows_alternate():
    gemma = preset("gemma-2-9b")
    assert [gemma.is_sliding_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert gemma.sliding_window == 4096
    assert not preset("llama-3-8b").is_sliding_window_layer(0)


def test_mla_widths():
    model = preset("deepseek-v3")
    assert (model.qk_head_dim, model.value_head_dim) == (192, 128)
    assert (model.query_width, model.kv_width, model.value_width) == (128 * 192, 128 * 192,
                                                                      128 * 128)
    assert model.attention_output_width == 128 * 128
    assert model.latent_kv_width == 512 + 64


def test_mla_attention_flops_use_qk_and_v_head_dims():
    # Q.K^T: 2 s^2 a (qk_nope + qk_rope); scores.V: 2 s^2 a v_head_dim; per layer.
    s = 4096
    flops = forward_flops_per_sequence(preset("deepseek-v3"), s)
    assert flops.attention == 2 * s * s * 128 * (192 + 128) * 61
    causal = forward_flops_per_sequence(preset("deepseek-v3"), s, causal=True)
    assert causal.attention == flops.attention / 2


def test_deepseek_v3_projection_flops_count_active_experts():
    h, s = 7168, 1024
    mla = 187_107_328 - 1536 - 512  # matrices only: the latent norms are not matmuls
    expert = 3 * h * 2048
    per_token = (61 * mla + 3 * 3 * h * 18_432
                 + 58 * (8 * expert + expert + 256 * h))  # top-8, shared, router
    flops = forward_flops_per_sequence(preset("deepseek-v3"), s)
    assert flops.projections == 2 * s * per_token
    assert flops.logits == 2 * s * h * 129_280


def test_dense_attention_flops_unchanged():
    # 2 x 2 x s^2 x (heads x head_dim) per layer outside MLA.
    s = 2048
    flops = forward_flops_per_sequence(preset("llama-3-8b"), s)
    assert flops.attention == 2 * 2 * s * s * 4096 * 32


def test_mlm_head_and_pooler_flops():
    s, h = 512, 1024
    bert = preset("bert-large")
    layers = 24 * (4 * h * h + 2 * h * 4096)
    assert forward_flops_per_sequence(bert, s).projections == 2 * s * (layers + h * h)
