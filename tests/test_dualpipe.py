"""DualPipe and DualPipeV (`[parallel.pipeline] schedule`): their bubble against the
DeepSeek-V3 report's Table 2, their memory against 1F1B's, the forward-backward pairs that
hide the expert all-to-all, and the degrees they refuse."""

from __future__ import annotations

from typing import Any

import pytest

import llmpar
from llmpar.strategies.pipeline import (
    BACKWARD_PASS,
    FORWARD_PASS,
    MIRROR_EXCHANGE,
    WEIGHT_PASS,
    PipelineConfig,
    PipelineParallel,
    bubble_fraction,
    paired_chunk_share,
    table2_bubble,
)

SESSION = llmpar.Session(load_entry_points=False)


def plan_of(schedule: str, p: int = 8, m: int = 32, model: str = "gpt-3-175b",
            parallel: dict[str, Any] | None = None, num_gpus: int = 64,
            **training: Any) -> llmpar.Plan:
    layout: dict[str, Any] = {"pipeline": {"degree": p, "schedule": schedule},
                              "tensor": {"degree": 8}, **(parallel or {})}
    return SESSION.evaluate({
        "model": model, "hardware": {"cluster": "dgx-a100", "num_gpus": num_gpus},
        "training": {"sequence_length": 2048, "micro_batch_size": 1, "global_batch_size": m,
                     "recompute": "selective", **training},
        "parallel": layout})


def problems_of(schedule: str, **kwargs: Any) -> list[tuple[str, str]]:
    with pytest.raises(llmpar.SpecError) as error:
        plan_of(schedule, **kwargs)
    return [(problem.path, problem.message) for problem in error.value.problems]


# --- the bubble: Table 2 --------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (1.0, 1.7, 0.9), (3.0, 5.0, 2.0)])
def test_table_2_of_the_deepseek_v3_report(p, f, b, w):
    # DeepSeek-V3 technical report, arXiv:2412.19437, Table 2 (and the DualPipe README's
    # table), with F&B = F + B: a forward and a backward chunk run together add up their
    # compute and hide each other's communication.
    assert table2_bubble("1f1b", p, f, b, w) == pytest.approx((p - 1) * (f + b))
    assert table2_bubble("zero-bubble", p, f, b, w) == pytest.approx((p - 1) * (f + b - 2 * w))
    assert table2_bubble("dualpipe", p, f, b, w) == pytest.approx(
        (p / 2 - 1) * ((f + b) + b - 3 * w))
    # DualPipeV on p ranks: PP = 2p stages of half a rank's layers, each pass half as long.
    half = (f / 2, b / 2, w / 2)
    assert table2_bubble("dualpipev", p, f, b, w) == pytest.approx(
        (2 * p / 2 - 1) * ((half[0] + half[1]) + half[1] - 3 * half[2]))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [16, 32, 64])
def test_the_closed_forms_are_table_2_over_a_ranks_compute(p, m):
    """1F1B's (p-1)/m and ZB-H1's (p-1)/(3m) are Table 2's bubbles over m (F + B) with
    the pass times llmpar assumes: one formula for every schedule."""
    compute = m * (FORWARD_PASS + BACKWARD_PASS)
    for schedule in ("1f1b", "zero-bubble", "dualpipe", "dualpipev"):
        expected = table2_bubble(schedule, p, FORWARD_PASS, BACKWARD_PASS, WEIGHT_PASS) / compute
        config = PipelineConfig(degree=p, schedule=schedule)
        assert bubble_fraction(config, m) == pytest.approx(expected)


