"""`llmpar plot waterfall`: a training step's time as compute, each strategy's exposed
communication, the bubble and the optimizer step, adding up to the step as the report's
*Step time* table does."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.plot import step_parts

SESSION = llmpar.Session(load_entry_points=False)
MODELLED = ["gpt3-175b-1024-a100", "llama-3-8b-fsdp-8-h100", "llama-3-70b-tp8-pp4-cp2",
            "mixtral-8x7b-ep8-a100", "llama-3-8b-lora-rtx-4090"]


def _plan(name: str) -> llmpar.Plan:
    return SESSION.evaluate(SESSION.presets.path("examples", name))


@pytest.mark.parametrize("name", MODELLED)
def test_the_parts_add_up_to_the_step(name):
    plan = _plan(name)
    parts = dict(step_parts(plan))
    assert parts["compute"] == plan.compute_seconds
    assert sum(parts.values()) == pytest.approx(plan.step_seconds, rel=1e-12)
    exposed = sum(s for label, s in parts.items() if label.startswith("exposed ")
                  and label.endswith(" communication"))
    assert exposed == pytest.approx(plan.exposed_communication_seconds, rel=1e-12, abs=1e-15)


def test_each_bar_starts_where_the_one_before_ends():
    pytest.importorskip("matplotlib")
    from llmpar.plot import waterfall_figure

    plan = _plan("gpt3-175b-1024-a100")
    parts = step_parts(plan)
    assert [label for label, _ in parts[:4]] == [
        "compute", "exposed sequence communication", "exposed pipeline communication",
        "exposed data communication"]  # largest exposed first
    ax = waterfall_figure(plan, "step").axes[0]
    bars = ax.patches
    assert len(bars) == len(parts) + 1
    end = 0.0
    for bar, (_label, seconds) in zip(bars, parts):
        assert bar.get_x() == pytest.approx(end) and bar.get_width() == pytest.approx(seconds)
        end += seconds
    assert bars[-1].get_x() == 0 and bars[-1].get_width() == pytest.approx(plan.step_seconds)
    assert [t.get_text() for t in ax.get_yticklabels()] == [name for name, _ in parts] + ["step"]
    assert "(s)" in ax.get_xlabel()


def test_a_step_time_not_modelled_has_no_waterfall(tmp_path, capsys):
    plan = _plan("deepseek-v3-2048-h800")  # an assumed MFU: no parts to add
    assert plan.time_model != "modelled" and step_parts(plan) == []
    pytest.importorskip("matplotlib")
    with pytest.raises(SpecError, match="modelled"):
        from llmpar.plot import waterfall_figure

        waterfall_figure(plan, "step")
    assert main(["plot", "waterfall", "deepseek-v3-2048-h800", "-o",
                 str(tmp_path / "w.png")]) == 2


def test_cli_writes_the_waterfall(tmp_path):
    pytest.importorskip("matplotlib")
    output = tmp_path / "waterfall.svg"
    assert main(["plot", "waterfall", "gpt3-175b-1024-a100", "-o", str(output)]) == 0
    assert "exposed sequence communication" in output.read_text(encoding="utf-8")
