"""What a norm keeps for backward, by the way transformers writes it."""

from __future__ import annotations

from llmpar.footprint.activations.common import FP32_BYTES, OUTSIDE_TP, saved
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.inventory import SavedTensor


def norm_tensors(ctx: Context, label: str, symbol: str, width: int,
                 splits: frozenset[str] = OUTSIDE_TP, heads: tuple[str, int] | None = None,
                 row_splits: frozenset[str] = OUTSIDE_TP,
                 group: str = "norms") -> list[SavedTensor]:
    """The tensors one norm over `width` channels keeps, per token (and per head when
    `heads` is given: a norm over head_dim, as Qwen3's q_norm/k_norm).

    RMSNorm (Llama, Qwen, Mistral, Phi-3, DeepSeek; OLMo 2; Gemma 2/3) upcasts its input
    to fp32, whose copy pow and mul keep, and keeps the rsqrt per row; then the
    normalized x in the activations' dtype (Llama: weight * x_hat.to(dtype)) or in fp32
    (OLMo 2: (weight * x_hat).to(dtype); Gemma: x_hat * (1 + weight.float()), which also
    keeps the fp32 (1 + weight); Nemotron-H: (weight.float() * x_hat).to(dtype), which
    keeps the weight's fp32 copy); that normalized x is kept only for the weight's
    gradient (the product saves an operand only where the other one requires a
    gradient), so a frozen norm (its weight in parameter group `group`) does not keep
    it. LayerNorm (GPT-2, BERT) is ATen's native_layer_norm:
    its input, and mean and rstd per row, in the input's dtype on the CPU (fp32 on CUDA).
    Source: the RMSNorm/LayerNorm modules of transformers 5.24, as measured.
    """
    s = ctx.sizes
    full = (*s.tokens, heads, (symbol, width // heads[1])) if heads else s.per_token(symbol,
                                                                                  width)
    rows = (*s.tokens, heads) if heads else s.tokens
    family = ctx.family.norm
    if family == "layernorm":
        return [
            saved(f"{label} input", "kept by native_layer_norm for backward", full, ctx.d,
                  splits),
            saved(f"{label} mean", "per-row mean (input dtype on the CPU)", rows, ctx.d,
                  row_splits),
            saved(f"{label} rstd", "per-row 1/std (input dtype on the CPU)", rows, ctx.d,
                  row_splits),
        ]
    normalized_bytes = ctx.d if family == "llama" else FP32_BYTES
    tensors = [
        saved(f"{label} input (fp32)", "the norm's fp32 upcast, kept by pow and mul", full,
              FP32_BYTES, splits),
        saved(f"{label} rsqrt (fp32)", "1/rms per row, kept by rsqrt and mul", rows,
              FP32_BYTES, row_splits),
        saved(f"{label} normalized", "x * rsqrt, kept by the product with the weight", full,
              normalized_bytes, splits, weights=frozenset({group}), weights_only=True),
    ]
    if family in ("gemma", "fp32-weight"):
        weight_width = width // heads[1] if heads else width
        name, reason = ((f"{label} 1 + weight (fp32)", "Gemma scales by 1 + weight")
                        if family == "gemma" else
                        (f"{label} weight (fp32)", "the weight's fp32 copy, kept by the "
                         "product with x_hat"))
        tensors.append(saved(name, reason, ((symbol if not heads else "d_head",
                                             weight_width),), FP32_BYTES, frozenset()))
    return tensors
