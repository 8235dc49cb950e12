"""DeepSeek sparse attention (DeepSeek-V3.2-Exp): the lightning indexer's parameters by hand,
attention over the top-k keys, the indexer's O(s^2) scores at its small width, and the
indexer's key in the serving cache."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.footprint.flops import forward_flops_per_sequence
from llmpar.footprint.parameters import count_parameters

SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h200-sxm"}


def model_of(name: str) -> llmpar.spec.Model:
    return SESSION.load_spec({"model": name, "hardware": GPU}).model


def test_the_indexer_by_hand():
    # DeepseekV32Indexer: wq_b 1536 -> 64 x 128, wk 7168 -> 128, its LayerNorm (weight and
    # bias of 128), weights_proj 7168 -> 64; on each of the 61 layers beside DeepSeek-V3's MLA.
    v32, v3 = model_of("deepseek-v3.2-exp"), model_of("deepseek-v3")
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    ours, theirs = count_parameters(v32).by_group, count_parameters(v3).by_group
    assert ours["attention"] - theirs["attention"] == 61 * indexer
    assert {g: n for g, n in ours.items() if g != "attention"} == {
        g: n for g, n in theirs.items() if g != "attention"}


def test_up_to_top_k_tokens_sparse_attention_is_dense_plus_the_indexer():
    v32, v3 = model_of("deepseek-v3.2-exp"), model_of("deepseek-v3")
    s = 2048  # = top_k: every query keeps every earlier key
    dense, sparse = (forward_flops_per_sequence(m, s) for m in (v3, v32))
    index = 2.0 * s * s * 64 * (128 + 1) * 61
    assert sparse.attention == pytest.approx(dense.attention + index)
    weights = 61 * (1536 * 64 * 128 + 7168 * 128 + 7168 * 64)
    assert sparse.projections - dense.projections == pytest.approx(2.0 * s * weights)


def test_past_top_k_attention_grows_linearly_and_the_indexer_quadratically():
    # MLA over k = 2048 keys a query: O(s k); the indexer over every key: O(s^2).
    v32, v3 = model_of("deepseek-v3.2-exp"), model_of("deepseek-v3")
    s, k = 65536, 2048
    dense, sparse = (forward_flops_per_sequence(m, s, causal=True) for m in (v3, v32))
    kept = (k * (k + 1) / 2 + (s - k) * k) / (s * (s + 1) / 2)
    index = 2.0 * s * s * 64 * 129 * 61 / 2
    assert sparse.attention == pytest.approx(dense.attention * kept + index)
    assert sparse.attention < dense.attention / 3  # 3.8x fewer at 64K tokens


def test_the_cache_keeps_the_indexer_key_beside_the_latent():
    def cache(name: str) -> int:
        plan = SESSION.evaluate({"model": name, "hardware": {**GPU, "num_gpus": 8},
                                 "parallel": {"tensor": {"degree": 8}},
                                 "inference": {"batch_size": 1, "prompt_tokens": 4095,
                                               "generated_tokens": 1, "kv_cache": "bf16"}})
        assert plan.kv_cache_bytes is not None
        return plan.kv_cache_bytes
    # per token and layer: 512 + 64 (MLA's latent and rope key) + 128 (the index key)
    assert cache("deepseek-v3.2-exp") == 4096 * 61 * (512 + 64 + 128) * 2
    assert cache("deepseek-v3") == 4096 * 61 * (512 + 64) * 2


def test_sparse_attention_needs_the_query_latent():
    spec = {"model": {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
                      "ffn_hidden_size": 1024, "vocab_size": 1000,
                      "sparse_attention": {"top_k": 64}}, "hardware": GPU}
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec(spec)
    assert "$.model.sparse_attention" in [p.path for p in caught.value.problems]
