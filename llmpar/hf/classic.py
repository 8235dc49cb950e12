"""GPT-2 and BERT: learned positions, LayerNorm with biases, biases on every linear layer."""

from __future__ import annotations

from typing import Any

from llmpar.hf.common import plain_activation
from llmpar.hf.config import HfConfig

GPT2_KEYS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")
BERT_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
             "vocab_size", "max_position_embeddings")
BERT_HEADS = ("BertForMaskedLM", "BertLMHeadModel")
"""BERT classes with a language-model head, the only ones counted: no pooler, the MLM
head (dense transform, LayerNorm, output bias) and the decoder tied to the embeddings."""
BERT_NOTE = ": no pooler; the MLM head's transform, LayerNorm and output bias"


def gpt2(config: HfConfig) -> dict[str, Any]:
    """GPT2LMHeadModel: pre-norm blocks, n_inner (default 4 n_embd), tied output layer."""
    hidden = config.integer("n_embd")
    assert hidden is not None
    return {
        "num_layers": config.integer("n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": config.integer("n_head"),
        "ffn_hidden_size": config.integer("n_inner", 4 * hidden),
        "ffn_activation": plain_activation(config, "activation_function", "gelu_new"),
        "vocab_size": config.integer("vocab_size"),
        "tie_embeddings": config.flag("tie_word_embeddings", True),
        "norm": "layernorm",
        "position_embedding": "learned",
        "max_position_embeddings": config.integer("n_positions"),
        "linear_bias": True,
    }


def _bert_class(config: HfConfig) -> str:
    names = config.get("architectures", ["BertForMaskedLM"])
    name: str = names[0] if isinstance(names, list) and names else names
    if name not in BERT_HEADS:
        raise config.error("architectures", f"expected one of {', '.join(BERT_HEADS)}, "
                           f"got {name!r}")
    return name


def bert(config: HfConfig) -> dict[str, Any]:
    """BertForMaskedLM: post-norm blocks, an embedding LayerNorm, token types, the MLM
    head; absolute positions only."""
    _bert_class(config)
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise config.error("position_embedding_type", f"only 'absolute' is supported, "
                           f"got {positions!r}")
    return {
        "num_layers": config.integer("num_hidden_layers"),
        "hidden_size": config.integer("hidden_size"),
        "num_attention_heads": config.integer("num_attention_heads"),
        "ffn_hidden_size": config.integer("intermediate_size"),
        "ffn_activation": plain_activation(config, "hidden_act", "gelu"),
        "vocab_size": config.integer("vocab_size"),
        "type_vocab_size": config.integer("type_vocab_size", 2),
        "tie_embeddings": config.flag("tie_word_embeddings", True),
        "norm": "layernorm",
        "norm_placement": "post",
        "position_embedding": "learned",
        "max_position_embeddings": config.integer("max_position_embeddings"),
        "linear_bias": True,
        "embedding_norm": True,
        "final_norm": False,
        "mlm_head": True,
    }
