"""Overlap windows (llmpar.evaluation.step_time.hide_costs): each collective hides only
behind the work that can run beside it, shared with the collectives behind the same
work, one piece of a bucketed or per-layer collective exposed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar
from llmpar.evaluation.step_time import Cost, hide_costs
from llmpar.strategies.data import bucket_parameters
from llmpar.strategy import Collective
from llmpar.testing.fast_form import disagreements

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


def _cost(seconds: float, behind: str, overlap: float = 1.0, pieces: float | None = None,
          name: str = "s.c") -> Cost:
    collective = Collective(strategy="s", name=name, operation="all-reduce", group_size=2,
                            overlap=overlap, hides_behind=behind, pieces=pieces)
    piece = 0.0 if pieces is None else 1 / pieces
    return Cost(collective, 1, 1, "inter-node", seconds, seconds * (1 - overlap), True, piece)


def _windows(compute: float, last_backward: float) -> dict[str, float]:
    return {"compute": compute, "attention": 0.0, "last-backward": last_backward,
            "first-forward": 0.0, "layers": compute}


def test_gpt3_175b_gradient_reduce_scatter_hides_behind_the_last_micro_batch_backward():
    """Hand check on specs/examples/gpt3-175b-1024-a100.toml: TP8 PP16 DP8, ZeRO-1 (the
    distributed optimizer), 192 micro-batches per replica.

    The reduce-scatter of one GPU's bf16 gradients (1.372e9 parameters: 175B / (8 x 16),
    with the first stage's position table and the row-parallel biases whole on each tensor
    rank) over 8 data ranks, 8 GPUs apart, one per node, so over one 200 Gb/s HDR NIC:
    7/8 x 2.745 GB / (25 GB/s x 0.8) + 7 x 5 us = 120.11 ms.
    Window: one micro-batch's backward on the slowest stage, compute / 192 x the backward's
    share of the executed FLOPs (1 - model / 3 / executed): 18.188 s / 192 x 0.6754 =
    63.98 ms, less its first bucket's share. Buckets: Megatron-Core's max(40M, 1M x 8)
    parameters, 80 MB of bf16: 34.31 of them. Exposed: the last bucket (3.50 ms), and what
    the other 33.31 buckets' 116.61 ms leave over the 62.12 ms window after the first
    bucket: 57.99 ms in all, where hiding behind the whole step's 18 s exposed nothing."""
    spec = SESSION.load_spec(EXAMPLES / "gpt3-175b-1024-a100.toml")
    plan = SESSION.evaluate(spec)
    (scatter,) = [c for c in plan.collectives if c.name == "data.dense-grad-reduce-scatter"]
    hardware = spec.hardware
    buffer = scatter.buffer_bytes
    assert buffer == pytest.approx(2 * 175e9 / (8 * 16), rel=0.01)
    assert (scatter.group_size, scatter.tier, scatter.calls_per_step) == (8, "inter-node", 1)
    seconds = (7 / 8 * buffer / (hardware.inter_node_bandwidth_bytes_per_s
                                 * hardware.collective_efficiency)
               + 7 * hardware.inter_node_latency_seconds)
    assert scatter.seconds == pytest.approx(seconds, rel=1e-12)
    assert seconds == pytest.approx(0.12011, abs=1e-5)

    assert plan.micro_batches_per_step == 192
    backward = 1 - plan.flops_per_step / 3 / plan.hardware_flops_per_step
    work = plan.compute_seconds / 192 * backward
    assert work == pytest.approx(0.06398, abs=1e-5)
    pieces = buffer / (bucket_parameters(8) * 2)
    assert bucket_parameters(8) == 40_000_000
    assert scatter.pieces == pytest.approx(pieces)
    window = work * (1 - 1 / pieces)
    assert scatter.hides_behind == "last-backward"
    assert scatter.window_seconds == pytest.approx(window, rel=1e-9)

    exposed = seconds / pieces + max(0.0, seconds * (1 - 1 / pieces) - window)
    assert scatter.exposed_seconds == pytest.approx(exposed, rel=1e-9)
    assert exposed == pytest.approx(0.05799, abs=1e-5)
    # The gather of the updated weights hides behind the first micro-batch's forward pass.
    (gather,) = [c for c in plan.collectives if c.name == "data.dense-param-all-gather"]
    forward = plan.compute_seconds / 192 * (1 - backward) * (1 - 1 / pieces)
    assert gather.hides_behind == "first-forward"
    assert gather.exposed_seconds == pytest.approx(
        seconds / pieces + seconds * (1 - 1 / pieces) - forward, rel=1e-9)
    # explain states the same numbers.
    explained = plan.derivation("exposed_communication_seconds")
    assert explained.inputs["data.dense-grad-reduce-scatter_exposed_seconds"] == \
        scatter.exposed_seconds
    assert explained.value == pytest.approx(sum(c.exposed_seconds for c in plan.collectives))