def test_dualpipe_idles_less_than_zero_bubble_and_1f1b():
    # p = 8, m = 32: 1F1B 7/32, ZB-H1 7/96, DualPipe (8/2 - 1) x 2F / (32 x 3F) = 6/96.
    bubbles = {s: plan_of(s).bubble_fraction for s in ("1f1b", "zero-bubble", "dualpipe")}
    assert bubbles["1f1b"] == pytest.approx(7 / 32)
    assert bubbles["zero-bubble"] == pytest.approx(7 / 96)
    assert bubbles["dualpipe"] == pytest.approx(6 / 96)
    # DualPipeV on 8 ranks is DualPipe over 16 stages of half the layers: ZB-H1's bubble.
    assert plan_of("dualpipev").bubble_fraction == pytest.approx(7 / 96)


def test_two_stages_run_without_a_bubble_under_dualpipe():
    # (PP/2 - 1) = 0: each rank's two stages fill each other's idle time.
    assert plan_of("dualpipe", p=2, m=4, num_gpus=16).bubble_fraction == 0.0


# --- memory against 1F1B -------------------------------------------------------------


def test_dualpipe_holds_two_copies_of_the_parameters_and_p_plus_1_micro_batches():
    p = 8
    one, dual = plan_of("1f1b", p=p), plan_of("dualpipe", p=p)
    middle = p // 2  # stages 4 and 3: no embedding or output layer
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert getattr(dual.stages[middle], field) == pytest.approx(
            2 * getattr(one.stages[middle], field), rel=1e-9)
    # Table 2: PP + 1 micro-batches of activations on every rank: p - h of its own stage
    # (the stage rows) and h + 1 of its mirror's, h = min(i, p-1-i); 1F1B's first stage PP.
    assert [s.micro_batches_in_flight for s in dual.stages] == [
        p - min(i, p - 1 - i) for i in range(p)]
    assert one.stages[0].micro_batches_in_flight == p
    assert dual.stages[middle].activations_bytes == pytest.approx(
        (p + 1) / (p - middle) * one.stages[middle].activations_bytes, rel=1e-9)


def test_dualpipe_end_ranks_hold_the_embedding_and_the_output_layer():
    """Rank 0 holds stage 0 (the embedding) and stage p-1 (the output layer), and so does
    rank p-1 (deepseek-ai/DualPipe examples/example_dualpipe.py builds full_modules[rank]
    and full_modules[pp_size - 1 - rank] on each rank)."""
    one, dual = plan_of("1f1b"), plan_of("dualpipe")
    ends = one.stages[0].weights_bytes + one.stages[-1].weights_bytes
    assert dual.stages[0].weights_bytes == pytest.approx(ends, rel=1e-12)
    assert dual.stages[-1].weights_bytes == pytest.approx(ends, rel=1e-12)


def test_dualpipev_holds_one_copy_and_puts_both_ends_on_rank_0():
    p = 8  # Llama-3-70B: 80 layers in 16 chunks of 5, an output layer apart from the embedding
    one, v = (plan_of(s, p=p, model="llama-3-70b") for s in ("1f1b", "dualpipev"))
    total = sum(s.weights_bytes for s in one.stages)
    assert sum(s.weights_bytes for s in v.stages) == pytest.approx(total, rel=1e-9)
    # rank 0 holds the first chunk (embedding) and the last (output layer)
    assert v.stages[0].weights_bytes == pytest.approx(
        one.stages[0].weights_bytes + one.stages[-1].weights_bytes - one.stages[1].weights_bytes,
        rel=1e-9)
    # PP + 1 = 2p + 1 chunks of half a rank's layers: p + 1/2 micro-batches of a rank's
    assert [s.micro_batches_in_flight for s in v.stages] == [p + 0.5] * p


def test_dualpipe_sums_each_stage_copy_with_its_mirror_once_per_step():
    dual = plan_of("dualpipe")
    (exchange,) = [c for c in dual.collectives if c.name == MIRROR_EXCHANGE]
    assert exchange.calls_per_step == 1.0 and exchange.operation == "send-recv"
    # both copies' gradients of the average stage: 2 x the 1F1B stage's
    stages = plan_of("1f1b").stages
    average = sum(s.gradients_bytes for s in stages) / len(stages)
    assert exchange.buffer_bytes == pytest.approx(2 * average, rel=1e-6)
    assert not [c for c in plan_of("dualpipev").collectives if c.name == MIRROR_EXCHANGE]


