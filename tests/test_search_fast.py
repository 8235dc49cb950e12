"""The fast path evaluates a node's layouts at once with evaluation's own code on arrays;
it must give each layout the numbers and the first problem that evaluating it alone
gives, and the search must find what an exhaustive search and brute force find."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from search_specs import MOE_MODEL, SMALL_MODEL, agreeing_pairs, small_spec

import llmpar
from llmpar.search.prepare import prepare
from llmpar.search.vectorised import FastPath

SPACES = {
    "dense": small_spec(),
    "moe": small_spec(model=MOE_MODEL),
    "tied-fsdp-partial-recompute": small_spec(
        num_gpus=4, model={**SMALL_MODEL, "tie_embeddings": True, "num_layers": 5},
        training={"sequence_length": 512, "global_batch_size": 8, "recompute_layers": 2},
        parallel={"data": {"fsdp": True, "overlap_grad_reduce": False}}),
    "sequence-table-disabled": small_spec(num_gpus=4,
                                          parallel={"sequence": {"enabled": False}}),
    "pipeline-inside-data-order": small_spec(model=MOE_MODEL,
                                             parallel={"order": "tp-pp-cp-ep-dp"}),
    "experts-folded-into-tensor-ranks": small_spec(
        model=MOE_MODEL, parallel={"expert": {"tensor_degree": 1}}),
    "deepep-dispatch": small_spec(model=MOE_MODEL, parallel={"expert": {"dispatcher": "deepep"}}),
    # fp8 casts (current scaling's amax reads included) and Transformer Engine's fp8
    # weight copies, which follow the model-parallel splits but not ZeRO-3's
    "fp8-linear-and-attention": small_spec(
        model=MOE_MODEL, hardware={"cluster": "dgx-h100", "num_gpus": 8, "gpus_per_node": 4},
        precision={"linear": "fp8-tensorwise", "attention": "fp8-tensorwise",
                   "fp8_scaling": "current"},
        search={"micro_batch_sizes": [1, 2], "recompute": ["none", "selective", "full"],
                "values": {"data.zero": [1, 3]}}),
    # torchao's recasts, the shard casts before fp8 weight all-gathers (the products' own
    # weight casts dropped where ZeRO-3 gathers the weights) and the amax all-reduces of
    # current scaling under sequence parallelism
    "fp8-gather-torchao": small_spec(
        hardware={"cluster": "dgx-h100", "num_gpus": 8, "gpus_per_node": 4},
        precision={"linear": "fp8-tensorwise", "weight_gather": "fp8-tensorwise"},
        training={"sequence_length": 512, "global_batch_size": 24, "framework": "torchtitan"},
        search={"micro_batch_sizes": [1, 2], "recompute": ["none", "full"],
                "values": {"data.zero": [1, 3]}}),
    # PyTorch's SymmetricMemory kernels behind the products (torchtitan's AsyncTP): the
    # chunks' launches and the reduce-scatters' reductions on the critical path
    "pipelined-tp-overlap-symmetric-memory": small_spec(
        hardware={"cluster": "dgx-h100", "num_gpus": 8, "gpus_per_node": 4},
        training={"sequence_length": 512, "global_batch_size": 24, "framework": "torchtitan"},
        parallel={"sequence": {"comm_overlap": "pipelined"}}),
    "eager-attention-scores": small_spec(
        training={"sequence_length": 512, "global_batch_size": 24,
                  "activation_model": "hf-eager"}),
    "parallel-attention-and-mamba": small_spec(  # Falcon-H1's "P" layers
        model={**SMALL_MODEL, "mixer_pattern": "P",
               "mamba": {"num_heads": 8, "head_dim": 32, "state_size": 16,
                         "gated_norm": False}},
        training={"sequence_length": 512, "global_batch_size": 24,
                  "activation_model": "fused"}),
    "gated-deltanet-and-attention": small_spec(  # Qwen3.5's "LLLA"
        model={**SMALL_MODEL, "mixer_pattern": "LA", "qk_norm": True,
               "attention_output_gate": True,
               "linear_attention": {"num_key_heads": 4, "num_value_heads": 8,
                                    "key_head_dim": 32, "value_head_dim": 32}},
        training={"sequence_length": 512, "global_batch_size": 24,
                  "activation_model": "fused"}),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_each_layout_gets_what_evaluating_it_alone_gives(name):
    # under fsdp the stage is 3 alone (not four copies of each layout): compare them all
    every = 1 if name == "tied-fsdp-partial-recompute" else 3
    assert len(agreeing_pairs(llmpar.default_session(), SPACES[name], every=every)) > 100


UNMODELLED = small_spec(hardware={"cluster": "dgx-h100", "num_gpus": 8, "gpus_per_node": 4},
                        training={"sequence_length": 512, "global_batch_size": 24, "mfu": 0.4})
"""An assumed MFU instead of the step-time model: every layout takes the same time."""


@pytest.mark.parametrize("spec", [SPACES["dense"], SPACES["moe"], UNMODELLED],
                         ids=["dense", "moe", "unmodelled"])
def test_fast_search_finds_what_exhaustive_search_finds(spec):
    fast = llmpar.search(spec, top=8)
    slow = llmpar.search(spec, top=8, exact=True)
    assert [r.choices for r in fast.results] == [r.choices for r in slow.results]
    assert [p.total_bytes for p in fast.pareto] == [p.total_bytes for p in slow.pareto]
    assert [p.step_seconds for p in fast.pareto] == pytest.approx(
        [p.step_seconds for p in slow.pareto], rel=1e-12)
    assert (fast.considered, fast.evaluated, fast.ranked, fast.rejected) == (
        slow.considered, slow.evaluated, slow.ranked, slow.rejected)
    assert not [w for w in fast.warnings if "not modelled" not in w]


def brute_force(spec: dict, num_gpus: int, layers: int) -> tuple[float, int] | None:
    """The best (step seconds, bytes) over every layout, each through llmpar.evaluate."""
    best = None
    divisors = [d for d in range(1, num_gpus + 1) if num_gpus % d == 0]
    for t, p, c in itertools.product(divisors, repeat=3):
        if num_gpus % (t * p * c):
            continue
        d = num_gpus // (t * p * c)
        schedules = [("1f1b", 1)] if p == 1 else [
            ("1f1b", 1), ("gpipe", 1), ("zero-bubble", 1)] + [
            ("interleaved", v) for v in range(2, layers // p + 1) if (layers // p) % v == 0]
        # ZeRO-3 also shards inside groups of `shard_degree` data ranks (HSDP).
        shards = [(zero, None) for zero in (0, 1, 2, 3)] + [
            (3, s) for s in range(2, d) if d % s == 0]
        for (schedule, v), (zero, shard), sp, kind, b, recompute in itertools.product(
                schedules, shards, (False, True) if t > 1 else (False,),
                ("ring", "all-to-all") if c > 1 else ("ring",), (1, 2), ("none", "full")):
            data = {"degree": d, "zero": zero} | ({"shard_degree": shard} if shard else {})
            parallel = {"data": data, "tensor": {"degree": t},
                        "context": {"degree": c, "kind": kind},
                        "pipeline": {"degree": p, "schedule": schedule, "virtual_stages": v}}
            if sp:
                parallel["sequence"] = {}
            training = {**spec["training"], "micro_batch_size": b, "recompute": recompute}
            try:
                plan = llmpar.evaluate({**spec, "training": training, "parallel": parallel})
            except llmpar.SpecError:
                continue
            if plan.fits and (best is None or (plan.step_seconds, plan.total_bytes) < best):
                best = (plan.step_seconds, plan.total_bytes)
    return best


@settings(max_examples=6)
@example(num_gpus=4, heads=2, batch=8, memory="200 MB", gpu="a100-sxm-80gb")  # HSDP wins
@given(num_gpus=st.sampled_from([2, 4]), heads=st.sampled_from([2, 4]),
       batch=st.sampled_from([4, 6, 8]), memory=st.sampled_from(["510 MB", "540 MB", "2 GB"]),
       gpu=st.sampled_from(["a100-sxm-80gb", "h100-sxm"]))
def test_search_best_equals_brute_force_best(num_gpus, heads, batch, memory, gpu):
    """The memory choices split the layouts: each fits on its device peak, about 440 MB
    of CUDA context and cuBLAS workspace, NCCL's buffers and 50 to 75 MB of its own."""
    model = {**SMALL_MODEL, "num_attention_heads": heads, "num_kv_heads": heads}
    spec = {"model": model,
            "hardware": {"gpu": {"preset": gpu, "memory_bytes": memory},
                         "num_gpus": num_gpus, "gpus_per_node": 2,
                         "intra_node_bandwidth_bytes_per_s": "300 GB/s",
                         "inter_node_bandwidth_bytes_per_s": "200 Gb/s"},
            "training": {"sequence_length": 256, "global_batch_size": batch},
            "search": {"micro_batch_sizes": [1, 2], "recompute": ["none", "full"]}}
    expected = brute_force(spec, num_gpus, model["num_layers"])
    found = llmpar.search(spec, top=1)
    if expected is None:
        assert not found.results
        return
    best = found.best.plan
    assert best.step_seconds == pytest.approx(expected[0], rel=1e-12)
    assert best.total_bytes == expected[1]