def _data_parallel_plan(global_batch: int, zero: int) -> llmpar.Plan:
    """Llama-3-8B over 16 single-GPU nodes, one 2048-token sequence per micro-batch: the
    gradient reduction over the network outlasts one micro-batch's backward pass."""
    return SESSION.evaluate({
        "model": "llama-3-8b",
        "hardware": {"cluster": "dgx-a100", "num_gpus": 16, "gpus_per_node": 1},
        "training": {"sequence_length": 2048, "micro_batch_size": 1,
                     "global_batch_size": global_batch},
        "parallel": {"data": {"zero": zero}}})


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_exposed_communication_never_falls_as_micro_batches_grow(zero):
    """More micro-batches per step at the same micro-batch: the gradient reduction still
    hides only behind the last one's backward pass (stages 0 to 2: the same exposed
    time, where hiding behind the whole step made it vanish); ZeRO-3 communicates every
    micro-batch, behind each one's layers, so its exposed time grows with them."""
    exposed = []
    for micro_batches in (1, 2, 4, 16, 64):
        plan = _data_parallel_plan(16 * micro_batches, zero)
        assert plan.micro_batches_per_step == micro_batches
        exposed.append(plan.exposed_communication_seconds)
    assert all(later >= earlier * (1 - 1e-9) for earlier, later in zip(exposed, exposed[1:]))
    assert exposed[0] > 0
    if zero < 3:
        assert exposed[-1] == pytest.approx(exposed[0], rel=1e-9)
        compute = _data_parallel_plan(16 * 64, zero).compute_seconds
        assert compute > 10 * plan.communication_seconds  # the whole step would hide it


def test_a_collective_that_fits_its_window_is_hidden_but_for_one_piece():
    whole = hide_costs([_cost(1.0, "last-backward")], _windows(100.0, 2.0))
    assert [c.exposed for c in whole] == [0.0]
    assert whole[0].window == 2.0
    bucketed = hide_costs([_cost(1.0, "last-backward", pieces=10)], _windows(100.0, 2.0))
    assert bucketed[0].exposed == pytest.approx(0.1)
    assert bucketed[0].window == pytest.approx(1.8)
    # Too long for its window: the rest shows, whatever the step's compute.
    over = hide_costs([_cost(3.0, "last-backward")], _windows(100.0, 2.0))
    assert over[0].exposed == pytest.approx(1.0)


def test_collectives_behind_one_window_share_it():
    """Two 1.5 s reductions behind a 2 s backward pass: 1 s shows, half from each; a
    collective that cannot overlap has no window."""
    first, second = (_cost(1.5, "last-backward", name=f"s.{n}") for n in "ab")
    blocking = _cost(0.5, "compute", overlap=0.0, name="s.c")
    hidden = hide_costs([first, second, blocking], _windows(100.0, 2.0))
    assert [c.exposed for c in hidden] == [pytest.approx(0.5), pytest.approx(0.5), 0.5]
    assert [c.window for c in hidden] == [2.0, 2.0, 0.0]


@given(seconds=st.floats(0.0, 10.0), work=st.floats(0.0, 10.0),
       overlap=st.sampled_from([0.0, 0.5, 1.0]),
       pieces=st.one_of(st.none(), st.floats(1.0, 1000.0)),
       other=st.floats(0.0, 10.0))
