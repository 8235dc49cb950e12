"""Every `llmpar plot` kind drawn from a shipped example matches its reference figure in
docs/plots/ by what a reader sees: the same texts, each axes and text within 2% of the
figure of where the reference has it, no two texts overlapping and none leaving the
figure (`llmpar.testing.figures`). A plot that changes on purpose is drawn again with
`python docs/plot_references.py`, and the new PNG looked at before it is committed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from llmpar.testing.figures import figure_geometry, geometry_differences, overlapping_texts

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.02
"""Of the figure's width or height: renderers and fonts move text by less."""


def _references() -> ModuleType:
    path = ROOT / "docs" / "plot_references.py"
    spec = importlib.util.spec_from_file_location("plot_references", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCES = _references()


@pytest.mark.parametrize("name", sorted(REFERENCES.CASES))
def test_the_plot_is_its_reference_figure(name):
    pytest.importorskip("matplotlib")
    reference = json.loads(REFERENCES.GEOMETRY.read_text())[name]
    assert (REFERENCES.PLOTS / f"{name}.png").stat().st_size > 10_000
    found = figure_geometry(REFERENCES.draw(name))
    problems = geometry_differences(found, reference, TOLERANCE)
    assert not problems, (f"{name} differs from docs/plots/{name}.png (run python "
                          f"docs/plot_references.py and look at it): " + "; ".join(problems))
    assert not overlapping_texts(found)


def test_a_moved_label_is_caught():
    """The comparison sees a label moved by more than the tolerance, and a text that
    changed."""
    reference = {"axes": [[0.1, 0.1, 0.9, 0.9]],
                 "texts": [{"text": "step", "box": [0.2, 0.2, 0.3, 0.25]}]}
    moved = {"axes": reference["axes"],
             "texts": [{"text": "step", "box": [0.2, 0.25, 0.3, 0.3]}]}
    renamed = {"axes": reference["axes"],
               "texts": [{"text": "steps", "box": [0.2, 0.2, 0.3, 0.25]}]}
    assert geometry_differences(reference, reference, TOLERANCE) == []
    assert "'step' at" in geometry_differences(moved, reference, TOLERANCE)[0]
    assert "missing ['step'], added ['steps']" in geometry_differences(
        renamed, reference, TOLERANCE)[0]
    near = {"text": "steps", "box": [0.25, 0.22, 0.35, 0.27]}
    assert overlapping_texts({"texts": [reference["texts"][0], near]}) == [
        "'step' overlaps 'steps'"]
    assert overlapping_texts({"texts": [reference["texts"][0], moved["texts"][0]]}) == []
