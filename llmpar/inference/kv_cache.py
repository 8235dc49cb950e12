"""The key/value cache: what each token keeps per layer, and how the layout splits it.

Per token and layer (DeepSeek-V2, arXiv:2405.04434, Table 1):
- multi-head, grouped-query and multi-query attention keep a key and a value of
  head_dim for each of num_kv_heads heads: 2 * n_kv * d_h elements (n_kv = heads: MHA,
  fewer: GQA, Ainslie et al. 2023, arXiv:2305.13245; one: MQA, Shazeer 2019,
  arXiv:1911.02150);
- multi-head latent attention keeps the compressed latent and the decoupled RoPE key,
  shared by all heads: kv_lora_rank + qk_rope_head_dim elements (Sec. 2.1.2); with
  DeepSeek sparse attention also the lightning indexer's key of index_head_dim
  (DeepSeek-V3.2-Exp report, Sec. 2.1), here in the cache's format (DeepSeek's kernels
  keep it in fp8 with a scale per token).
Tensor parallelism splits the KV heads; past t > n_kv each rank keeps one head (vLLM and
Megatron-Core replicate KV heads). MLA's latent is one head: every tensor rank keeps all of
it (SGLang's DeepSeek docs: data-parallel attention exists to avoid this duplication).
Pipeline stages keep their layers' caches; context parallelism splits the tokens.
A recurrent layer (gated DeltaNet, Mamba-2) keeps no tokens but a fixed-size state per
sequence: its recurrent state and the last kernel - 1 inputs of its convolution (vLLM's
Mamba-2 and gated DeltaNet state: ssm and conv state; transformers' cache the same),
split by heads over the tensor ranks, held in the cache's format.
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
        # DeepSeek sparse attention caches the indexer's key beside MLA's latent
        index = 0 if model.sparse_attention is None else model.sparse_attention.index_head_dim
        return float(model.latent_kv_width + index)
    if not model.attends:  # no layer attends (Mamba-2): nothing per token
        return 0.0
    assert model.head_dim is not None
    return 2 * kv_heads_per_rank(model, tensor) * model.head_dim


def kv_bytes_per_token(model: Model, kv_dtype: str, tensor: int = 1) -> float:
    """Bytes one token keeps in one layer's cache on one tensor rank."""
    return kv_elements_per_token(model, tensor) * bytes_per_element(kv_dtype)


RECURRENT = 0
"""The window of a recurrent layer in `layer_windows`: no token kept, a state instead."""


def state_elements_per_sequence(model: Model, tensor: int = 1) -> float:
    """Elements one sequence keeps in one recurrent layer on one tensor rank: gated
    DeltaNet's key_head_dim x value_head_dim per value head and its convolution's last
    kernel - 1 inputs of queries, keys and values; Mamba-2's head_dim x state_size per head
    and the last kernel - 1 inputs of x, B and C (B and C of a group on every rank that
    shares it)."""
    linear, mamba = model.linear_attention, model.mamba
    if model.recurrent_mixer == "linear_attention" and linear is not None:
        state = linear.num_value_heads * linear.key_head_dim * linear.value_head_dim
        return (state + (linear.conv_kernel_size - 1) * linear.conv_width) / tensor
    if mamba is None:
        return 0.0
    ssm = mamba.num_heads * mamba.head_dim * mamba.state_size / tensor
    groups = max(1.0, mamba.num_groups / tensor)
    conv = mamba.inner_width / tensor + 2 * groups * mamba.state_size
    return ssm + (mamba.conv_kernel_size - 1) * conv


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
    if model.mixer_pattern is not None:  # no windows beside recurrent layers (checked)
        # a parallel hybrid layer (attention+mamba) keeps both its tokens and its state
        mixers = model.mixers_in(layers.start, len(layers))
        found = {None: mixers.get("attention", 0),
                 RECURRENT: sum(n for kind, n in mixers.items() if kind != "attention")}
        return tuple((window, number) for window, number in found.items() if number)
    honoured = inference.sliding_window is not False
    for (_moe, windowed), number in model.layer_kinds_in(layers.start, len(layers)).items():
        window = model.sliding_window if windowed and honoured else None
        counts[window] = counts.get(window, 0) + number
    return tuple(counts.items())


def kv_cache_bytes(model: Model, inference: Inference, layout: Layout, layers: range,
                   batch: int, tokens: int,
                   windows: tuple[tuple[int | None, int], ...] | None = None) -> int:
    """The cache of `batch` sequences of `tokens` each, in `layers` (counted by window in
    `windows` when given), on one GPU; with the recurrent layers' states."""
    tensor = layout.degree("tensor")
    per_token = kv_bytes_per_token(model, inference.kv_cache, tensor)
    counted = layer_windows(model, inference, layers) if windows is None else windows
    return windowed_cache_bytes(per_token, recurrent_state_bytes(model, inference, tensor,
                                                                 counted),
                                inference, layout.degree("context"), counted, batch, tokens)


def recurrent_state_bytes(model: Model, inference: Inference, tensor: int,
                          windows: tuple[tuple[int | None, int], ...]) -> float:
    """One sequence's state in one recurrent layer on one tensor rank, in the cache's
    format; 0 when none of `windows` is recurrent."""
    if not any(window == RECURRENT for window, _ in windows):
        return 0.0
    return bytes_per_element(inference.kv_cache) * state_elements_per_sequence(model, tensor)


def windowed_cache_bytes(per_token_bytes: float, state_bytes_per_sequence: float,
                         inference: Inference, context: int,
                         windows: tuple[tuple[int | None, int], ...], batch: int,
                         tokens: int) -> int:
    """`kv_cache_bytes` from one token's bytes per layer, one sequence's recurrent state
    per layer, and the layers by window."""
    held = sum(count * cached_tokens(tokens, window, inference.kv_block_tokens, context)
               for window, count in windows if window != RECURRENT)
    total = per_token_bytes * batch * held
    recurrent = sum(count for window, count in windows if window == RECURRENT)
    if recurrent:
        total += recurrent * batch * state_bytes_per_sequence
    return round(total)
