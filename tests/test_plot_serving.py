"""Serving plots: the memory bars include the KV cache, and `plot sequence|batch` sweep a
serving spec's prompt length and batch (or concurrency) with TTFT and TPOT."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.units import GiB

SESSION = llmpar.Session(load_entry_points=False)


def example(name: str) -> str:
    return str(SESSION.presets.path("examples", name))


STATIC = "inference-llama-2-70b-h100"
CONCURRENCY = "serve-llama-3.1-70b-fp8-vllm-4-h100"


def test_memory_bars_show_the_kv_cache():
    pytest.importorskip("matplotlib")
    from llmpar.plot import memory_figure

    plan = SESSION.evaluate(example(STATIC))
    ax = memory_figure([plan], ["static"]).axes[0]
    heights = [patch.get_height() for patch in ax.patches]
    expected = [value / GiB for value in (plan.weights_bytes, plan.kv_cache_bytes,
                                          plan.activations_bytes, plan.buffers_bytes)]
    assert heights == pytest.approx(expected)
    assert sum(heights) == pytest.approx(plan.total_bytes / GiB)


def test_sweep_axes_of_serving_specs():
    from llmpar.plot import SERVING_BATCH_SIZES, sweep_axis

    static = SESSION.load_spec(example(STATIC))
    assert sweep_axis(static, "sequence")[0] == "inference.prompt_tokens"
    assert sweep_axis(static, "batch")[:2] == ("inference.batch_size", SERVING_BATCH_SIZES)
    closed = SESSION.load_spec(example(CONCURRENCY))
    assert sweep_axis(closed, "batch")[0] == "inference.concurrency"
    rate = SESSION.load_spec(example("serve-llama-3.1-70b-1p1d-h100"))
    with pytest.raises(SpecError) as error:
        sweep_axis(rate, "batch")
    assert error.value.problems[0].path == "$.inference.request_rate_per_s"


def test_a_concurrency_sweep_plots_the_steady_states_ttft_and_tpot():
    pytest.importorskip("matplotlib")
    from llmpar.plot import sweep, sweep_axis, sweep_figure

    spec = example(CONCURRENCY)
    key, values, label = sweep_axis(SESSION.load_spec(spec), "batch")
    result = sweep(lambda extra: SESSION.evaluate(spec, extra), "70b", key, values[:4])
    _memory_ax, time_ax = sweep_figure([result], label).axes
    tpot, ttft = time_ax.lines
    assert list(tpot.get_ydata()) == pytest.approx(
        [p.serving[0].continuous.tpot_seconds for p in result.plans])
    assert list(ttft.get_ydata()) == pytest.approx(
        [p.serving[0].continuous.ttft_seconds for p in result.plans])
    # More requests in flight: a larger running batch, so each step takes longer.
    assert list(tpot.get_ydata()) == sorted(tpot.get_ydata())


@pytest.mark.parametrize("kind", ["memory", "sequence", "batch"])
def test_plot_command_takes_serving_specs(kind, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figure.png"
    assert main(["plot", kind, example(STATIC), "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
