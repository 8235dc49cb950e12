"""What a dense MLP keeps: gated (gate_proj, up_proj, down_proj) or two-matrix.

Sources: LlamaMLP-style modules (act_fn(gate_proj(x)) * up_proj(x)), Phi-3's fused
gate_up_proj (whose chunks are views: the same bytes), GPT2MLP with gelu_new written
out in Python (NewGELUActivation) and BertIntermediate/BertOutput with F.gelu, in
transformers 5.24.0, measured with torch 2.13.0.
"""

from __future__ import annotations

from llmpar.footprint.activations.common import INSIDE_TP, OUTSIDE_TP
from llmpar.footprint.activations.hf.attention import residual_dropout
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.inventory import SavedTensor


def first_projections(ctx: Context, group: str) -> frozenset[str]:
    """The products that take an MLP's input: gate_proj and up_proj (gated) or up_proj,
    of parameter group `group`."""
    names = ("gate_proj", "up_proj") if ctx.model.gated else ("up_proj",)
    return frozenset(f"{group}.{name}" for name in names)


def mlp_input(ctx: Context, label: str = "mlp",
              weights: frozenset[str] | None = None) -> SavedTensor:
    """The MLP's normed input, kept only for the weight gradients of the products that
    take it (`weights`; default: the dense MLP's first projections)."""
    weights = first_projections(ctx, "mlp") if weights is None else weights
    return ctx.per_token(f"{label} input", "input of the first MLP projections", "h",
                         ctx.sizes.h[1], ctx.d, OUTSIDE_TP, weights, bool(weights))


def inner_tensors(ctx: Context, symbol: str, width: int, label: str = "",
                  group: str = "mlp") -> list[SavedTensor]:
    """The MLP's inner tensors, `width` wide, after its input; the down projection's
    input (parameter group `group`) is kept only for its weight gradient unless the
    activation keeps it (relu keeps its output)."""
    down = frozenset({f"{group}.down_proj"})

    def inner(name: str, reason: str, only_down: bool = False) -> SavedTensor:
        return ctx.per_token(f"{label}{name}", reason, symbol, width, ctx.d, INSIDE_TP,
                             down if only_down else frozenset(), only_down)

    if ctx.model.gated:
        return [inner("gate output", "input of the activation function"),
                inner("activation output", "operand of the gating product"),
                inner("up output", "operand of the gating product"),
                inner("gated product", "input of the down projection", True)]
    if ctx.model.ffn_activation == "relu":
        return [ctx.per_token(f"{label}activation output", "kept by relu, input of the down "
                              "projection", symbol, width, ctx.d, INSIDE_TP, down)]
    if ctx.model.ffn_activation == "relu2":  # ReLUSquaredActivation: relu, then square
        return [inner("relu output", "kept by relu and by square"),
                inner("activation output", "input of the down projection", True)]
    if ctx.family.gelu_formula:
        return [inner("activation input", "kept by pow in gelu_new"),
                inner("tanh output", "kept by tanh in gelu_new"),
                inner("0.5 x", "operand of gelu_new's product"),
                inner("1 + tanh", "operand of gelu_new's product"),
                inner("activation output", "input of the down projection", True)]
    return [inner("activation input", "kept by F.gelu"),
            inner("activation output", "input of the down projection", True)]


def dense_mlp(ctx: Context) -> list[SavedTensor]:
    assert ctx.model.ffn_hidden_size is not None
    return ([mlp_input(ctx)] + inner_tensors(ctx, "ffn", ctx.model.ffn_hidden_size)
            + residual_dropout(ctx, "mlp"))
