"""Parallel strategies against published formulas and physical rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar

# A GPT-3 175B-style block (Korthikanti et al. 2022, Table 3: a = 96, h = 12288, s = 2048).
GPT3 = "gpt-3-175b"


def plan_for(parallel=None, model=GPT3, num_gpus=8, **training):
    training = {"sequence_length": 2048, "micro_batch_size": 1, **training}
    return llmpar.evaluate({"model": model, "hardware": {"cluster": "dgx-a100",
                                                         "num_gpus": num_gpus},
                            "training": training, "parallel": parallel or {}})


def layer_bytes(plan) -> float:
    return sum(row.bytes for row in plan.activation_tensors if row.per_layer)


S, B, H, A = 2048, 1, 12288, 96


@pytest.mark.parametrize(
    ("parallel", "recompute", "expected"),
    [
        # Korthikanti et al. 2022, Table 2.
        ({"tensor": {"degree": 8}}, "none", S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),
        ({"tensor": {"degree": 8}, "sequence": {}}, "none", S * B * H * (34 + 5 * A * S / H) / 8),
        ({"tensor": {"degree": 8}}, "selective", S * B * H * (10 + 24 / 8)),
        ({"tensor": {"degree": 8}, "sequence": {}}, "selective", S * B * H * 34 / 8),
        ({"tensor": {"degree": 8}}, "full", 2 * S * B * H),
        ({"tensor": {"degree": 8}, "sequence": {}}, "full", 2 * S * B * H / 8),
    ],
)
def test_korthikanti_table_2(parallel, recompute, expected):
    plan = plan_for(parallel, recompute=recompute, activation_model="korthikanti")
    assert layer_bytes(plan) == pytest.approx(expected, rel=1e-12)


def test_interleaved_first_stage_holds_1_plus_p_minus_1_over_pv():
    # Korthikanti et al. 2022, Sec. 4.2.3: the first stage holds L layers' worth of
    # activations (p micro-batches x L/p layers) times 1 + (p-1)/(p*v).
    p, v, m = 8, 3, 16
    spec = dict(global_batch_size=m, recompute="selective")
    interleaved = plan_for({"pipeline": {"degree": p, "schedule": "interleaved",
                                         "virtual_stages": v}, "tensor": {"degree": 8},
                            "sequence": {}}, num_gpus=64, **spec)
    one_f_one_b = plan_for({"pipeline": {"degree": p}, "tensor": {"degree": 8}, "sequence": {}},
                           num_gpus=64, **spec)
    first = [s for s in interleaved.stages if s.stage == 0][0]
    base = [s for s in one_f_one_b.stages if s.stage == 0][0]
    assert first.micro_batches_in_flight == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert first.activations_bytes / base.activations_bytes == pytest.approx(
        1 + (p - 1) / (p * v), rel=1e-6)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 8, 4), (8, 3, 16), (4, 2, 8), (2, 4, 2)])
def test_interleaved_ranks_hold_their_warm_up_chunks(p, v, m):
    """Megatron-Core's interleaved schedule (megatron/core/pipeline_parallel/schedules.py
    get_pp_rank_microbatches): rank r runs 2(p-r-1) + (v-1)p chunk forwards (at most all
    m*v) before its first backward and holds one more, each chunk 1/v of its layers; the
    last rank holds nearly p micro-batches, not 1F1B's one. Hand-count of the schedule
    table for p = 4, v = 8, m = 4 (Megatron's gpt3_7b_tp1_pp4_memory_speed test): the last
    rank's 28 warm-up forwards and one more, 29/8 micro-batches."""
    plan = plan_for({"pipeline": {"degree": p, "schedule": "interleaved", "virtual_stages": v},
                     "tensor": {"degree": 8}, "sequence": {}}, num_gpus=8 * p,
                    global_batch_size=m, recompute="selective")
    held = {s.stage: s.micro_batches_in_flight for s in plan.stages}
    for rank in range(p):
        chunks = min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)
        assert held[rank] == pytest.approx(chunks / v)
        assert held[rank] <= m
    if (p, v, m) == (4, 8, 4):
        assert held[p - 1] == pytest.approx(29 / 8)


