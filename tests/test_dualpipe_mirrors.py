"""DualPipe's mirror stages: rank i holds stage i and stage p-1-i (DeepSeek-V3 report,
arXiv:2412.19437, Sec. 3.2.1; deepseek-ai/DualPipe examples/example_dualpipe.py), each with
its own layers, parameters and micro-batches in flight, under uneven and even splits."""

from __future__ import annotations

from typing import Any

import pytest

import llmpar
from llmpar.strategies.pipeline import PipelineConfig, distinct_mirrors

SESSION = llmpar.Session(load_entry_points=False)


def llama(counts: list[int], schedule: str = "dualpipe") -> dict[str, Any]:
    """Llama-3-8B (32 layers) over 4 stages x 2 replicas of one DGX H100."""
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": {"sequence_length": 4096, "micro_batch_size": 1,
                         "global_batch_size": 16, "recompute": "none"},
            "parallel": {"pipeline": {"degree": 4, "schedule": schedule,
                                      "layers_per_stage": counts},
                         "data": {"degree": 2}}}


def stages(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return SESSION.evaluate(spec).to_dict()["stages"]


UNEVEN = [7, 8, 8, 9]


def test_each_rank_holds_its_stage_and_its_mirrors_parameters():
    # The same split under 1F1B gives each stage's weights alone (no sharding beside the
    # pipeline): rank i of DualPipe holds stage i's and stage p-1-i's.
    dual, single = stages(llama(UNEVEN)), stages(llama(UNEVEN, "1f1b"))
    for i, rank in enumerate(dual):
        mirror = single[len(single) - 1 - i]
        for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
            assert rank[key] == single[i][key] + mirror[key]


def test_activations_of_p_minus_h_and_h_plus_1_micro_batches():
    # Hand-check on rank 1 (h = 1) of p = 4: 3 micro-batches of its own 8 layers and 2 of
    # its mirror's 8, the p + 1 = 5 of the report's Table 2; one micro-batch of 8 layers is
    # what 1F1B's stage 1 holds per micro-batch in flight (3 there).
    dual, single = stages(llama(UNEVEN)), stages(llama(UNEVEN, "1f1b"))
    per_micro_batch = single[1]["activations_bytes"] / single[1]["micro_batches_in_flight"]
    assert dual[1]["activations_bytes"] == pytest.approx(5 * per_micro_batch, rel=1e-12)
    assert [s["micro_batches_in_flight"] for s in dual] == [4.0, 3.0, 3.0, 4.0]
    # rank 0: 4 micro-batches of stage 0 (7 layers and the embedding), 1 of stage 3 (9
    # layers and the output layer); rank 3 the reverse
    first = single[0]["activations_bytes"] / single[0]["micro_batches_in_flight"]
    last = single[3]["activations_bytes"] / single[3]["micro_batches_in_flight"]
    assert dual[0]["activations_bytes"] == pytest.approx(4 * first + last, rel=1e-12)
    assert dual[3]["activations_bytes"] == pytest.approx(4 * last + first, rel=1e-12)


def test_mirrors_even_out_the_work_of_uneven_stages():
    # 7 + 9 and 8 + 8 layers per rank: every rank runs 8 layers per micro-batch on
    # average, so the compute is that of the even split with the output layer's work
    # shared by ranks 0 and 3; under 1F1B the 9-layer stage paces the pipeline.
    uneven = SESSION.evaluate(llama(UNEVEN)).training.compute_seconds
    one = SESSION.evaluate(llama(UNEVEN, "1f1b")).training.compute_seconds
    assert uneven < one
    shifted = SESSION.evaluate(llama([6, 8, 8, 10])).training.compute_seconds
    assert shifted == pytest.approx(uneven, rel=1e-9)  # 6 + 10 = 7 + 9


def test_every_dualpipe_split_holds_each_ranks_two_stages():
    assert distinct_mirrors(PipelineConfig(degree=4, schedule="dualpipe"))
    assert not distinct_mirrors(PipelineConfig(degree=1, schedule="dualpipe"))
    assert not distinct_mirrors(PipelineConfig(degree=4, schedule="1f1b"))
    plan = SESSION.evaluate(llama([8, 8, 8, 8]))
    # p - h of the own stage (h = min(i, p-1-i)), p + 1 with the mirror's h + 1
    assert [s["micro_batches_in_flight"] for s in plan.to_dict()["stages"]] == [4.0, 3.0,
                                                                               3.0, 4.0]
    assert not any("dualpipe" in w for w in plan.warnings)


def test_an_even_split_puts_the_output_layer_on_both_end_ranks_for_half_the_work():
    """Rank 0 holds stage 0 (embedding) and stage 3 (output layer), rank 3 the same two:
    each runs the output layer for half the micro-batches, where two copies of stage 3 on
    rank 3 would run it for all of them. Hand-check: the even split's compute is 1F1B's
    over the same split less the last stage's extra work, the mean of the end stages'
    (each stage's 1F1B time is its work per micro-batch times m)."""
    even = [8, 8, 8, 8]
    dual = SESSION.evaluate(llama(even))
    one = SESSION.evaluate(llama(even, "1f1b"))
    # both end ranks hold an embedding's and an output layer's weights (untied, the same
    # size); a middle rank two stages of layers alone
    single = one.to_dict()["stages"]
    ranks = dual.to_dict()["stages"]
    for i in (0, 3):
        assert ranks[i]["weights_bytes"] == single[0]["weights_bytes"] + single[3]["weights_bytes"]
    assert ranks[1]["weights_bytes"] == 2 * single[1]["weights_bytes"]
    # the output layer's work spread over both ends: less compute than 1F1B's, paced by
    # the last stage, and less than two copies of the last stage would cost
    assert dual.training.compute_seconds < one.training.compute_seconds
    assert dual.training.compute_seconds == pytest.approx(
        SESSION.evaluate(llama([7, 8, 8, 9])).training.compute_seconds, rel=1e-9)


def test_the_split_is_stated_not_warned():
    plan = SESSION.evaluate(llama(UNEVEN))
    assert not any("uneven" in w for w in plan.warnings)
    assert any("mirror" in note["text"] for note in plan.to_dict()["training"]["notes"])


@pytest.mark.parametrize("counts", [UNEVEN, [8, 8, 8, 8]])
def test_the_search_fast_form_agrees_on_mirrors(counts):
    from llmpar.testing.fast_form import disagreements
    spec = SESSION.load_spec(llama(counts))
    assert list(disagreements(SESSION, spec)) == []
