"""Where ranks sit: the axes strategies declare, the rank order, and the rank distance
between a group's members.

Each strategy whose degree places ranks declares an `Axis`: the token it contributes to
`[parallel] order` and where it may sit (torchtitan's `ParallelDims` keeps every
degree in one record the same way). Ranks are numbered with the first axis of the
order varying fastest, as Megatron-Core's `RankGenerator` does with its order string
(default "tp-cp-ep-dp-pp": tensor innermost, pipeline outermost). A group whose
members lie within `gpus_per_node` consecutive ranks stays inside a node.

An axis may be `nested`: its ranks are carved out of other axes' ranks instead of
multiplying the GPU count (Megatron-Core's expert ranks are the innermost data x
context ranks), so it adds nothing to the strides of the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from llmpar.errors import Problem

RANK_ORDER = ("tensor", "context", "expert", "data", "pipeline")
"""The default order of llmpar's own axes, innermost first (Megatron-Core's
tp-cp-ep-dp-pp): the tensor group is contiguous, so it stays inside a node when its
degree allows. `default_order` derives it from the declarations."""

ORDER_KEY = "order"
"""`[parallel] order`: the one key of `[parallel]` that is not a strategy's table."""


@attrs.frozen(kw_only=True)
class Axis:
    """How a strategy's ranks are placed (`Strategy.axis`)."""

    token: str
    """Its name in `[parallel] order` ("tp")."""
    rank: int
    """Its place in the default order, innermost first (lower is further in)."""
    optional: bool = False
    """May be left out of an order string (then it goes where `right_before` says)."""
    right_before: str | None = None
    """The strategy whose axis it must come right before (expert ranks right before
    the data ranks they are carved out of)."""
    beside: str | None = None
    """The strategy whose axis (with the axes right before it) it must sit next to, so
    that the two form one block of ranks (context beside data)."""
    nested: bool = False
    """Its ranks are other axes' ranks: it adds nothing to their strides."""


def default_order(axes: Mapping[str, Axis]) -> tuple[str, ...]:
    """Every declared axis by its `rank`, innermost first."""
    return tuple(sorted(axes, key=lambda name: (axes[name].rank, name)))


def order_text(order: Iterable[str], axes: Mapping[str, Axis]) -> str:
    """"tp-cp-ep-dp-pp" for the default order of the built-in axes."""
    return "-".join(axes[name].token for name in order if name in axes)


def parse_order(text: object, axes: Mapping[str, Axis],
                path: str = "$.parallel.order") -> tuple[tuple[str, ...], list[Problem]]:
    """The order a string like "tp-pp-cp-ep-dp" names, innermost first, or problems.

    Every axis that is not optional once; an axis with `right_before` right before
    that axis (put there when left out); an axis with `beside` next to that axis's
    block."""
    default = default_order(axes)
    tokens_of = {axis.token: name for name, axis in axes.items()}
    tokens_of.update({name: name for name in axes})
    example = order_text(default, axes)
    expected = (f"a string of {', '.join(axes[n].token for n in default)} joined by \"-\", "
                f"innermost first, e.g. {example!r}")
    if not isinstance(text, str):
        return default, [Problem(path, f"expected {expected}, got {text!r}")]
    tokens = [axes[tokens_of[t]].token if t in tokens_of else t for t in text.split("-")]
    unknown = [t for t in tokens if t not in tokens_of]
    if unknown:
        return default, [Problem(path, f"unknown {', '.join(map(repr, unknown))} in "
                                       f"{text!r}: expected {expected}")]
    required = [axes[n].token for n in default if not axes[n].optional]
    missing = [t for t in required if t not in tokens]
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if missing or repeated:
        what = "; ".join(filter(None, [f"missing {', '.join(missing)}" if missing else None,
                                       f"repeated {', '.join(repeated)}" if repeated else None]))
        return default, [Problem(path, f"{text!r}: {what}; expected {expected}")]
    names = [tokens_of[t] for t in tokens]
    problem = _place_right_before(names, axes, text) or _check_beside(names, axes, text)
    if problem:
        return default, [Problem(path, problem)]
    return tuple(names), []


def _place_right_before(names: list[str], axes: Mapping[str, Axis], text: str) -> str | None:
    """Insert left-out optional axes; say which one is not right before its axis."""
    for name, axis in axes.items():
        target = axis.right_before
        if target is None or target not in names:
            continue
        if name not in names:
            names.insert(names.index(target), name)
        elif names[names.index(name) + 1:][:1] != [target]:
            return (f"{text!r}: {axis.token} must come right before {axes[target].token} "
                    f"({name} ranks are the innermost {target} ranks)")
    return None


def _check_beside(names: list[str], axes: Mapping[str, Axis], text: str) -> str | None:
    for name, axis in axes.items():
        target = axis.beside
        if target is None or target not in names or name not in names:
            continue
        block = [names.index(target)] + [names.index(n) for n, a in axes.items()
                                         if a.right_before == target and n in names]
        if names.index(name) not in (min(block) - 1, max(block) + 1):
            return (f"{text!r}: {axis.token} must sit next to {axes[target].token} (or the "
                    f"block of axes right before it), so that {target} x {name} ranks form "
                    "one block")
    return None


def stride(order: tuple[str, ...], degrees: Mapping[str, int], strategy: str,
           nested: Iterable[str]) -> int:
    """Rank distance between members of `strategy`'s group: the product of the degrees
    of the axes placed inside it, nested axes excepted (their ranks are the others').
    A strategy outside the order sits outside all of it."""
    skip = nested if isinstance(nested, frozenset) else frozenset(nested)
    found = 1  # the product of the inner degrees, in order
    for name in order[: order.index(strategy)] if strategy in order else order:
        if name not in skip:
            found *= degrees.get(name, 1)
    return found


def block_stride(order: tuple[str, ...], degrees: Mapping[str, int], strategies: Iterable[str],
                 nested: Iterable[str]) -> int:
    """Where a block of adjacent axes starts: the stride of its innermost one."""
    return min([stride(order, degrees, name, nested) for name in strategies])



def ring_crosses_nodes(group_size: int, group_stride: int, gpus_per_node: int) -> bool:
    """Whether some two consecutive members of a ring (the last one back to the first)
    sit on different nodes, ranks numbered node by node.

    A group's members are r, r + stride, ..., r + (size - 1) * stride, and the groups of
    an axis tile the ranks in aligned blocks of size x stride ranks. A block longer than
    a node spans nodes, and a ring that leaves its first node must come back to it
    (CP8 x TP4 on 8-GPU nodes: ranks 0, 4 | 8, 12 | ... | 28, then back to 0); a block
    that does not divide a node straddles a node boundary somewhere. A pair (size 2) is
    the ring of its two members."""
    block = group_size * group_stride
    return group_size > 1 and (block > gpus_per_node or gpus_per_node % block != 0)