def test_interleaved_last_rank_holds_the_output_layer_of_one_micro_batch():
    """The interleaved schedule's last rank runs each micro-batch's last chunk and at
    once its backward (Megatron-Core get_schedule_table): its layers' tensors of
    (2(p-r-1) + (v-1)p + 1)/v micro-batches, the output layer's and loss's of one. GPT-3
    175B, p = 4, v = 2, m = 8, no other split: the last stage's activations are 1F1B's
    layers at 7/2 micro-batches plus its head tensors once."""
    from llmpar.evaluation.facts import head_tag_bytes
    from llmpar.footprint.baseline import baseline_footprint

    p, v, m = 4, 2, 8
    parallel = {"pipeline": {"degree": p, "schedule": "interleaved", "virtual_stages": v}}
    interleaved = plan_for(parallel, num_gpus=p, global_batch_size=m, recompute="selective")
    flat = plan_for({"pipeline": {"degree": p}}, num_gpus=p, global_batch_size=m,
                    recompute="selective")
    spec = llmpar.Session()._checked({"model": GPT3, "hardware": {
        "cluster": "dgx-a100", "num_gpus": 1}, "training": {
        "sequence_length": 2048, "micro_batch_size": 1, "recompute": "selective"}}, None)[0]
    head = sum(head_tag_bytes(baseline_footprint(spec).activations).values())
    last, one = interleaved.stages[-1], flat.stages[-1]
    assert one.micro_batches_in_flight == 1
    assert last.micro_batches_in_flight == pytest.approx((0 + (v - 1) * p + 1) / v)
    layers = one.activations_bytes - head
    assert last.activations_bytes == pytest.approx(layers * 5 / 2 + head, rel=1e-9)