def test_layouts_right_at_the_memory_limit_are_kept():
    session = llmpar.default_session()
    prepared = prepare(session, small_spec(), {}, {})
    path = FastPath(prepared, session)
    memory = np.concatenate([path.evaluate(node).device_bytes for node in prepared.space.nodes])
    limit = int(np.median(memory))
    search = {"memory_limit_bytes": limit, "micro_batch_sizes": [1, 2],
              "recompute": ["none", "full"]}
    found = llmpar.search(small_spec(search=search), top=3)
    exact = llmpar.search(small_spec(search=search), top=3, exact=True)
    assert [r.choices for r in found.results] == [r.choices for r in exact.results]
    assert found.results and all(r.plan.training.memory_peak.device_bytes <= limit
                                 for r in found.results)


DATA_TABLES = [{}, {"zero": 1}, {"zero": 2}, {"zero": 3}, {"fsdp": True},
               {"zero": 3, "hpz_partition_size": 2}, {"zero": 3, "quantized_weights": True},
               {"zero": 3, "shard_degree": 2}, {"zero": 3, "reshard_after_forward": False}]
"""`[parallel.data]` tables whose settings a search node holds as arrays beside them (the
shard degrees, the ZeRO stages)."""
TRAINING_TABLES = [{}, {"recompute": "full", "recompute_layers": 2},
                   {"recompute": "full", "recompute_layer_interval": 2},
                   {"recompute": "selective"}, {"framework": "torchtitan"},
                   {"framework": "deepspeed"}]


