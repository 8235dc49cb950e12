"""Host time of issuing kernels (llmpar.evaluation.launches): hidden behind the GPU's work
while that takes longer, exposed beyond it; the profiles' constants are the measured rows
of validation/published/kernels/host_launch_overheads.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmpar
from llmpar.loading.presets import builtin_specs_dir

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "validation" / "published" / "kernels" / "host_launch_overheads.toml"
EAGER = ("megatron-core", "nemo", "torchtitan", "pytorch-fsdp2", "deepspeed", "hf-trainer")
SMALL = {"model": "gpt2", "hardware": {"gpu": "h100-sxm", "num_gpus": 1},
         "training": {"sequence_length": 1024, "micro_batch_size": 1}}
LARGE = "specs/examples/llama-3-8b-fsdp-8-h100.toml"


def _measurements() -> dict[str, dict]:
    table = tomllib.loads(DATA.read_text())
    return {m["name"]: m for m in table["measurement"]}


def _step(spec: object, **profile: object) -> llmpar.Plan:
    framework = {"preset": "megatron-core", **profile}
    return llmpar.evaluate(spec, {"training.framework": framework})


def test_the_eager_profiles_state_the_measured_host_time_per_kernel():
    eager = _measurements()["pytorch-eager-add-a100"]["rows"]
    host_bound = min(eager, key=lambda r: r["elements"])
    for name in EAGER:
        table = tomllib.loads((builtin_specs_dir() / "frameworks" / f"{name}.toml").read_text())
        assert llmpar.load_spec({**SMALL, "training": {**SMALL["training"], "framework": name}}
                                ).training.profile.host_seconds_per_kernel == pytest.approx(
            host_bound["submit_us"] * 1e-6), name
        assert table.get("cuda_graphs", "none") == "none", name  # all launch eagerly


def test_the_measured_rows_show_host_time_hidden_behind_longer_kernels():
    """Back to back, an operator takes max(host, kernel): the GPU-bound add runs at its
    kernel's pace, far above the host's 8 us, the host-bound one at the host's."""
    rows = sorted(_measurements()["pytorch-eager-add-a100"]["rows"], key=lambda r: r["elements"])
    host = rows[0]["submit_us"]
    assert rows[1]["submit_us"] > 10 * host
    # Synchronizing after every operator exposes the launch: the difference to the
    # back-to-back time is about the same for both (the hidden host time plus latency).
    gaps = [r["synchronized_us"] - r["submit_us"] for r in rows]
    assert max(gaps) - min(gaps) < host


def test_graph_replay_is_a_fixed_cost_plus_a_small_one_per_kernel():
    rows = _measurements()["cuda-launch-and-graph-replay"]["rows"]
    n = [r["kernels"] for r in rows]
    graph = [r["graph_us"] for r in rows]
    mean_n, mean_g = sum(n) / len(n), sum(graph) / len(graph)
    slope = (sum((a - mean_n) * (b - mean_g) for a, b in zip(n, graph))
             / sum((a - mean_n) ** 2 for a in n))
    intercept = mean_g - slope * mean_n
    assert intercept == pytest.approx(15, abs=1.5)  # the source's "about 15 us fixed"
    assert slope == pytest.approx(0.58, abs=0.06)  # "about 0.58 us per node"
    per_launch = [r["launches_us"] / r["kernels"] for r in rows]
    assert min(per_launch) > 10 * slope  # a graph saves most of each launch


def test_zero_host_time_is_the_identity():
    spec = llmpar.load_spec(SMALL)
    zero = {"host_seconds_per_kernel": 0, "host_seconds_per_layer": 0,
            "graph_launch_seconds": 0}
    base = _step(spec, **zero)
    assert base.training.launch_bound_seconds == 0.0
    for cuda_graphs in ("none", "layers", "step"):
        assert _step(spec, cuda_graphs=cuda_graphs, **zero).step_seconds == base.step_seconds


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([0.0, 1e-6, 8e-6, 30e-6]), st.sampled_from([0.0, 2e-6, 20e-6]),
       st.integers(0, 40))
def test_step_time_never_falls_as_host_time_grows(per_kernel, extra, kernels):
    spec = llmpar.load_spec(SMALL)
    low = _step(spec, host_seconds_per_kernel=per_kernel, elementwise_kernels_per_layer=kernels)
    high = _step(spec, host_seconds_per_kernel=per_kernel + extra,
                 elementwise_kernels_per_layer=kernels)
    more = _step(spec, host_seconds_per_kernel=per_kernel,
                 elementwise_kernels_per_layer=kernels + 5)
    assert high.step_seconds >= low.step_seconds
    assert more.step_seconds >= low.step_seconds


def test_a_large_micro_batch_hides_the_launches_and_a_small_model_does_not():
    large = llmpar.evaluate(LARGE)
    assert large.training.launch_bound_seconds == 0.0
    small = _step(llmpar.load_spec(SMALL), elementwise_kernels_per_layer=20)
    assert small.training.launch_bound_seconds > 0.0
    graphed = _step(llmpar.load_spec(SMALL), elementwise_kernels_per_layer=20,
                    cuda_graphs="layers", graph_launch_seconds=15e-6)
    assert graphed.step_seconds < small.step_seconds


def test_exposed_launch_time_is_what_issuing_takes_beyond_compute():
    spec = llmpar.load_spec(SMALL)
    plan = _step(spec, host_seconds_per_kernel=1e-3)  # far host-bound
    training = plan.training
    issue = training.issue_seconds
    assert training.launch_bound_seconds == pytest.approx(issue - training.compute_seconds)


def test_concepts_quotes_the_small_model_example():
    """docs/concepts.md's host-time paragraph quotes these numbers."""
    text = " ".join((ROOT / "docs" / "concepts.md").read_text().split())
    spec = llmpar.load_spec(SMALL)
    plain = _step(spec).training
    counted = _step(spec, elementwise_kernels_per_layer=20).training
    assert (f"issues {plain.issue_seconds * 1e3:.1f} ms of launches behind "
            f"{plain.compute_seconds * 1e3:.1f} ms of compute") in text
    assert plain.launch_bound_seconds == 0.0
    assert (f"`elementwise_kernels_per_layer = 20` {counted.issue_seconds * 1e3:.1f} ms, "
            f"{counted.launch_bound_seconds * 1e3:.1f} ms of it exposed") in text