@pytest.mark.parametrize(("stage", "per_gpu_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_7_5b_on_64_gpus(stage, per_gpu_gb):
    # Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, N_d = 64, K = 12.
    plan = llmpar.evaluate({"model": {"parameters": 7.5e9},
                            "hardware": {"cluster": "dgx-a100", "num_gpus": 64},
                            "parallel": {"data": {"zero": stage}}})
    states = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
    assert states / 1e9 == pytest.approx(per_gpu_gb, abs=0.05)


def test_zero_3_moves_one_and_a_half_times_an_all_reduce():
    # ZeRO paper, Sec. 7.2.2: stage 3 communicates 3 Psi against 2 Psi for an all-reduce.
    def traffic(zero):
        plan = llmpar.evaluate({"model": {"parameters": 7.5e9},
                                "hardware": {"cluster": "dgx-a100", "num_gpus": 64},
                                "parallel": {"data": {"zero": zero}}})
        return sum(c.seconds for c in plan.collectives)

    assert traffic(3) / traffic(0) == pytest.approx(1.5, rel=0.01)


def test_tensor_parallel_all_reduces_per_layer():
    # Narayanan et al. 2021, Sec. 3.2: 2 all-reduces forward and 2 backward per layer;
    # the backward ones (input gradients) can run behind the weight gradients.
    plan = plan_for({"tensor": {"degree": 8}}, global_batch_size=1)
    outputs, gradients = [c for c in plan.collectives if c.strategy == "tensor"]
    assert outputs.calls_per_step == gradients.calls_per_step == 2 * 96
    assert outputs.buffer_bytes == gradients.buffer_bytes == S * B * H * 2
    assert outputs.tier == gradients.tier == "intra-node"
    assert outputs.exposed_seconds == outputs.seconds and gradients.exposed_seconds == 0
    synchronous = plan_for({"tensor": {"degree": 8, "overlap_backward": False}},
                           global_batch_size=1)
    assert [c.exposed_seconds for c in synchronous.collectives] == [
        c.seconds for c in synchronous.collectives]


def test_sequence_parallel_overlaps_the_input_gradient_reduce_scatters():
    sp = plan_for({"tensor": {"degree": 8}, "sequence": {}}, global_batch_size=1)
    hidden = [c for c in sp.collectives if c.exposed_seconds < c.seconds]
    assert [(c.operation, c.calls_per_step) for c in hidden] == [("reduce-scatter", 2 * 96)]
    off = plan_for({"tensor": {"degree": 8}, "sequence": {"overlap_backward": False}},
                   global_batch_size=1)
    assert off.exposed_communication_seconds == pytest.approx(sp.communication_seconds)


def test_sequence_parallel_keeps_the_traffic_of_the_all_reduces():
    tp = plan_for({"tensor": {"degree": 8}}, global_batch_size=1)
    sp = plan_for({"tensor": {"degree": 8}, "sequence": {}}, global_batch_size=1)
    assert sum(c.seconds for c in sp.collectives) == pytest.approx(
        sum(c.seconds for c in tp.collectives), rel=0.01)
    assert {c.operation for c in sp.collectives} == {"all-gather", "reduce-scatter"}


def test_tensor_group_past_a_node_crosses_the_network():
    plan = plan_for({"tensor": {"degree": 16}}, num_gpus=16, global_batch_size=1)
    assert {c.tier for c in plan.collectives if c.strategy == "tensor"} == {"inter-node"}


@pytest.mark.parametrize(("schedule", "v", "expected"),
                         [("1f1b", 1, 7 / 32), ("gpipe", 1, 7 / 32),
                          ("interleaved", 2, 7 / 64), ("zero-bubble", 1, 7 / 96)])
def test_bubble_by_schedule(schedule, v, expected):
    plan = plan_for({"pipeline": {"degree": 8, "schedule": schedule, "virtual_stages": v}},
                    num_gpus=8, global_batch_size=32)
    assert plan.bubble_fraction == pytest.approx(expected)


@given(st.integers(1, 5), st.integers(0, 5))
def test_bubble_is_zero_without_pipeline_and_falls_with_micro_batches(log_p, extra):
    p = 2 ** log_p
    m = p * (1 + extra)
    few = plan_for({"pipeline": {"degree": p}}, num_gpus=p, global_batch_size=m)
    more = plan_for({"pipeline": {"degree": p}}, num_gpus=p, global_batch_size=2 * m)
    assert more.bubble_fraction < few.bubble_fraction
    assert plan_for({}, num_gpus=1).bubble_fraction == 0


def test_embedding_and_output_layer_sit_on_first_and_last_stage():
    plan = llmpar.evaluate({"model": "llama-2-7b", "hardware": {"cluster": "dgx-h100",
                                                                 "num_gpus": 4},
                            "training": {"sequence_length": 1024, "global_batch_size": 8},
                            "parallel": {"pipeline": {"degree": 4}}})
    first, middle, last = plan.stages[0], plan.stages[1], plan.stages[3]
    table = 32000 * 4096 * 2  # one vocabulary matrix in bf16
    assert first.weights_bytes - middle.weights_bytes == pytest.approx(table, rel=1e-3)
    assert last.weights_bytes - middle.weights_bytes == pytest.approx(table + 4096 * 2, rel=1e-3)


def test_uneven_layers_per_stage():
    plan = llmpar.evaluate({"model": "llama-2-7b", "hardware": {"cluster": "dgx-h100",
                                                                 "num_gpus": 4},
                            "training": {"sequence_length": 1024, "global_batch_size": 8},
                            "parallel": {"pipeline": {"degree": 4,
                                                      "layers_per_stage": [7, 9, 9, 7]}}})
    assert [s.layers for s in plan.stages] == [7, 9, 9, 7]


@pytest.mark.parametrize(
    ("parallel", "path", "fragment"),
    [
        ({"tensor": {"degree": 5}}, "$.parallel.tensor.degree",
         "tensor degree (5) must divide model.num_attention_heads (96)"),
        ({"pipeline": {"degree": 7}}, "$.parallel.pipeline.degree",
         "model.num_layers (96) must be divisible by degree (7)"),
        ({"pipeline": {"degree": 2, "layers_per_stage": [40, 40]}},
         "$.parallel.pipeline.layers_per_stage", "summing to model.num_layers (96)"),
        ({"context": {"degree": 4}, "data": {"degree": 2}}, "$.parallel.context.degree",
         "training.sequence_length (2044) must be divisible by 2 x context degree (8)"),
        ({"expert": {"degree": 2}}, "$.parallel.expert.degree", "needs [model.moe]"),
    ],
)
def test_layout_errors_quote_their_operands(parallel, path, fragment):
    sequence = 2044 if "context" in parallel else 2048
    with pytest.raises(llmpar.SpecError) as caught:
        plan_for(parallel, sequence_length=sequence)
    assert any(p.path == path and fragment in p.message for p in caught.value.problems), (
        caught.value.problems)


def test_expert_parallel_splits_experts_and_adds_all_to_alls():
    spec = {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "training": {"sequence_length": 4096, "global_batch_size": 8},
            "parallel": {"tensor": {"degree": 2}, "sequence": {}, "expert": {"degree": 8}}}
    plan = llmpar.evaluate(spec)
    assert plan.layout["data"] == 8 and plan.layout["expert"] == 8
    base = llmpar.evaluate({**spec, "parallel": {"tensor": {"degree": 2}, "sequence": {}}})
    experts = plan.parameters_by_group["experts"]
    saved = (base.weights_bytes - plan.weights_bytes) / 2  # bf16 weights
    assert saved == pytest.approx(experts / 2 * (1 - 1 / 8), rel=1e-6)
    (a2a,) = [c for c in plan.collectives if c.strategy == "expert"]
    assert a2a.operation == "all-to-all" and a2a.group_size == 8
    assert a2a.calls_per_step == 4 * 32  # dispatch + combine, forward and backward


DEGREE_SPECS = [
    ("tensor", "degree", [1, 2, 4, 8]),
    ("pipeline", "degree", [1, 2, 4, 8]),
    ("context", "degree", [1, 2, 4, 8]),
]


@pytest.mark.parametrize(("strategy", "key", "degrees"), DEGREE_SPECS)
def test_per_gpu_memory_never_grows_with_a_splitting_degree(strategy, key, degrees):
    totals = [plan_for({strategy: {key: d}}, model="llama-2-70b", num_gpus=8,
                       global_batch_size=8, sequence_length=4096).total_bytes
              for d in degrees]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_sharded_totals_add_up_over_ranks(zero):
    # Nothing lost, nothing double-counted: summed over the data ranks, each sharded
    # component equals the unsharded replica's.
    base = plan_for({}, model="llama-2-7b", num_gpus=1)
    plan = plan_for({"data": {"zero": zero}}, model="llama-2-7b", num_gpus=8,
                    global_batch_size=8)
    sharded = ("optimizer", "gradients", "weights")[:zero]
    for component in ("weights", "gradients", "optimizer"):
        ranks = 8 if component in sharded else 1
        summed = getattr(plan, f"{component}_bytes") * ranks
        assert summed == pytest.approx(getattr(base, f"{component}_bytes"), abs=8)


def test_tensor_and_pipeline_shards_add_up_over_ranks():
    base = plan_for({}, model="llama-2-7b", num_gpus=1)
    plan = plan_for({"tensor": {"degree": 4}, "pipeline": {"degree": 2}}, model="llama-2-7b",
                    num_gpus=8, global_batch_size=8)
    # Norms stay whole on every tensor rank: add them back once per extra rank.
    norms = base.parameters_by_group["norms"] * 2  # bf16
    summed = sum(stage.weights_bytes for stage in plan.stages) * 4
    assert summed == pytest.approx(base.weights_bytes + 3 * norms, rel=1e-6)


@pytest.mark.parametrize("strategy", ["tensor", "pipeline", "context", "expert", "data"])
def test_every_strategy_is_the_identity_at_degree_1(strategy):
    table = {"degree": 1}
    base = plan_for({}, num_gpus=1)
    plan = plan_for({strategy: table}, num_gpus=1)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                  "step_seconds"):
        assert getattr(plan, field) == getattr(base, field), field
    assert plan.collectives == base.collectives


def test_full_recompute_of_the_first_layers_of_each_stage():
    # Megatron-LM --recompute-method block --recompute-num-layers 2: of each stage's
    # 6 layers, 2 keep only their 2sbh input and 4 keep everything.
    parallel = {"tensor": {"degree": 8}, "sequence": {}, "pipeline": {"degree": 16}}
    spec = dict(global_batch_size=16, num_gpus=128)
    none = plan_for(parallel, **spec)
    full = plan_for(parallel, recompute="full", **spec)
    partial = plan_for(parallel, recompute="full", recompute_layers=2, **spec)
    last = -1  # the last stage holds one micro-batch and the output layer
    per_layer_none = (none.stages[last].activations_bytes
                      - full.stages[last].activations_bytes) / 6
    saved = none.stages[last].activations_bytes - partial.stages[last].activations_bytes
    assert saved == pytest.approx(2 * per_layer_none, rel=1e-9)
    extra_full = full.hardware_flops_per_step - none.hardware_flops_per_step
    extra_partial = partial.hardware_flops_per_step - none.hardware_flops_per_step
    assert extra_partial == pytest.approx(extra_full * 2 / 6, rel=1e-9)


def mixtral(expert: dict, sequence: bool = True):
    parallel = {"tensor": {"degree": 2}, "expert": expert, "data": {"zero": 1}}
    if sequence:
        parallel["sequence"] = {}
    return {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 16},
            "training": {"sequence_length": 4096, "global_batch_size": 64,
                         "recompute": "full"},
            "parallel": parallel}


