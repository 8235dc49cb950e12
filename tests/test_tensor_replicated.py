"""What tensor parallelism keeps whole on every rank: the biases of the row-parallel
projections (added after the reduction) and the learned position and token-type tables
(torch.nn.Embedding beside the vocabulary-parallel token table), as Megatron-Core builds
them (megatron/core/tensor_parallel/layers.py RowParallelLinear; megatron/core/models/
common/embeddings/language_model_embedding.py)."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.strategies.tensor import group_divisors

H, FFN, KV, LAYERS, VOCAB, POSITIONS = 4096, 16384, 1024, 32, 131584, 8192
GPT = {"name": "gpt-7b-gqa", "num_layers": LAYERS, "hidden_size": H,
       "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": FFN,
       "ffn_activation": "gelu", "vocab_size": VOCAB, "norm": "layernorm",
       "position_embedding": "learned", "max_position_embeddings": POSITIONS,
       "linear_bias": True}


def _weights(model: dict, t: int) -> float:
    return llmpar.evaluate({
        "model": model, "hardware": {"gpu": "h100-sxm", "num_gpus": t},
        "training": {"sequence_length": 2048, "global_batch_size": 1, "tokens": 1e9},
        "parallel": {"tensor": {"degree": t}}}).stages[0].weights_bytes


def test_megatron_gpt_rank_holds_its_module_shapes():
    """Megatron-LM's gpt3_7b_tp4_pp1_memory_speed model at tensor degree 4, counted from
    the shapes of one rank's modules: linear_qkv (h x (h + 2 kv)) / 4 and its bias / 4,
    linear_proj h x h / 4 with its whole bias h, linear_fc1 h x 4h / 4 and its bias / 4,
    linear_fc2 4h x h / 4 with its whole bias h, two LayerNorms (2h each) whole; the
    word embeddings and the output layer V x h / 4, the position table 8192 x h whole,
    the final LayerNorm whole. bf16: 2 bytes each."""
    t = 4
    layer = ((H * (H + 2 * KV) + (H + 2 * KV)) / t + H * H / t + H
             + (H * FFN + FFN) / t + FFN * H / t + H + 2 * 2 * H)
    rank = LAYERS * layer + 2 * VOCAB * H / t + POSITIONS * H + 2 * H
    assert rank == 1_713_299_456
    assert _weights(GPT, t) == pytest.approx(2 * rank, rel=1e-12)


NORMS = (2 * LAYERS + 1) * 2 * H
"""The LayerNorms (weight and bias of h), which tensor parallelism never splits."""


def test_without_biases_or_learned_positions_only_the_norms_stay_whole():
    """Rotary positions (rope) and no biases: everything but the norms splits t ways (the
    key/value heads too while t <= kv heads)."""
    plain = {**GPT, "position_embedding": "rope", "linear_bias": False}
    plain.pop("max_position_embeddings")
    for t in (2, 4, 8):
        assert _weights(plain, t) == pytest.approx(
            _weights(plain, 1) / t + 2 * NORMS * (1 - 1 / t), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_what_stays_whole_is_held_once_more_on_every_rank(t):
    """The weights of one rank are the split share of every parameter plus (1 - 1/t) of
    what stays whole: the position table, two biases of h per layer and the norms."""
    whole = POSITIONS * H + LAYERS * 2 * H + NORMS
    assert _weights(GPT, t) == pytest.approx(
        _weights(GPT, 1) / t + 2 * whole * (1 - 1 / t), rel=1e-12)


def test_group_divisors_fall_back_to_the_degree_for_a_model_given_by_size():
    spec = llmpar.Session(load_entry_points=False).load_spec(
        {"model": {"parameters": 7e9}, "hardware": {"gpu": "h100-sxm", "num_gpus": 4},
         "training": {"sequence_length": 2048}})
    assert group_divisors(spec, 4) == {"embedding": 4.0, "attention": 4.0, "mlp": 4.0}


def test_the_legacy_profiles_split_every_tensor_group_by_the_degree():
    """`tensor_whole_parameters = false` (megatron-core-legacy, nemo-legacy: the plans of
    before) divides the position table and the row-parallel biases by t with the rest;
    only the norms stay whole."""
    legacy = {**GPT}

    def weights(t: int) -> float:
        return llmpar.evaluate({
            "model": legacy, "hardware": {"gpu": "h100-sxm", "num_gpus": t},
            "training": {"sequence_length": 2048, "global_batch_size": 1, "tokens": 1e9,
                         "framework": "megatron-core-legacy"},
            "parallel": {"tensor": {"degree": t}}}).stages[0].weights_bytes

    assert weights(4) == pytest.approx(weights(1) / 4 + 2 * NORMS * (1 - 1 / 4), rel=1e-12)
    assert weights(4) < _weights(GPT, 4)
