"""Small specs whose layout spaces are searched in a second (shared by test_search*)."""

from __future__ import annotations

from typing import Any

SMALL_MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
               "ffn_hidden_size": 1024, "ffn_activation": "swiglu", "vocab_size": 1000}
"""Four layers, so that every pipeline degree up to 4 splits them evenly."""

MOE_MODEL = {**SMALL_MODEL, "moe": {"num_experts": 4, "experts_per_token": 2,
                                    "expert_ffn_hidden_size": 256, "dense_layers": 1}}


def small_spec(num_gpus: int = 8, **sections: Any) -> dict[str, Any]:
    """A tiny model on A100s (whose step time is modelled), a fixed global batch, and
    a narrowed space; `sections` replace whole tables."""
    spec: dict[str, Any] = {
        "model": SMALL_MODEL,
        "hardware": {"cluster": "dgx-a100", "num_gpus": num_gpus, "gpus_per_node": 4},
        "training": {"sequence_length": 512, "global_batch_size": 24},
        "search": {"micro_batch_sizes": [1, 2], "recompute": ["none", "full"]},
    }
    spec.update(sections)
    return spec
