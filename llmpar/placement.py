"""Where ranks sit: the rank order, and the rank distance between a group's members.

Ranks are numbered with the first dimension of the order varying fastest, as
Megatron-Core's `RankGenerator` does with its order string (default
"tp-cp-ep-dp-pp": tensor innermost, pipeline outermost). A group whose members
lie within `gpus_per_node` consecutive ranks stays inside a node.

Expert parallelism does not multiply the GPU count: its ranks are the innermost
part of the data x context ranks (Megatron-Core's expert ranks), so the order keeps
"ep" right before "dp", and "cp" next to them, which keeps data x context one
contiguous block of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llmpar.errors import Problem

RANK_ORDER = ("tensor", "context", "expert", "data", "pipeline")
"""Default placement of ranks, innermost first (Megatron-Core's tp-cp-ep-dp-pp): the
tensor group is contiguous, so it stays inside a node when its degree allows."""

EXPERT_TENSOR = "expert_tensor"
"""The layout key of the expert tensor degree (`[parallel.expert] tensor_degree`)."""
ORDER_KEY = "order"
"""`[parallel] order`: the one key of `[parallel]` that is not a strategy's table."""

TOKENS = {"tp": "tensor", "cp": "context", "ep": "expert", "dp": "data", "pp": "pipeline"}
"""The order string's names (Megatron-Core's) for the strategies."""


def order_text(order: tuple[str, ...]) -> str:
    """"tp-cp-ep-dp-pp" for RANK_ORDER."""
    names = {strategy: token for token, strategy in TOKENS.items()}
    return "-".join(names[strategy] for strategy in order)


def parse_order(text: object, path: str = "$.parallel.order") -> tuple[tuple[str, ...],
                                                                         list[Problem]]:
    """The order a string like "tp-pp-cp-ep-dp" names, innermost first, or problems.

    Every one of tp, cp, dp and pp once; ep, if given, right before dp (else it is put
    there); cp next to the ep-dp block."""
    expected = ('a string of tp, cp, dp and pp (and ep) joined by "-", innermost first, '
                'e.g. "tp-cp-ep-dp-pp"')
    if not isinstance(text, str):
        return RANK_ORDER, [Problem(path, f"expected {expected}, got {text!r}")]
    tokens = text.split("-")
    unknown = [t for t in tokens if t not in TOKENS]
    if unknown:
        return RANK_ORDER, [Problem(path, f"unknown {', '.join(map(repr, unknown))} in "
                                          f"{text!r}: expected {expected}")]
    missing = [t for t in ("tp", "cp", "dp", "pp") if t not in tokens]
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if missing or repeated:
        what = "; ".join(filter(None, [missing and f"missing {', '.join(missing)}",
                                       repeated and f"repeated {', '.join(repeated)}"]))
        return RANK_ORDER, [Problem(path, f"{text!r}: {what}; expected {expected}")]
    if "ep" in tokens and tokens[tokens.index("ep") + 1:][:1] != ["dp"]:
        return RANK_ORDER, [Problem(path, f"{text!r}: ep must come right before dp (expert "
                                          "ranks are the innermost data ranks)")]
    if "ep" not in tokens:
        tokens.insert(tokens.index("dp"), "ep")
    block = (tokens.index("ep"), tokens.index("dp"))
    if tokens.index("cp") not in (block[0] - 1, block[1] + 1):
        return RANK_ORDER, [Problem(path, f"{text!r}: cp must sit next to dp (or ep-dp), so "
                                          "that data x context ranks form one block")]
    return tuple(TOKENS[t] for t in tokens), []


def stride(order: tuple[str, ...], degrees: Mapping[str, int], strategy: str) -> int:
    """Rank distance between members of `strategy`'s group: the product of the degrees
    placed inside it (the expert degree excepted: its ranks are data ranks). Expert
    groups start where the data x context block starts, or inside the tensor ranks
    when experts split over fewer of them; a strategy outside the order sits outside
    all of it."""
    def degree(name: str) -> int:
        return degrees.get(name, 1)

    if strategy == "expert":
        expert_tensor = degrees.get(EXPERT_TENSOR, degree("tensor"))
        if expert_tensor < degree("tensor"):
            # Experts split over fewer ranks than the layers: expert ranks fold into the
            # tensor ranks (Megatron-Core's MoE parallel folding).
            return stride(order, degrees, "tensor") * expert_tensor
        return data_context_stride(order, degrees)
    inner = order[: order.index(strategy)] if strategy in order else order
    return math.prod(degree(name) for name in inner if name != "expert")


def data_context_stride(order: tuple[str, ...], degrees: Mapping[str, int]) -> int:
    """Where the data x context block starts: the stride of its innermost ranks."""
    return min(stride(order, degrees, "context"), stride(order, degrees, "data"))