# --- the overlap of forward and backward chunk pairs ---------------------------------


MIXTRAL = dict(model="mixtral-8x7b", p=4, m=32, num_gpus=16,
               parallel={"tensor": {"degree": 2}, "sequence": {}, "expert": {"degree": 2}})


def a2a(plan: llmpar.Plan) -> Any:
    (found,) = [c for c in plan.collectives if c.name == "expert.all-to-all"]
    return found


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_paired_chunks_hide_the_expert_all_to_all(schedule):
    plain, paired = a2a(plan_of("1f1b", **MIXTRAL)), a2a(plan_of(schedule, **MIXTRAL))
    p, m = MIXTRAL["p"], MIXTRAL["m"] // 2  # data degree 2
    share = paired_chunk_share(schedule, p, m)
    # rank 0's unpaired chunks: DualPipe's 3p/2 - 1 of m, DualPipeV's 3p - 1 of 2m
    unpaired = (1.5 * p - 1) / m if schedule == "dualpipe" else (3 * p - 1) / (2 * m)
    assert 1 - share == pytest.approx(unpaired)
    assert plain.exposed_seconds == pytest.approx(plain.seconds)
    assert paired.exposed_seconds == pytest.approx(paired.seconds * (1 - share), rel=1e-6)


def test_dualpipe_sends_hide_behind_the_paired_compute():
    sends = {s: [c for c in plan_of(s).collectives if c.name == "pipeline.send-recv"][0]
             for s in ("1f1b", "dualpipe")}
    assert sends["1f1b"].exposed_seconds == pytest.approx(sends["1f1b"].seconds)
    assert sends["dualpipe"].exposed_seconds < sends["dualpipe"].seconds / 10


def test_the_share_of_paired_chunks_grows_with_the_micro_batches():
    shares = [paired_chunk_share("dualpipe", 8, m) for m in (16, 32, 64, 128)]
    assert shares == sorted(shares) and shares[0] > 0 and shares[-1] < 1
    assert paired_chunk_share("1f1b", 8, 64) == 0.0
    assert paired_chunk_share("dualpipe", 1, 64) == 0.0


# --- the other schedules are untouched -----------------------------------------------


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "gpipe", "zero-bubble"])
def test_the_other_schedules_share_nothing_and_hold_one_copy(schedule):
    config = PipelineConfig(degree=4, schedule=schedule,
                            virtual_stages=2 if schedule == "interleaved" else 1)
    assert PipelineParallel().shared_settings(config) == {}
    plan = plan_of(schedule, p=4, m=16, num_gpus=32)
    assert not [c for c in plan.collectives if c.name == MIRROR_EXCHANGE]
    # the default schedule, spelled or not, is the same plan
    if schedule == "1f1b":
        spec = {"model": "gpt-3-175b", "hardware": {"cluster": "dgx-a100", "num_gpus": 32},
                "training": {"sequence_length": 2048, "micro_batch_size": 1,
                             "global_batch_size": 16, "recompute": "selective"},
                "parallel": {"pipeline": {"degree": 4}, "tensor": {"degree": 8}}}
        assert SESSION.evaluate(spec).to_dict() == plan.to_dict()


# --- refusals --------------------------------------------------------------------------


def test_dualpipe_needs_an_even_number_of_stages():
    # deepseek-ai/DualPipe dualpipe.py, DualPipe.step: `assert num_ranks % 2 == 0`
    found = problems_of("dualpipe", p=3, m=48, model="llama-3-8b", num_gpus=24,
                        parallel={"pipeline": {"degree": 3, "schedule": "dualpipe",
                                               "layers_per_stage": [11, 10, 11]}})
    assert [path for path, _ in found] == ["$.parallel.pipeline.degree"]
    assert "even number of stages" in found[0][1] and "3" in found[0][1]


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_dual_schedules_need_twice_the_ranks_in_micro_batches(schedule):
    # dualpipe.py and dualpipev.py, step: `assert num_chunks >= num_ranks * 2`
    found = problems_of(schedule, p=8, m=8)
    assert [path for path, _ in found] == ["$.parallel.pipeline.schedule"]
    assert "16 micro-batches" in found[0][1] and "got 8" in found[0][1]


