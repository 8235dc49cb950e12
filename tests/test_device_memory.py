"""Schema 2: a training plan fits on the device memory at its step's peak (transients,
the allocator's rounding, NCCL's buffers, the cuBLAS workspace and the CUDA context), the
search rejects layouts on the same number, and schema-1 plans stay readable."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import parallel_training_specs

import llmpar
from llmpar.errors import SpecError
from llmpar.evaluation.peak import segment_bytes
from llmpar.plan_json import V1_KEYS
from llmpar.spec.framework import (
    BLAS_WORKSPACE_DEFAULT_BYTES,
    CUDA_CONTEXT_BYTES,
)

MiB = 2**20
SHIPPED = ("megatron-core", "nemo", "torchtitan", "pytorch-fsdp2", "hf-trainer", "deepspeed")


def _profiled(spec: dict, profile: str | dict) -> dict:
    return {**spec, "training": {**spec["training"], "framework": profile}}


@settings(max_examples=30, deadline=None)
@given(parallel_training_specs(), st.sampled_from(SHIPPED))
def test_device_peak_bounds(spec, profile):
    """steady components <= allocated <= reserved <= device; allocated <= steady state
    plus every transient alive at the peak; fits is the device number's verdict."""
    try:
        plan = llmpar.evaluate(_profiled(spec, profile))
    except SpecError:
        return
    peak = plan.training.memory_peak
    if peak is None:
        return
    for component in (plan.weights_bytes, plan.gradients_bytes, plan.optimizer_bytes,
                      plan.activations_bytes or 0, plan.buffers_bytes):
        assert peak.allocated_bytes >= component
    assert peak.allocated_bytes >= plan.total_bytes
    assert peak.allocated_bytes <= peak.steady_bytes + sum(b.bytes for b in peak.alive
                                                           if b.transient)
    assert peak.allocated_bytes <= peak.reserved_bytes < peak.device_bytes
    assert plan.fits == (peak.device_bytes <= plan.capacity_bytes)
    assert plan.steady_state_fits == (plan.total_bytes <= plan.capacity_bytes)
    assert not plan.fits or plan.steady_state_fits


@pytest.mark.parametrize("key, values", [("training.micro_batch_size", (1, 2, 4)),
                                         ("training.sequence_length", (2048, 4096, 8192))])
@pytest.mark.parametrize("profile", SHIPPED)
def test_device_memory_never_falls_as_the_batch_grows(key, values, profile):
    peaks = [llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml", {
        "training.framework": profile, key: value}).training.memory_peak
             for value in values]
    for field in ("allocated_bytes", "reserved_bytes", "device_bytes"):
        found = [getattr(peak, field) for peak in peaks]
        assert found == sorted(found), field


def test_device_adds_the_profiles_context_and_workspace():
    """PyTorch's cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp): 32 MiB on a
    Hopper GPU, a segment of its own; ":4096:2:16:8" = 8,519,680 B elsewhere, which the
    caching allocator places in a 20 MiB segment (kLargeBuffer). Under the megatron-core
    profile Transformer Engine keeps a workspace of its own, 32 MiB from compute
    capability 9.0, 4 MiB below (get_cublas_workspace_size_bytes, TE 2.x). Both come from
    the caching allocator: in the reserved peak, and so not added again for the device.
    The CUDA context: 400 MiB by default (pytorch/pytorch #109888); a profile may state
    either."""
    h100 = llmpar.evaluate("specs/examples/llama-3-8b-fsdp-8-h100.toml").training.memory_peak
    assert h100.workspace_bytes == 32 * MiB + 32 * MiB
    assert h100.cuda_context_bytes == CUDA_CONTEXT_BYTES == 400 * MiB
    assert h100.device_bytes == h100.reserved_bytes + h100.nccl_bytes + 400 * MiB
    a100 = llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml").training.memory_peak
    assert BLAS_WORKSPACE_DEFAULT_BYTES == 8_519_680
    # 8,519,680 B and 4 MiB are both below kMinLargeAlloc: each in a 20 MiB segment
    assert a100.workspace_bytes == segment_bytes(8_519_680) + segment_bytes(4 * MiB) == 40 * MiB
    stated = llmpar.evaluate("specs/examples/llama-3-8b-fsdp-8-h100.toml", {
        "training.framework": {"preset": "megatron-core", "cuda_context_bytes": "1 GiB",
                               "blas_workspace_bytes": 0,
                               "transformer_engine_workspace": False}}).training.memory_peak
    assert stated.workspace_bytes == 0
    assert stated.device_bytes == stated.reserved_bytes + stated.nccl_bytes + 2**30


