"""`llmpar plot` and llmpar.plot: figures hold the plans' numbers; files get written."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.errors import Problem, SpecError
from llmpar.units import GiB

SESSION = llmpar.Session(load_entry_points=False)


def example(name: str) -> str:
    return str(SESSION.presets.path("examples", name))


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path, capsys):
    import llmpar.cli.plot

    monkeypatch.setattr(llmpar.cli.plot, "matplotlib_available", lambda: False)
    out = tmp_path / "m.png"
    assert main(["plot", "memory", example("adam-memory-7b"), "-o", str(out)]) == 2
    assert "install llmpar[plot]" in capsys.readouterr().err
    assert not out.exists()


def test_sequence_lengths_double_up_to_32768_or_the_spec():
    from llmpar.plot import sequence_lengths

    assert sequence_lengths(1024) == (512, 1024, 2048, 4096, 8192, 16384, 32768)
    assert sequence_lengths(65536)[-2:] == (32768, 65536)
    assert sequence_lengths(40000)[-2:] == (32768, 40000)


def test_sweep_skips_invalid_points_and_keeps_the_rest():
    from llmpar.plot import sweep

    plan = SESSION.evaluate(example("adam-memory-7b"))

    def evaluate(overrides):
        if overrides["training.micro_batch_size"] > 2:
            raise SpecError([Problem("$.training.micro_batch_size", "too big")])
        return plan

    result = sweep(evaluate, "x", "training.micro_batch_size", (1, 2, 4))
    assert result.values == (1, 2) and len(result.plans) == 2
    assert result.skipped == ((4, "$.training.micro_batch_size: too big"),)
    with pytest.raises(SpecError):
        sweep(evaluate, "x", "training.micro_batch_size", (4, 8))


def test_memory_bars_are_the_plans_components():
    pytest.importorskip("matplotlib")
    from llmpar.plot import memory_figure

    plans = [SESSION.evaluate(example("qwen3-4b-activations")),
             SESSION.evaluate(example("qwen3-4b-activations"),
                              {"training.sequence_length": 4096})]
    ax = memory_figure(plans, ["s = 1024", "s = 4096"]).axes[0]
    heights = [patch.get_height() for patch in ax.patches]
    # bars go component by component: weights of both plans, then gradients, ...
    expected = [value / GiB for field in ("weights_bytes", "gradients_bytes",
                                          "optimizer_bytes", "activations_bytes")
                for value in (getattr(p, field) for p in plans)]
    assert heights == pytest.approx(expected)
    # activations grow 4x with s (coefficient model: k * b * s * L * h * d)
    assert heights[-1] == pytest.approx(4 * heights[-2])
    capacity = ax.collections[0].get_segments()[0][0][1]
    assert capacity == pytest.approx(81_559 * 2**20 / GiB)  # as an H100 reports it


def test_sequence_sweep_lines_are_plan_numbers():
    pytest.importorskip("matplotlib")
    from llmpar.plot import sequence_lengths, sweep, sweep_figure

    spec = example("qwen3-4b-activations")
    result = sweep(lambda extra: SESSION.evaluate(spec, extra), "qwen3-4b",
                   "training.sequence_length", sequence_lengths(1024))
    assert [p.sequence_length for p in result.plans] == list(result.values)
    memory_ax, time_ax = sweep_figure([result], "sequence length").axes
    (total,) = [line for line in memory_ax.lines if line.get_label().startswith("total")]
    assert list(total.get_xdata()) == list(result.values)
    assert list(total.get_ydata()) == pytest.approx([p.total_bytes / GiB
                                                     for p in result.plans])
    (time,) = time_ax.lines
    assert list(time.get_ydata()) == pytest.approx([p.step_seconds for p in result.plans])


@pytest.mark.parametrize(("kind", "suffix"), [("memory", "png"), ("sequence", "svg"),
                                              ("batch", "png")])
def test_plot_command_writes_a_file(kind, suffix, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"figure.{suffix}"
    specs = [example("qwen3-4b-activations")]
    if kind == "memory":
        specs.append(example("adam-memory-7b"))
    assert main(["plot", kind, *specs, "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert f"wrote {out}" in capsys.readouterr().out


def test_plot_rejects_other_file_types(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["plot", "memory", example("adam-memory-7b"), "-o",
                 str(tmp_path / "m.pdf")]) == 2
    assert ".png or .svg" in capsys.readouterr().err