@settings(max_examples=12)
@given(moe=st.booleans(), num_gpus=st.sampled_from([4, 8]),
       data=st.sampled_from(DATA_TABLES), training=st.sampled_from(TRAINING_TABLES),
       modes=st.sampled_from([["none", "full"], ["none", "selective", "full"]]))
def test_fast_search_ranks_what_exact_search_ranks_on_drawn_tables(moe, num_gpus, data,
                                                                   training, modes):
    """Pinned settings beside the searched ones: the fast path judges and ranks every
    layout as evaluating it alone does (it once refused every layout beside hpZ, and
    raised beside a recompute_layer_interval)."""
    spec = small_spec(num_gpus, model=MOE_MODEL if moe else SMALL_MODEL,
                      training={"sequence_length": 512, "global_batch_size": 24, **training},
                      search={"micro_batch_sizes": [1, 2], "recompute": modes},
                      **({"parallel": {"data": data}} if data else {}))
    try:
        fast = llmpar.search(spec, top=5)
    except llmpar.SpecError:
        return  # a table the spec refuses (e.g. hpZ that does not divide the data ranks)
    exact = llmpar.search(spec, top=5, exact=True)
    assert [(r.choices, r.plan.total_bytes) for r in fast.results] == [
        (r.choices, r.plan.total_bytes) for r in exact.results]
    assert [r.plan.step_seconds for r in fast.results] == pytest.approx(
        [r.plan.step_seconds for r in exact.results], rel=1e-9)
    assert (fast.ranked, dict(fast.rejected)) == (exact.ranked, dict(exact.rejected))
    assert not [w for w in fast.warnings if "fast path" in w]