def test_expert_tensor_degree_folds_expert_ranks_into_the_tensor_ranks():
    """Mixtral-8x7B on 16 H100, TP2 with sequence parallelism, EP8. With the default
    expert tensor degree (= TP2) the expert ranks step over the tensor ranks and the
    all-to-all spans both nodes; with expert tensor degree 1 (MoE parallel folding) the
    8 expert ranks are 8 neighbours in one node, each holding whole experts."""
    default = llmpar.evaluate(mixtral({"degree": 8}))
    folded = llmpar.evaluate(mixtral({"degree": 8, "tensor_degree": 1}))
    a2a = {p: [c for c in plan.collectives if c.strategy == "expert"][0]
           for p, plan in (("default", default), ("folded", folded))}
    assert a2a["default"].tier == "inter-node" and a2a["folded"].tier == "intra-node"
    experts = 45_097_156_608  # Mixtral-8x7B's routed-expert parameters
    bytes_per_weight = 2
    assert default.weights_bytes - folded.weights_bytes == pytest.approx(
        -experts / 8 / 2 * bytes_per_weight, rel=1e-3)


@pytest.mark.parametrize(("expert", "sequence", "says"), [
    ({"degree": 8, "tensor_degree": 4}, True, "must divide the tensor degree"),
    ({"degree": 8, "tensor_degree": 1}, False, "needs [parallel.sequence]"),
])
def test_expert_tensor_degree_errors(expert, sequence, says):
    with pytest.raises(llmpar.SpecError) as error:
        llmpar.evaluate(mixtral(expert, sequence))
    assert any(p.path == "$.parallel.expert.tensor_degree" and says in p.message
               for p in error.value.problems)