def test_exposure_lies_between_what_cannot_hide_and_the_whole(seconds, work, overlap,
                                                             pieces, other):
    """At least what cannot overlap (and one piece), at most the whole; exactly that
    least when it fits its window; never less with a shorter window or another collective
    sharing it."""
    share = 0.0 if pieces is None else 1 / pieces
    unhidden = seconds * (1 - overlap) + seconds * overlap * share

    def exposed(window: float, *others: Cost) -> float:
        return hide_costs([_cost(seconds, "last-backward", overlap, pieces), *others],
                          _windows(1e9, window))[0].exposed

    alone = exposed(work)
    assert unhidden - 1e-12 <= alone <= seconds + 1e-12
    if seconds * overlap <= work:
        assert alone == pytest.approx(unhidden, abs=1e-12)
    assert exposed(work / 2) >= alone - 1e-12
    assert exposed(work, _cost(other, "last-backward", name="s.d")) >= alone - 1e-12


def test_the_search_ranks_with_the_same_windows():
    """The search's one call over a node (every ZeRO stage and overlap setting, micro-batch
    sizes 1 and 2) gives each layout the step time evaluating it alone gives, where the
    windows decide the exposed time (dense, and experts with their own reductions)."""
    dense = SESSION.load_spec({
        "model": "llama-3-8b",
        "hardware": {"cluster": "dgx-a100", "num_gpus": 16, "gpus_per_node": 1},
        "training": {"sequence_length": 2048, "global_batch_size": 64},
        "parallel": {"data": {}}})
    experts = SESSION.load_spec({
        "model": "mixtral-8x7b",
        "hardware": {"cluster": "dgx-h100", "num_gpus": 32, "gpus_per_node": 2},
        "training": {"sequence_length": 4096, "global_batch_size": 64},
        "parallel": {"tensor": {"degree": 2}, "expert": {"degree": 4},
                     "pipeline": {"degree": 2}, "data": {}}})
    for spec in (dense, experts):
        assert list(disagreements(SESSION, spec)) == []


def test_tensor_input_gradients_hide_only_behind_the_weight_gradients():
    # Without recomputation the weight-gradient products are a third of the step's model
    # FLOPs (forward 1, input gradients 1, weight gradients 1), so the window of the
    # backward input-gradient collectives is a third of the compute, not all of it.
    spec = Path(__file__).resolve().parent.parent / "specs/examples/llama-3-8b-tp8-sp-a100.toml"
    plan = llmpar.evaluate(spec, {"training.recompute": "none"})
    behind = [c for c in plan.training.collectives
              if c.name == "sequence.input-gradient-reduce-scatter"]
    assert behind and behind[0].window_seconds < plan.compute_seconds / 2
    assert behind[0].window_seconds == pytest.approx(plan.compute_seconds / 3, rel=0.02)


def _gpt3(**overrides: object) -> llmpar.Plan:
    return SESSION.evaluate(EXAMPLES / "gpt3-175b-1024-a100.toml", dict(overrides))


def test_pipeline_sends_on_the_critical_path_unless_overlapped():
    (plain,) = [c for c in _gpt3().collectives if c.name == "pipeline.send-recv"]
    assert plain.exposed_seconds == plain.seconds and plain.hides_behind == "compute"
    overlapped = _gpt3(**{"parallel.pipeline.overlap_p2p": True})
    (sends,) = [c for c in overlapped.collectives if c.name == "pipeline.send-recv"]
    # Of the step's forward and backward sends, one of each stays exposed.
    assert sends.calls_per_step == plain.calls_per_step
    assert sends.exposed_seconds == pytest.approx(plain.seconds * 2 / plain.calls_per_step)
    assert overlapped.step_seconds < _gpt3().step_seconds


def test_hidden_seconds_cost_their_compute_share():
    collective = Collective(strategy="s", name="s.c", operation="reduce-scatter", group_size=2,
                            overlap=1.0, hides_behind="projections", pieces=4,
                            compute_share=0.25)
    cost = Cost(collective, 1, 1, "intra-node", 8.0, 0.0, True, 0.25)
    windows = {"compute": 100.0, "projections": 100.0}
    (hidden,) = hide_costs([cost], windows)
    # One of four chunks exposed (2 s); the 6 s hidden cost a quarter of a second each.
    assert hidden.exposed == pytest.approx(2.0 + 0.25 * 6.0)
