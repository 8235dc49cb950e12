"""Hypothesis strategies for valid specs, as plain tables the loader accepts."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GPUS = ("v100-sxm2-16gb", "a100-sxm-80gb", "h100-sxm", "b300")


@st.composite
def architectures(draw: st.DrawFn) -> dict[str, Any]:
    """A consistent transformer architecture (heads divide, kv heads divide heads)."""
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    group = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * group
    return {
        "num_layers": draw(st.integers(1, 96)),
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn_hidden_size": draw(st.integers(1, 64)) * 256,
        "ffn_activation": draw(st.sampled_from(["gelu", "relu", "swiglu", "geglu"])),
        "vocab_size": draw(st.integers(1000, 260_000)),
        "tie_embeddings": draw(st.booleans()),
        "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "qkv_bias": draw(st.booleans()),
        "qk_norm": draw(st.booleans()),
    }


@st.composite
def training_specs(draw: st.DrawFn, model: Any = None) -> dict[str, Any]:
    """A whole run spec on one or more GPUs, data parallel."""
    num_gpus = draw(st.sampled_from([1, 2, 8, 64]))
    micro_batch = draw(st.integers(1, 8))
    accumulation = draw(st.integers(1, 4))
    return {
        "model": draw(architectures()) if model is None else model,
        "hardware": {"gpu": draw(st.sampled_from(GPUS)), "num_gpus": num_gpus},
        "optimizer": draw(st.sampled_from(["adam", "adam-fp32", "sgd-momentum"])),
        "training": {
            "sequence_length": draw(st.sampled_from([128, 512, 2048, 4096, 8192])),
            "micro_batch_size": micro_batch,
            "global_batch_size": micro_batch * num_gpus * accumulation,
            "mfu": draw(st.floats(0.05, 1.0)),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "activation_model": draw(st.sampled_from(["korthikanti", "coefficient"])),
            "tokens": draw(st.floats(1e9, 1e13)),
        },
    }