def test_workspaces_are_allocated_from_the_start():
    """The workspaces are taken at the first GEMM and kept: every moment of the step holds
    them, so the allocated peak and the memory between steps (the start) both grow by
    exactly their bytes, and reserved by their segments."""
    spec = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
    none = {"training.framework": {"preset": "megatron-core", "blas_workspace_bytes": 0,
                                   "transformer_engine_workspace": False}}
    session = llmpar.Session(load_entry_points=False)
    with_them = session.memory_timeline(spec)
    without = session.memory_timeline(spec, none)
    assert [(m.stage, m.moment) for m in with_them] == [(m.stage, m.moment) for m in without]
    for a, b in zip(with_them, without):
        assert a.allocated_bytes - b.allocated_bytes == 64 * MiB
    kept = llmpar.evaluate(spec).training.memory_peak
    bare = llmpar.evaluate(spec, none).training.memory_peak
    assert kept.allocated_bytes - bare.allocated_bytes == 64 * MiB
    names = {b.name for b in kept.alive}
    assert {"cuBLAS workspace (PyTorch)", "cuBLAS workspace (Transformer Engine)"} <= names
    torchtitan = llmpar.evaluate(spec, {"training.framework": "torchtitan"}).training
    assert torchtitan.memory_peak.workspace_bytes == 32 * MiB  # no Transformer Engine


def test_fits_is_decided_on_the_device_peak():
    """A headroom that leaves room for the steady state but not for the peak: schema 1
    said it fits, schema 2 does not, and says why."""
    spec = "specs/examples/llama-3-8b-128k-torchtitan.toml"
    plan = llmpar.evaluate(spec)
    peak = plan.training.memory_peak
    usable = plan.capacity_bytes
    headroom = usable - (plan.total_bytes + peak.device_bytes) // 2
    tight = llmpar.evaluate(spec, {"hardware.memory_headroom_bytes": headroom})
    assert tight.steady_state_fits and tight.training.steady_state_fits
    assert not tight.fits
    assert any("does not fit" in w and "peak" in w for w in tight.warnings)


def test_schema_one_plans_read_back_with_their_verdict():
    """A schema-1 dict (flat keys only) reads back with schema_version 1, and its fits,
    the steady-state verdict, is kept as training.steady_state_fits."""
    plan = llmpar.evaluate("specs/examples/llama-3-8b-128k-torchtitan.toml",
                           {"hardware.memory_headroom_bytes": "20 GiB"})
    data = plan.to_dict()
    assert data["schema_version"] == 2
    flat = {key: data[key] for key in V1_KEYS}
    flat.update(schema_version=1, fits=plan.steady_state_fits)
    again = llmpar.Plan.from_dict(flat)
    assert again.schema_version == 1
    assert again.fits == plan.steady_state_fits
    assert again.training.steady_state_fits == plan.steady_state_fits
    assert llmpar.Plan.from_dict(data) == plan


def test_search_rejects_on_the_device_peak():
    """A memory limit between a layout's steady state and its device peak: the search
    rejects it, as evaluating it alone says it does not fit."""
    spec = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
    found = llmpar.search(spec, top=3)
    assert found.results
    best = found.results[0].plan
    peak = best.training.memory_peak
    limit = (best.total_bytes + peak.device_bytes) // 2
    limited = llmpar.search(spec, {"search.memory_limit_bytes": limit}, top=50)
    assert found.results[0].choices not in [r.choices for r in limited.results]
    for result in limited.results:
        assert result.plan.training.memory_peak.device_bytes <= limit


