"""`llmpar plot pareto`: the search's front of memory per GPU against step time."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.cli.main import main


def test_pareto_plot_draws_the_search_front(tmp_path):
    pytest.importorskip("matplotlib")
    from llmpar import plot

    spec = str(llmpar.default_session().presets.path("examples", "gpt3-175b-1024-a100"))
    result = llmpar.search(spec)
    labels = [str(i) for i, _ in enumerate(result.pareto)]
    figure = plot.pareto_figure(result.pareto, labels, "front")
    (line,) = figure.axes[0].get_lines()
    assert list(line.get_xdata()) == [p.total_bytes / 2**30 for p in result.pareto]
    assert list(line.get_ydata()) == [p.step_seconds for p in result.pareto]
    output = tmp_path / "front.png"
    assert main(["plot", "pareto", spec, "-o", str(output)]) == 0
    assert output.stat().st_size > 0


def _texts(figure):
    """Every piece of text drawn outside the ticks: titles, annotations, the list."""
    found = [figure.axes[0].title]
    for ax in figure.axes:
        found += [t for t in ax.texts if t.get_text()]
    return [t for t in found if t.get_text()]


@pytest.mark.parametrize("spec", ["specs/examples/gpt3-175b-1024-a100.toml",
                                  "benchmarks/specs/gpt3-175b-1024-a100.toml"],
                         ids=["three points", "fifty points"])
def test_pareto_labels_do_not_collide_and_stay_on_the_figure(spec):
    """Rendered, the title, the two corner annotations and the list of the front take
    boxes that do not overlap, all inside the figure (the labels once piled on the
    points and ran into the title)."""
    pytest.importorskip("matplotlib")
    from pathlib import Path

    from llmpar import plot
    from llmpar.cli.plot import _choices_label

    path = Path(__file__).resolve().parent.parent / spec
    result = llmpar.search(str(path))
    labels = [_choices_label(point) for point in result.pareto]
    figure = plot.pareto_figure(result.pareto, labels, "a front")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    boxes = [t.get_window_extent(renderer) for t in _texts(figure)]
    assert len(boxes) == 3 + (len(result.pareto) > 1)
    page = figure.bbox
    for box in boxes:
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 <= box.y1 <= page.y1
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    listed = figure.axes[1].texts[0].get_text().splitlines()[1:]
    assert len(listed) == min(len(result.pareto), plot.PARETO_LISTED)
    assert listed[-1].startswith(f"{len(result.pareto)}. ")  # the fastest is always listed