def test_dualpipe_needs_an_even_number_of_micro_batches():
    # dualpipe.py, step: `num_chunks % 2 == 0` (half enter from each end)
    found = problems_of("dualpipe", p=4, m=17, num_gpus=32)
    assert [path for path, _ in found] == ["$.parallel.pipeline.schedule"]
    assert "even number of micro-batches" in found[0][1]


def test_dualpipev_needs_layers_that_split_into_2p_chunks():
    # GPT-3's 96 layers over 2 x 32 chunks of a V: 96 % 64 != 0
    found = problems_of("dualpipev", p=32, m=64, num_gpus=256)
    assert ("$.parallel.pipeline.degree" in [path for path, _ in found])
    assert any("2 x degree (64)" in message for _, message in found)


def test_dualpipe_with_uneven_mirror_stages_says_how_it_is_costed():
    plan = plan_of("dualpipe", p=4, m=16, num_gpus=32, parallel={
        "pipeline": {"degree": 4, "schedule": "dualpipe", "layers_per_stage": [20, 24, 24, 28]}})
    # each rank's two stages are costed one by one (tests/test_dualpipe_mirrors.py): a
    # note, no longer a warning
    notes = [note["text"] for note in plan.to_dict()["training"]["notes"]]
    assert any("[20, 24, 24, 28] layers" in note and "mirror" in note for note in notes)
    assert not any("mirror" in w for w in plan.warnings)
    assert not any("mirror" in w for w in plan_of("dualpipe", p=4, m=16, num_gpus=32).warnings)


# --- search ------------------------------------------------------------------------------


def _searched(schedule: str | None = None) -> list[Any]:
    table = {} if schedule is None else {"pipeline": {"schedule": schedule}}
    spec = {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 32},
            "training": {"sequence_length": 4096, "global_batch_size": 128,
                         "recompute": "full"},
            "parallel": table,
            "search": {"micro_batch_sizes": [1], "recompute": ["full"], "top": 2000,
                       "values": {"tensor.degree": [2], "pipeline.degree": [4],
                                  "data.zero": [1]}}}
    return list(llmpar.search(spec, session=SESSION).results)


def test_search_tries_dualpipe_and_dualpipev_apart():
    # each rank's stages differ from the other schedules' under both (DualPipe's rank i
    # holds stages i and p-1-i): each is searched alone, where the table names it
    schedules = {r.choices["pipeline.schedule"] for r in _searched()}
    assert not schedules & {"dualpipe", "dualpipev"} and "1f1b" in schedules
    for schedule in ("dualpipe", "dualpipev"):
        alone = _searched(schedule)
        assert alone and {r.choices["pipeline.schedule"] for r in alone} == {schedule}


@pytest.mark.parametrize("schedule", [None, "dualpipe", "dualpipev"])
def test_the_fast_search_ranks_the_dual_schedules_as_evaluation_does(schedule):
    table = {} if schedule is None else {"pipeline": {"schedule": schedule}}
    spec = {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 32},
            "training": {"sequence_length": 4096, "global_batch_size": 128,
                         "recompute": "full"},
            "parallel": table,
            "search": {"micro_batch_sizes": [1], "recompute": ["full"], "top": 50,
                       "values": {"tensor.degree": [2], "pipeline.degree": [4],
                                  "data.zero": [1]}}}
    fast = llmpar.search(spec, session=SESSION)
    exact = llmpar.search(spec, session=SESSION, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in exact.results]
