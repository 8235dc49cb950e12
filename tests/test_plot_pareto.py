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