def test_torchtitan_pipeline_keeps_the_stage_unsharded():
    """torchtitan with pipeline parallelism: FSDP2 does not reshard after forward
    (torchtitan/distributed/fsdp.py, torchtitan 0.2.2) and the pipelining schedule keeps
    the gradients unsharded until the last micro-batch (torch/distributed/pipelining/
    stage.py): the stage's gathered weights and its unsharded gradients are alive at the
    backward peak. Hand-check: Llama-3-8B in 8 stages, FSDP over 2; the first stage
    holds 4 of 32 layers and the embedding: 4/32 x (1,342,177,280 + 5,637,144,576 +
    266,240) + 525,336,576 = 1,397,785,088 parameters, 2 bytes each in bf16."""
    overrides = {"hardware.num_gpus": 16, "parallel.data.zero": 3,
                 "training.framework": "torchtitan"}
    plan = llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml", overrides)
    peak = plan.training.memory_peak
    assert plan.layout == {"pipeline": 8, "data": 2} and peak.stage == 0
    alive = {b.name: b.bytes for b in peak.alive}
    parameters = 4 * (1_342_177_280 + 5_637_144_576 + 266_240) // 32 + 525_336_576
    assert alive["unsharded weights of the stage"] == parameters * 2
    grads = "unsharded gradients of the stage, reduce-scattered after the last micro-batch"
    assert alive[grads] == plan.stages[0].gradients_bytes * 2  # the shards of 2 ranks
    megatron = llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml",
                               {**overrides, "training.framework": "megatron-core"})
    assert not any("unsharded" in b.name for b in megatron.training.memory_peak.alive)
    single = llmpar.evaluate("specs/examples/llama-3-8b-fsdp-8-h100.toml",
                             {"training.framework": "torchtitan"})
    assert not any("unsharded" in b.name for b in single.training.memory_peak.alive)
    timeline = {(m.stage, m.moment): m.allocated_bytes for m in
                llmpar.Session().memory_timeline("specs/examples/llama-3-8b-pp8-a100.toml",
                                                 overrides)}
    # gathered from the first forward to the cool-down's end; resharded for the step
    start, step = timeline[(0, "start")], timeline[(0, "optimizer step")]
    assert timeline[(0, "cool-down end")] - start >= parameters * 2 + alive[grads]
    assert step == start


def test_torchtitan_pipeline_counts_the_gathered_layers_once():
    """With pipeline parallelism torchtitan keeps the stage's weights gathered for the
    whole step (FSDP2 reshard_after_forward=False under pp_enabled, torchtitan 0.2.2): the
    layers FSDP gathers one after another land in those held weights, so no per-layer
    gather buffer (the running and the prefetched layer) comes on top. Hand-check:
    Llama-3-8B (8,030,261,248 parameters, 32 layers) in 8 stages, FSDP over 2. Without
    pipelining the buffer is FSDP's two gathered blocks, 2 x (8,030,261,248 - 2 x
    525,336,576) / 32 x 2 bytes = 872,448,512 (the embeddings and the output layer are
    units of their own); with it the peak of the first stage at its layer backward is exactly
    its states + activations + its unsharded weights and gradients + the working set,
    with no buffer of gathered layers besides."""
    overrides = {"hardware.num_gpus": 16, "parallel.data.zero": 3,
                 "training.framework": "torchtitan"}
    plan = llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml", overrides)
    peak, stage = plan.training.memory_peak, plan.stages[0]
    alive = {b.name: b.bytes for b in peak.alive}
    assert "buffers" not in alive and stage.buffers_bytes == 0
    parameters = 4 * (1_342_177_280 + 5_637_144_576 + 266_240) // 32 + 525_336_576
    held = parameters * 2 + stage.gradients_bytes * 2  # whole weights and gradients, bf16
    working = sum(b.bytes for b in peak.alive if b.transient) - held
    assert peak.moment == "layer backward"
    assert peak.allocated_bytes == (stage.weights_bytes + stage.gradients_bytes
                                    + stage.optimizer_bytes + stage.activations_bytes
                                    + held + working)
    single = llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml",
                             {**overrides, "training.framework": "pytorch-fsdp2"})
    assert single.stages[0].buffers_bytes == 2 * (8_030_261_248 - 2 * 525_336_576) // 32 * 2
