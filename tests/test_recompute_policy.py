"""torchtitan's selective activation checkpointing: the op-level policy (`[training]
recompute_policy`, `selective_ac_option = "op"`) and the layer-level one (`[training]
recompute_layer_interval`, `selective_ac_option = "N"`)."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

import llmpar
from llmpar import SpecError
from llmpar.evaluation.stages import recomputed
from llmpar.footprint.baseline import baseline_footprint
from llmpar.footprint.op_checkpoint import (
    BlockOp,
    block_ops,
    kept_tensors,
    rerun_flops_per_sequence,
    rerun_products,
    rerun_shares,
    saved_ops,
)
from llmpar.testing.fast_form import disagreements

SESSION = llmpar.Session(load_entry_points=False)


def llama(recompute: str = "selective", layout: dict[str, Any] | None = None,
          **training: Any) -> dict[str, Any]:
    """Llama-3-8B under torchtitan on one DGX H100 (torchtitan's llama3_8b.toml runs
    selective_ac_option = "op")."""
    table: dict[str, Any] = {"framework": "torchtitan", "sequence_length": 8192,
                             "micro_batch_size": 1, "global_batch_size": 64,
                             "recompute": recompute, **training}
    return {"model": "llama-3-8b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": table, "parallel": layout or {"data": {"fsdp": True}}}


def op(policy: str = "op", **rest: Any) -> dict[str, Any]:
    return llama("selective", recompute_policy=policy, **rest)


def test_llama_block_saves_every_other_product():
    # torchtitan's counter over aten.mm: wq (1), wk (2), wv (3), wo (4), w1 (5), w3 (6),
    # w2 (7); the odd ones are saved, attention's output always.
    model = SESSION.load_spec(op()).model
    ops = block_ops(model)
    assert [o.name for o in ops] == ["wq", "wk", "wv", "attention", "wo", "w1", "w3", "w2"]
    saved = {o.name for o, kept in zip(ops, saved_ops(ops, "op")) if kept}
    assert saved == {"wq", "wv", "attention", "w1", "w2"}
    assert rerun_products(model, "op") == ("wk", "wo", "w3")
    assert rerun_products(model, "op-all-matmuls") == ()


def test_hand_check_one_llama_layer():
    # Llama-3-8B, b = 1, s = 8192, bf16 (2 bytes), unsplit: the layer input (h = 4096),
    # wq's output (32 heads x 128), wv's (8 x 128), attention's output (4096) and its fp32
    # log-sum-exp (32 heads per token), w1's (14336) and w2's (4096).
    spec = SESSION.load_spec(op())
    tokens = 8192
    per_token = 2 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4 * 32
    assert sum(t.bytes for t in kept_tensors(spec)) == tokens * per_token
    inventory = recomputed(baseline_footprint(spec).activations, spec)
    assert inventory.groups[0].layer_bytes == tokens * per_token
    # recomputed FLOPs: wk (4096 x 1024), wo (4096 x 4096), w3 (4096 x 14336), 2 FLOPs per
    # weight and token, 32 layers
    weights = 4096 * 1024 + 4096 * 4096 + 4096 * 14336
    assert rerun_flops_per_sequence(spec.model, tokens, "op") == 2 * tokens * 32 * weights


def test_memory_lies_between_no_and_full_recomputation():
    none = SESSION.evaluate(llama("none"))
    full = SESSION.evaluate(llama("full"))
    every = SESSION.evaluate(op("op-all-matmuls"))
    other = SESSION.evaluate(op("op"))
    assert (full.activations_bytes < other.activations_bytes < every.activations_bytes
            < none.activations_bytes)
    # and the FLOPs the other way round: saving less reruns more
    flops = [p.training.hardware_flops_per_step for p in (none, every, other, full)]
    assert flops == sorted(flops)
    assert flops[0] == flops[1]  # every product and attention saved: nothing reruns


def test_recompute_flops_are_the_sum_of_the_recomputed_products():
    none = SESSION.evaluate(llama("none")).training.hardware_flops_per_step
    spec = SESSION.load_spec(op())
    plan = SESSION.evaluate(spec)
    s = spec.training.sequence_length
    per_sequence = 2 * s * sum(o.weights for o, kept in zip(
        block_ops(spec.model), saved_ops(block_ops(spec.model), "op")) if not kept)
    expected = none + per_sequence * spec.model.num_layers * 64
    assert plan.training.hardware_flops_per_step == pytest.approx(expected, rel=1e-12)


def test_op_policy_reruns_the_all_gathers_not_the_reduce_scatters():
    layout = {"tensor": {"degree": 8}, "sequence": {}}

    def calls(spec: dict[str, Any]) -> dict[str, float]:
        plan = SESSION.evaluate(spec)
        return {c.name: c.calls_per_step for c in plan.collectives
                if c.strategy == "sequence"}

    plain = calls(llama("none", layout))
    policy = calls(op(**{}) | {"parallel": layout})
    full = calls(llama("full", layout))
    layers_times_micro_batches = 32 * 64
    gather = [name for name in plain if "gather" in name]
    scatter = [name for name in plain if "scatter" in name and "gradient" not in name]
    assert gather and scatter
    for name in gather:
        assert policy[name] == full[name] == plain[name] + 2 * layers_times_micro_batches
    for name in scatter:
        assert policy[name] == plain[name] < full[name]


def test_layer_interval_recomputes_every_nth_layer_of_a_stage():
    every = SESSION.evaluate(llama("full"))
    second = SESSION.evaluate(llama("full", recompute_layer_interval=2))
    first_half = SESSION.evaluate(llama("full", recompute_layers=16))
    # 32 layers, every second one: the same as the first 16 for a uniform model
    assert second.activations_bytes == first_half.activations_bytes
    assert (second.training.hardware_flops_per_step
            == first_half.training.hardware_flops_per_step)
    assert second.activations_bytes > every.activations_bytes
    one = SESSION.evaluate(llama("full", recompute_layer_interval=1))
    assert one.activations_bytes == every.activations_bytes
    # 5 does not divide 32: floor(32 / 5) = 6 layers
    fifth = SESSION.evaluate(llama("full", recompute_layer_interval=5))
    six = SESSION.evaluate(llama("full", recompute_layers=6))
    assert fifth.activations_bytes == six.activations_bytes


def test_layer_interval_counts_per_pipeline_stage():
    layout = {"pipeline": {"degree": 4}, "data": {"degree": 2}}
    interval = SESSION.evaluate(llama("full", layout, recompute_layer_interval=3))
    first = SESSION.evaluate(llama("full", layout, recompute_layers=2))  # 8 layers // 3
    assert interval.activations_bytes == first.activations_bytes


@pytest.mark.parametrize("training, expected", [
    ({"recompute": "full", "recompute_policy": "op"}, "policy of recompute = 'selective'"),
    ({"recompute_policy": "op", "recompute_modules": ["mlp"]}, "not both"),
    ({"recompute_policy": "op", "activation_model": "korthikanti"},
     "needs activation_model 'fused'"),
    ({"recompute_policy": "every"}, "must be one of"),
    ({"recompute_layer_interval": 2}, "under recompute = 'full'"),
    ({"recompute": "full", "recompute_layer_interval": 2, "recompute_layers": 4},
     "not both"),
])
def test_bad_policies_name_the_key(training, expected):
    spec = llama(**{"recompute": "selective", **training})
    with pytest.raises(SpecError, match=expected) as caught:
        SESSION.load_spec(spec)
    assert any("recompute_" in problem.path for problem in caught.value.problems)


def mixtral(recompute: str = "selective", layout: dict[str, Any] | None = None,
            **training: Any) -> dict[str, Any]:
    """Mixtral-8x7B (32 MoE layers, 8 experts, top-2, ffn_e 14336) at 4K tokens on one
    DGX H100 under torchtitan."""
    table: dict[str, Any] = {"framework": "torchtitan", "sequence_length": 4096,
                             "global_batch_size": 8, "recompute": recompute, **training}
    return {"model": "mixtral-8x7b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
            "training": table, "parallel": layout or {"data": {"fsdp": True}}}


EP8 = {"data": {"fsdp": True}, "expert": {"degree": 8}}


def test_moe_block_follows_torchtitan_b5bcd76c():
    # torchtitan b5bcd76c (models/common/moe.py MoE.forward): attention, then the router
    # gate (forced to recompute, not counted), top-k (saved), the grouped w1, w3, w2
    # (aten._grouped_mm: not in the save list, not counted). wq (1), wk (2), wv (3), wo (4).
    model = SESSION.load_spec(mixtral(recompute_policy="op")).model
    ops = block_ops(model, moe=True)
    assert [o.name for o in ops] == ["wq", "wk", "wv", "attention", "wo", "router gate",
                                     "router top-k", "expert w1", "expert w3", "expert w2"]
    for policy in ("op", "op-all-matmuls"):
        saved = {o.name for o, kept in zip(ops, saved_ops(ops, policy)) if kept}
        assert saved == {"wq", "wv", "attention", "router top-k"} | (
            {"wk", "wo"} if policy == "op-all-matmuls" else set())
    assert rerun_products(model, "op") == ("wk", "wo", "router gate", "expert w1",
                                           "expert w3", "expert w2")


def test_shared_experts_join_the_count_after_mla():
    # DeepSeek-V3: wq_a (1), wq_b (2), wkv_a (3), wkv_b (4), wo (5), then the shared
    # expert's w1 (6), w3 (7), w2 (8): w3 saved; its 3 dense layers count w1, w3, w2 as 6-8.
    model = SESSION.load_spec({"model": "deepseek-v3",
                               "hardware": {"cluster": "dgx-h100"}}).model
    ops = block_ops(model, moe=True)
    saved = [o.name for o, kept in zip(ops, saved_ops(ops, "op")) if kept]
    assert saved == ["wq_a", "wkv_a", "attention", "wo", "router top-k", "shared w3"]
    shares = rerun_shares(model, "op")
    assert shares["expert up"] == shares["expert down"] == shares["router"] == 1.0
    assert shares["shared expert down"] == 1.0 and 0 < shares["shared expert up"] < 1


def test_router_shape_is_forced_wherever_it_appears():
    # force_recompute_mm_shapes_by_fqns matches by weight shape: any aten.mm of the gate's
    # (h, E) is recomputed and left out of the count, before or after the gate.
    ops = (BlockOp(name="same shape", kind="mm", width=8, fan_in=64),
           BlockOp(name="router gate", kind="router", width=8, fan_in=64),
           BlockOp(name="other", kind="mm", width=16, fan_in=64),
           BlockOp(name="next", kind="mm", width=16, fan_in=64))
    assert saved_ops(ops, "op") == (False, False, True, False)


def test_hand_check_one_mixtral_layer():
    # b = 1, s = 4096, bf16, unsplit: the layer input (h = 4096), wq's output (32 x 128),
    # wv's (8 x 128), attention's (4096) and its fp32 log-sum-exp (32 per token): 26,624
    # bytes; top-k's fp32 scores and int64 ids, k = 2: 2 x 4 + 2 x 8 = 24. Nothing of the
    # experts is kept.
    spec = SESSION.load_spec(mixtral(recompute_policy="op"))
    tokens = 4096
    per_token = 2 * (4096 + 4096 + 1024 + 4096) + 4 * 32 + 2 * (4 + 8)
    assert per_token == 26_776 and "26,776" in concepts()
    assert sum(t.bytes for t in kept_tensors(spec, moe=True)) == tokens * per_token
    (group,) = recomputed(baseline_footprint(spec).activations, spec).groups
    assert group.kind == "moe" and group.layer_bytes == tokens * per_token
    # recomputed: wk (4096 x 1024), wo (4096 x 4096), the gate (4096 x 8) and the two
    # experts' w1, w3, w2 (3 x 4096 x 14336 each), 2 FLOPs per weight and token, 32 layers
    weights = 4096 * 1024 + 4096 * 4096 + 4096 * 8 + 2 * 3 * 4096 * 14336
    assert rerun_flops_per_sequence(spec.model, tokens, "op") == 2 * tokens * 32 * weights
    none = SESSION.evaluate(mixtral("none")).training.hardware_flops_per_step
    plan = SESSION.evaluate(spec)
    assert plan.training.hardware_flops_per_step == pytest.approx(
        none + 2 * tokens * 32 * weights * 8, rel=1e-12)


def test_expert_parallelism_keeps_the_all_to_all_outputs():
    # EP8: each MoE layer keeps the dispatch's and the combine's outputs, k = 2 copies of
    # the 4096 tokens' hidden states (4096 x 2 bytes) each, 32 layers, imbalance 1.
    plan = SESSION.evaluate(mixtral(layout=EP8, recompute_policy="op"))
    (memory,) = [d for d in plan.derivations if d.quantity == "activations_bytes"]
    exchanged = 2 * 2 * 4096 * 4096 * 2 * 32
    assert plan.activations_bytes == (memory.inputs["layers_bytes"]
                                      + memory.inputs["outside_layers_bytes"] + exchanged)
    assert f"{exchanged / 1e9:.2f} GB" in concepts()
    # no all-to-all runs again: the recomputation takes them from the cache
    calls = {c.name: c.calls_per_step for c in plan.collectives if c.strategy == "expert"}
    plain = {c.name: c.calls_per_step for c in SESSION.evaluate(mixtral("none", EP8)).collectives
             if c.strategy == "expert"}
    assert calls == plain


@pytest.mark.parametrize("layout", [None, EP8, {"tensor": {"degree": 2}, "sequence": {},
                                                "expert": {"degree": 4},
                                                "data": {"degree": 4}}])
def test_moe_memory_lies_between_no_and_full_recomputation(layout):
    none = SESSION.evaluate(mixtral("none", layout))
    full = SESSION.evaluate(mixtral("full", layout))
    every = SESSION.evaluate(mixtral(layout=layout, recompute_policy="op-all-matmuls"))
    other = SESSION.evaluate(mixtral(layout=layout, recompute_policy="op"))
    assert (full.activations_bytes < other.activations_bytes < every.activations_bytes
            < none.activations_bytes)
    flops = [p.training.hardware_flops_per_step for p in (none, every, other, full)]
    assert flops == sorted(flops) and flops[0] < flops[1]  # the experts rerun under both
    if layout is None:
        row = [f"{p.activations_bytes / 1e9:.2f} GB" for p in (other, none, full)]
        assert all(text in concepts() for text in row)


def test_moe_fast_form_agrees():
    spec = SESSION.load_spec(mixtral(layout={"tensor": {"degree": 2}, "sequence": {},
                                             "expert": {"degree": 4}, "data": {"degree": 4}},
                                     recompute_policy="op"))
    assert list(disagreements(SESSION, spec)) == []


def test_the_search_keeps_the_policy_to_selective_and_the_fast_form_agrees():
    spec = SESSION.load_spec(op(layout={"tensor": {"degree": 2}, "sequence": {},
                                        "data": {"degree": 4}}))
    assert spec.training.with_recompute("full").recompute_policy is None
    assert spec.training.with_recompute("selective").recompute_policy == "op"
    assert list(disagreements(SESSION, spec)) == []


def concepts() -> str:
    with open("docs/concepts.md", encoding="utf-8") as file:
        return file.read()


EXAMPLE = "specs/examples/llama-3-8b-torchtitan-op-sac-h100.toml"


@pytest.mark.parametrize("label, training", [
    ("none", {"recompute": "none", "recompute_policy": None}),
    ('`recompute_policy = "op-all-matmuls"`', {"recompute_policy": "op-all-matmuls"}),
    ('`recompute_policy = "op"`', {}),
    ("`recompute_layer_interval = 2`", {"recompute": "full", "recompute_policy": None,
                                        "recompute_layer_interval": 2}),
    ("full", {"recompute": "full", "recompute_policy": None}),
])
def test_concepts_table_is_what_llmpar_computes(label, training):
    with open(EXAMPLE, "rb") as file:
        table = tomllib.load(file)
    merged = {**table["training"], **training}
    table["training"] = {key: value for key, value in merged.items() if value is not None}
    plan = SESSION.evaluate(table)
    row = (f"| {label} | {plan.activations_bytes / 1e9:.2f} | "
           f"{plan.hardware_flops_per_step / plan.flops_per_step:.3f} | "
           f"{plan.step_seconds:.2f} |")
    assert row in concepts()
    if not training:
        assert "63,616" in concepts()
        spec = SESSION.load_spec(table)
        assert sum(t.bytes for t in kept_tensors(spec)) == 63_616 * 8192


def test_torchtitan_job_round_trip(tmp_path):
    from llmpar.launch.torchtitan import read_job
    base = SESSION.load_spec(EXAMPLE)
    job = tomllib.loads(SESSION.launch(EXAMPLE, "torchtitan").files[0].text)
    assert job["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    read = read_job("[activation_checkpoint]\nmode = \"selective\"\n"
                    "selective_ac_option = \"op\"\n", "job.toml", base)
    assert read.settings["training.recompute_policy"] == "op"
    interval = SESSION.load_spec(EXAMPLE, {"training.recompute": "full",
                                           "training.recompute_policy": None,
                                           "training.recompute_layer_interval": 2})
    job = tomllib.loads(SESSION.launch(interval, "torchtitan").files[0].text)
    assert job["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    read = read_job("[activation_checkpoint]\nmode = \"selective\"\n"
                    "selective_ac_option = \"2\"\n", "job.toml", base)
    assert read.settings["training.recompute"] == "full"
    assert read.settings["training.recompute_layer_interval"] == 2


def test_layer_interval_counts_the_kinds_of_the_layers_it_recomputes():
    # ERNIE-4.5-21B-A3B: its first layer is dense, the others MoE. Every second layer of
    # the one stage is layer 1, 3, 5...: all MoE, so the recomputed layers free MoE
    # layers' tensors, where "the first half" would recompute the dense layer 0 too.
    from llmpar.evaluation.stages import stage_inventory, whole_model_stage
    table = {"model": "ernie-4.5-21b-a3b", "hardware": {"cluster": "dgx-h100", "num_gpus": 8},
             "training": {"sequence_length": 4096, "global_batch_size": 8,
                          "recompute": "full", "recompute_layer_interval": 2},
             "parallel": {"data": {"fsdp": True}}}
    spec = SESSION.load_spec(table)
    footprint = baseline_footprint(spec)
    stage = whole_model_stage(spec)
    inventory = stage_inventory(spec, footprint, stage)
    layers = spec.model.num_layers
    checkpoints, dense, moe = inventory.groups[:2], *inventory.groups[2:]
    assert [g.count for g in checkpoints] == [0, layers // 2]  # dense, MoE checkpoints
    assert (dense.kind, dense.count, moe.kind, moe.count) == ("dense", 1, "moe",
                                                              layers - layers // 2 - 1)


def test_op_policy_keeps_the_reduce_scatter_outputs_under_sequence_parallelism():
    # Llama-3-8B, TP8 + SP on 8 GPUs, b = 1, s = 8192, bf16. Per layer and token after the
    # splits the kept tensors are 2 x (4096/8 layer input + 4096/8 wq + 1024/8 wv + 4096/8
    # attention + 14336/8 w1 + 4096 w2, a row-parallel partial sum on every rank) + 4 x 32/8
    # log-sum-exp = 15,120 bytes; the two reduce-scatter outputs add 2 x 4096/8 x 2.
    plan = SESSION.evaluate(op() | {"parallel": {"tensor": {"degree": 8}, "sequence": {}}})
    (memory,) = [d for d in plan.derivations if d.quantity == "activations_bytes"]
    tokens, layers = 8192, 32
    assert memory.inputs["layers_bytes"] == 15_120 * tokens * layers
    scattered = 2 * (4096 // 8) * 2 * tokens * layers
    assert plan.activations_bytes == (memory.inputs["layers_bytes"]
                                      + memory.inputs["outside_layers_bytes"] + scattered)


def test_mla_block_order_follows_torchtitan_deepseek_v3():
    # torchtitan deepseek_v3 model.py (v0.2.2) Attention.forward: wq_a, q_norm, wq_b, then
    # wkv_a, kv_norm, wkv_b, attention, wo; the MLP's w1, w3, w2. Counting the products:
    # wq_a (1), wq_b (2), wkv_a (3), wkv_b (4), wo (5), w1 (6), w3 (7), w2 (8).
    model = SESSION.load_spec({"model": "deepseek-v3", "hardware": {"cluster": "dgx-h100"}}).model
    ops = block_ops(model)
    assert [o.name for o in ops] == ["wq_a", "wq_b", "wkv_a", "wkv_b", "attention", "wo",
                                     "w1", "w3", "w2"]
    saved = [o.name for o, kept in zip(ops, saved_ops(ops, "op")) if kept]
    assert saved == ["wq_a", "wkv_a", "attention", "wo", "w3"]


def test_torchtitan_job_over_an_moe_base_reads_the_op_policy():
    from llmpar.launch.torchtitan import read_job
    base = SESSION.load_spec(mixtral())
    read = read_job("[activation_checkpoint]\nmode = \"selective\"\n"
                    "selective_ac_option = \"op\"\n", "job.toml", base)
    assert read.settings["training.recompute_policy"] == "op"


def test_the_search_tries_every_mode_beside_a_layer_interval_as_each_layout_alone():
    """A search node's recomputation modes are an array: the stages' kinds count the
    interval's layers whatever the mode (they raised an ambiguous-truth error), and the
    fast path ranks what evaluating each layout alone ranks."""
    from search_specs import small_spec

    spec = small_spec(training={"sequence_length": 512, "global_batch_size": 24,
                                "recompute": "full", "recompute_layer_interval": 2})
    fast = llmpar.search(spec, top=8)
    slow = llmpar.search(spec, top=8, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in slow.results]
    assert [r.plan.step_seconds for r in fast.results] == pytest.approx(
        [r.plan.step_seconds for r in slow.results], rel=1e-9)
    assert (fast.ranked, dict(fast.rejected)) == (slow.ranked, dict(slow.rejected))
    modes = {r.choices["training.recompute"] for r in llmpar.search(spec, top=10_000).results}
    assert {"none", "full"} <= modes
