"""The key/value cache: what each token keeps per layer, and how the layout splits it.

Per token and layer (DeepSeek-V2, arXiv:2405.04434, Table 1):
- multi-head, grouped-query and multi-query attention keep a key and a value of
  head_dim for each of num_kv_heads heads: 2 * n_kv * d_h elements (n_kv = heads: MHA,
  fewer: GQA, Ainslie et al. 2023, arXiv:2305.13245; one: MQA, Shazeer 2019,
  arXiv:1911.02150);
- multi-head latent attention keeps the compressed latent and the decoupled RoPE key,
  shared by all heads: kv_lora_rank + qk_rope_head_dim elements (Sec. 2.1.2).
Tensor parallelism splits the KV heads; past t > n_kv each rank keeps one head (vLLM and
Megatron-Core replicate KV heads). MLA's latent is one head: every tensor rank keeps all of
it (SGLang's DeepSeek docs: data-parallel attention exists to avoid this duplication).
Pipeline stages keep their layers' caches; context parallelism splits the tokens.
A paged cache allocates whole blocks (Kwon et al. 2023, PagedAttention, arXiv:2309.06180,
Sec. 4.1; vLLM's block_size); a windowed layer keeps its last sliding_window tokens.
"""

from __future__ import annotations

from llmpar.dtypes import bytes_per_element
from llmpar.spec import Model
from llmpar.spec.inference import Inference
from llmpar.strategy import Layout


def kv_heads_per_rank(model: Model, tensor: int) -> float:
    """KV heads one tensor rank keeps: n_kv / t, at least one (replicated past t > n_kv)."""
    assert model.num_kv_heads is not None
    return max(1.0, model.num_kv_heads / tensor)


def kv_elements_per_token(model: Model, tensor: int = 1) -> float:
    """Elements one token keeps in one layer's cache on one tensor rank."""
    if model.latent_kv_width is not None:
        return float(model.latent_kv_width)
    assert model.head_dim is not None
    return 2 * kv_heads_per_rank(model, tensor) * model.head_dim


def kv_bytes_per_token(model: Model, kv_dtype: str, tensor: int = 1) -> float:
    """Bytes one token keeps in one layer's cache on one tensor rank."""
    return kv_elements_per_token(model, tensor) * bytes_per_element(kv_dtype)


def layer_window(model: Model, inference: Inference, index: int) -> int | None:
    """The tokens layer `index` keeps: the model's window when honoured, else None (all)."""
    if inference.sliding_window is False or not model.is_sliding_window_layer(index):
        return None
    return model.sliding_window


def cached_tokens(tokens: int, window: int | None, block: int | None, context: int) -> int:
    """Tokens one context rank keeps for one sequence in one layer, in whole blocks."""
    held = tokens if window is None else min(tokens, window)
    per_rank = -(-held // context)
    if block is None:
        return per_rank
    return -(-per_rank // block) * block


def layer_windows(model: Model, inference: Inference,
                  layers: range) -> tuple[tuple[int | None, int], ...]:
    """How many of `layers` (consecutive) keep each window (None: every token), counted
    in closed form (`Model.layer_kinds_in`)."""
    counts: dict[int | None, int] = {}
    honoured = inference.sliding_window is not False
    for (_moe, windowed), number in model.layer_kinds_in(layers.start, len(layers)).items():
        window = model.sliding_window if windowed and honoured else None
        counts[window] = counts.get(window, 0) + number
    return tuple(counts.items())


def kv_cache_bytes(model: Model, inference: Inference, layout: Layout, layers: range,
                   batch: int, tokens: int,
                   windows: tuple[tuple[int | None, int], ...] | None = None) -> int:
    """The cache of `batch` sequences of `tokens` each, in `layers` (counted by window in
    `windows` when given), on one GPU."""
    per_token = kv_bytes_per_token(model, inference.kv_cache, layout.degree("tensor"))
    counted = layer_windows(model, inference, layers) if windows is None else windows
    return windowed_cache_bytes(per_token, inference, layout.degree("context"), counted,
                                batch, tokens)


def windowed_cache_bytes(per_token_bytes: float, inference: Inference, context: int,
                         windows: tuple[tuple[int | None, int], ...], batch: int,
                         tokens: int) -> int:
    """`kv_cache_bytes` from one token's bytes per layer and the layers by window."""
    held = sum(count * cached_tokens(tokens, window, inference.kv_block_tokens, context)
               for window, count in windows)
    return round(per_token_bytes * batch * held)
