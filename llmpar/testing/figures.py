"""The geometry of a figure's labelled elements, for checking plots by what a reader sees:
each axes' box and each visible text's content and box, in fractions of the figure (so
the same at any resolution). Reference figures keep this beside their PNG
(docs/plots/geometry.json); a figure matches its reference when it has the same texts and
every box lies within a tolerance of the reference's, which survives renderer and font
differences that would defeat a pixel comparison."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def figure_geometry(figure: Any) -> dict[str, Any]:
    """The axes boxes and the visible, non-empty texts (content and box) of a matplotlib
    figure, each box [x0, y0, x1, y1] in fractions of the figure rounded to 1/1000, texts
    in drawing order."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas: Any = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else (
        FigureCanvasAgg(figure))
    canvas.draw()  # lays the figure out as saving it does
    renderer = canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height

    def box(extent: Any) -> list[float]:
        return [round(float(value), 3) for value in (
            extent.x0 / width, extent.y0 / height, extent.x1 / width, extent.y1 / height)]

    undrawn = {id(label) for ax in figure.axes for axis in (ax.xaxis, ax.yaxis)
               for label in _undrawn_tick_labels(axis)}
    texts = []
    for text in figure.findobj(Text):
        content = text.get_text().strip()
        if (content and text.get_visible() and id(text) not in undrawn
                and (text.axes is None or text.axes.get_visible())):
            texts.append({"text": content, "box": box(text.get_window_extent(renderer))})
    return {"axes": [box(ax.get_window_extent(renderer)) for ax in figure.axes],
            "texts": texts}


def _undrawn_tick_labels(axis: Any) -> list[Any]:
    """The labels of an axis' ticks outside its view, which matplotlib keeps but does not
    draw."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) * 1e-9
    return [label for tick in axis.get_major_ticks() + axis.get_minor_ticks()
            if not low - span <= tick.get_loc() <= high + span
            for label in (tick.label1, tick.label2)]


def geometry_differences(found: Mapping[str, Any], reference: Mapping[str, Any],
                         tolerance: float) -> list[str]:
    """Where `found` departs from `reference`: a text missing or added, or an axes' or a
    text's box off by more than `tolerance` (a fraction of the figure) on any side."""
    problems = []
    if len(found["axes"]) != len(reference["axes"]):
        problems.append(f"{len(found['axes'])} axes, the reference has "
                        f"{len(reference['axes'])}")
    for index, (a, b) in enumerate(zip(found["axes"], reference["axes"])):
        if _off(a, b, tolerance):
            problems.append(f"axes {index} at {a}, the reference at {b}")
    texts = [t["text"] for t in found["texts"]]
    expected = [t["text"] for t in reference["texts"]]
    if sorted(texts) != sorted(expected):
        missing = sorted(set(expected) - set(texts))
        added = sorted(set(texts) - set(expected))
        problems.append(f"texts differ: missing {missing}, added {added}")
        return problems
    for text, box in _pairs(found["texts"], reference["texts"]):
        if _off(text, box, tolerance):
            problems.append(f"text {text['text']!r} at {text['box']}, the reference at "
                            f"{box['box']}")
    return problems


def overlapping_texts(geometry: Mapping[str, Any], skip: Sequence[str] = ()) -> list[str]:
    """Pairs of texts whose boxes overlap (tick labels of one axis may touch: pass their
    contents in `skip`) and texts that leave the figure."""
    texts = [t for t in geometry["texts"] if t["text"] not in skip]
    problems = [f"{t['text']!r} leaves the figure at {t['box']}" for t in texts
                if min(t["box"]) < -0.005 or max(t["box"]) > 1.005]
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if _intersect(a["box"], b["box"]):
                problems.append(f"{a['text']!r} overlaps {b['text']!r}")
    return problems


def _pairs(found: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]
           ) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Each found text with the reference's text of the same content (repeated contents
    in order)."""
    pool: dict[str, list[Mapping[str, Any]]] = {}
    for text in reference:
        pool.setdefault(text["text"], []).append(text)
    return [(text, pool[text["text"]].pop(0)) for text in found]


def _off(a: Any, b: Any, tolerance: float) -> bool:
    first = a["box"] if isinstance(a, Mapping) else a
    second = b["box"] if isinstance(b, Mapping) else b
    return any(abs(x - y) > tolerance for x, y in zip(first, second))


def _intersect(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two boxes share more than a hairline (0.002 of the figure)."""
    margin = 0.002
    return (min(a[2], b[2]) - max(a[0], b[0]) > margin
            and min(a[3], b[3]) - max(a[1], b[1]) > margin)