def test_deepep_sends_a_token_once_per_remote_node():
    """DeepSeek-V3's top-8 over EP64 on 8 nodes of 8: NCCL's all-to-all sends 7/8 of the
    8 routed copies over the network, DeepEP each token once per other node hosting one
    of its experts, 7 x (1 - (7/8)^8) = 4.59 on average under uniform routing."""
    from llmpar.strategies.expert import network_copies
    nccl, deepep = network_copies("all-to-all", 8, 64, 8), network_copies("deepep", 8, 64, 8)
    assert nccl * 56 / 64 == pytest.approx(7.0)
    assert deepep * 56 / 64 == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert network_copies("deepep", 8, 8, 8) == 8.0  # one node: NVLink only, as NCCL


def test_deepep_dispatch_costs_less_across_nodes():
    spec = mixtral({"degree": 8}, sequence=True)
    nccl = llmpar.evaluate(spec)
    spec["parallel"]["expert"] = {"degree": 8, "dispatcher": "deepep"}
    deepep = llmpar.evaluate(spec)
    (a, ), (b, ) = ([c for c in p.collectives if c.strategy == "expert"] for p in (nccl, deepep))
    assert a.tier == b.tier == "inter-node"
    assert b.seconds < a.seconds


def test_strategies_see_the_trainable_parameters_of_each_stage():
    from llmpar.evaluation.stages import whole_model_stage
    from llmpar.footprint.baseline import baseline_footprint
    from llmpar.strategies.pipeline import PipelineConfig, PipelineParallel

    session = llmpar.Session(load_entry_points=False)
    spec = session.load_spec({"model": "llama-3-8b",
                              "hardware": {"cluster": "dgx-a100", "num_gpus": 8},
                              "parallel": {"pipeline": {"degree": 4}}})
    layout = llmpar.Layout(degrees={"pipeline": 4, "data": 2}, num_gpus=8)
    ctx = llmpar.StrategyContext(spec=spec, footprint=baseline_footprint(spec), layout=layout)
    stages = PipelineParallel().transform(PipelineConfig(degree=4), ctx).stages
    per_stage = [ctx.trainable_in(stage) for stage in stages]
    whole = ctx.trainable_in(whole_model_stage(spec))
    assert sum(sum(p.values()) for p in per_stage) == pytest.approx(sum(whole.values()))
    assert per_stage[0]["embedding"] > 0 and per_stage[0]["head"] == 0
    assert per_stage[-1]["head"] > 0
