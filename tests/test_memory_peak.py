"""The memory peak of a training step (`training.memory_peak`): transients at a few
moments per stage, the allocator's rounding and NCCL's buffers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import parallel_training_specs

import llmpar
from llmpar.errors import SpecError
from llmpar.evaluation.peak import (
    K_MIN_BLOCK_BYTES,
    K_ROUND_LARGE_BYTES,
    NCCL_BUFFSIZE_BYTES,
    allocator_rounded,
)

SHIPPED = ("megatron-core", "nemo", "torchtitan", "pytorch-fsdp2", "hf-trainer", "deepspeed")
MiB = 2**20
LOSS_MOMENTS = ("loss forward", "loss backward", "output layer backward",
                "output layer reduce-scatter")


def _profiled(spec: dict, profile: str | dict) -> dict:
    return {**spec, "training": {**spec["training"], "framework": profile}}


@settings(max_examples=40, deadline=None)
@given(parallel_training_specs(), st.sampled_from(SHIPPED))
def test_peak_bounds_under_every_profile(spec, profile):
    """steady state <= allocated peak <= steady state + every transient; reserved >=
    allocated; device >= reserved."""
    try:
        plan = llmpar.evaluate(_profiled(spec, profile))
    except SpecError:
        return
    peak = plan.training.memory_peak
    if peak is None:
        assert plan.activations_bytes is None
        return
    assert peak.allocated_bytes >= plan.total_bytes
    assert peak.allocated_bytes >= max(stage.total_bytes for stage in plan.stages)
    transients = sum(b.bytes for b in peak.alive if b.transient)
    steady = sum(b.bytes for b in peak.alive if not b.transient)
    assert peak.allocated_bytes == steady + transients
    assert steady <= peak.steady_bytes
    records = {stage.stage: stage for stage in plan.stages}
    session = llmpar.Session()
    timeline = session.memory_timeline(_profiled(spec, profile))
    assert max(m.allocated_bytes for m in timeline) == peak.allocated_bytes
    assert {m.stage for m in timeline} == set(records)
    # zero_grad(set_to_none=True) and one micro-batch: no gradient exists yet while the
    # loss and the output layer run their backward (peak.gradients_freed)
    frees = (session.load_spec(_profiled(spec, profile)).training.profile
             .zero_grad_frees_gradients and plan.micro_batches_per_step == 1)
    for moment in timeline:
        assert moment.allocated_bytes <= peak.allocated_bytes
        record = records[moment.stage]
        unborn = record.gradients_bytes if frees and moment.moment in LOSS_MOMENTS else 0
        assert moment.allocated_bytes >= record.total_bytes - (
            record.activations_bytes or 0) - unborn
    assert peak.reserved_bytes >= peak.allocated_bytes
    # the cuBLAS workspaces come from the caching allocator: inside the reserved peak
    assert peak.reserved_bytes >= peak.workspace_bytes
    assert peak.device_bytes == (peak.reserved_bytes + peak.nccl_bytes
                                 + peak.cuda_context_bytes)
    assert plan.fits == (peak.device_bytes <= plan.capacity_bytes)
    assert plan.training.steady_state_fits == plan.steady_state_fits == (
        plan.total_bytes <= plan.capacity_bytes)


def test_upper_bound_is_steady_plus_all_transients():
    """Every moment of every stage is at least the stage's model states and buffers and
    at most its steady state plus the transients of all its moments together, under
    every profile."""
    from llmpar.evaluation.evaluate import evaluate_core, transforms_of
    from llmpar.evaluation.peak import foreach_share, kind_moments, workspace_blocks
    from llmpar.footprint.baseline import baseline_footprint

    session = llmpar.Session()
    for profile in SHIPPED:
        spec, layout = session._checked("specs/examples/llama-3-8b-pp8-a100.toml",
                                        {"training.framework": profile})
        plan = session.evaluate(spec)
        footprint = baseline_footprint(spec)
        timeline = session.memory_timeline(spec)
        transforms = transforms_of(spec, footprint, layout, session.strategies)
        core = evaluate_core(spec, footprint, layout, transforms)
        for kind, memory in enumerate(core.memory.kinds):
            moments = kind_moments(core.composition, memory.states, memory.activations,
                                   memory.in_flight, core.memory.buffers,
                                   core.facts.peak_parts[kind], foreach_share(spec), "")
            persistent = {p.name for p in core.facts.peak_parts[kind].persistent}
            every = sum(int(b.size) for b in moments[0].blocks if b.name in persistent)
            every += sum(int(b.size) for m in moments for b in m.blocks
                         if b.transient and b.name not in persistent)
            # the cuBLAS workspaces, kept from the first GEMM on
            every += sum(int(b.size) for b in workspace_blocks(spec))
            for index in core.kinds.members[kind]:
                record = plan.stages[index]
                tops = [m.allocated_bytes for m in timeline if m.stage == record.stage]
                assert max(tops) <= record.total_bytes + every
                assert min(tops) >= record.total_bytes - (record.activations_bytes or 0)


def test_torch_cross_entropy_backward_holds_three_fp32_copies_of_the_logits():
    """torch's cross_entropy on logits.float() (log_softmax + nll_loss; PyTorch
    tools/autograd/derivatives.yaml): in the loss's backward the saved fp32
    log-probabilities, the fp32 gradient nll_loss_backward allocates and the fp32
    gradient _log_softmax_backward_data allocates are alive together: 12 bytes per
    token and vocabulary entry, of which the activation model already keeps its loss
    tensor. Hand-check on the shipped example: Llama-3-8B, 128K tokens, context
    parallelism 8, full recomputation, torchtitan."""
    plan = llmpar.evaluate("specs/examples/llama-3-8b-128k-torchtitan.toml")
    peak = plan.training.memory_peak
    assert peak.moment == "loss backward"
    tokens, vocab = 131072 // 8, 128256
    loss = {b.name: b.bytes for b in peak.alive if b.transient}
    assert loss["gradient of the log-probabilities (fp32)"] == tokens * vocab * 4
    assert loss["gradient of logits.float() (fp32)"] == tokens * vocab * 4
    # the fused activation model keeps exp(logits) in bf16: 2 of the 4 bytes kept
    assert loss["log-probabilities (fp32, kept)"] == tokens * vocab * 2
    assert "peak_allocated_bytes" in plan.explain("peak_allocated_bytes")
    assert "loss backward" in plan.explain("peak_allocated_bytes")


def test_fp32_logits_are_not_copied_by_the_upcast():
    """Tensor.float() of fp32 logits returns them (aten/src/ATen/native/
    TensorConversions.cpp): in fp32 training the loss's forward holds no second copy."""
    from llmpar.evaluation.transients import _loss_parts

    spec = llmpar.Session()._checked("specs/examples/llama-3-8b-fsdp-8-h100.toml", {
        "precision.activations": "fp32", "training.framework": "hf-trainer"})[0]
    forward, _ = _loss_parts(spec)
    upcast = next(part for part in forward if part.name == "logits.float()")
    assert sum(upcast.tags.values()) == 0
    bf16 = llmpar.Session()._checked("specs/examples/llama-3-8b-fsdp-8-h100.toml",
                                     {"training.framework": "hf-trainer"})[0]
    forward, _ = _loss_parts(bf16)
    upcast = next(part for part in forward if part.name == "logits.float()")
    training = bf16.training
    assert sum(upcast.tags.values()) == (training.micro_batch_size * training.sequence_length
                                         * 128256 * 4)


def test_fused_cross_entropy_keeps_no_fp32_logits():
    unfused = llmpar.evaluate("specs/examples/llama-3-8b-cp8-a100.toml", {
        "training.framework": "torchtitan", "training.sequence_length": 131072})
    fused = llmpar.evaluate("specs/examples/llama-3-8b-cp8-a100.toml", {
        "training.framework": {"preset": "torchtitan", "fused_cross_entropy": True},
        "training.sequence_length": 131072})
    assert fused.total_bytes == unfused.total_bytes
    names = {b.name for b in fused.training.memory_peak.alive}
    assert not any("fp32" in name for name in names)
    assert fused.training.memory_peak.allocated_bytes < (
        unfused.training.memory_peak.allocated_bytes)


def test_megatron_profiles_count_transformer_engine_dummy_weight_gradients():
    """get_dummy_wgrad (Transformer Engine module/base.py) caches one tensor per distinct
    linear shape: for a Llama block on one GPU, the attention's and the MLP's weights of
    one layer in bf16."""
    plan = llmpar.evaluate("specs/examples/llama-3-8b-tp8-sp-a100.toml")
    dummy = {b.name: b.bytes for b in plan.training.memory_peak.alive}[
        "Transformer Engine dummy weight gradients"]
    h, q, kv, ffn = 4096, 4096, 1024, 14336
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * ffn
    assert dummy == per_layer * 2 // 8
    titan = llmpar.evaluate("specs/examples/llama-3-8b-tp8-sp-a100.toml",
                            {"training.framework": "torchtitan"})
    assert not any("Transformer Engine" in b.name for b in titan.training.memory_peak.alive)


def test_zero_grad_frees_the_gradients_before_a_lone_micro_batch_s_loss():
    """zero_grad(set_to_none=True) (torch/optim/optimizer.py) frees the gradients after
    each step; with one micro-batch per step the loss's backward comes before any weight
    gradient, so none is alive then (hf-trainer, pytorch-fsdp2, torchtitan). With two
    micro-batches the second one's loss backward holds them all; Megatron-Core's
    gradient buffers stay (megatron-core)."""
    spec = "specs/examples/llama-3-8b-fsdp-8-h100.toml"

    def alive(profile: str, accumulation: int) -> tuple[str, dict[str, int], int]:
        plan = llmpar.evaluate(spec, {"training.framework": profile,
                                      "training.micro_batch_size": 1,
                                      "training.global_batch_size": 8 * accumulation})
        peak = plan.training.memory_peak
        return peak.moment, {b.name: b.bytes for b in peak.alive}, plan.gradients_bytes

    moment, one, gradients = alive("hf-trainer", 1)
    assert moment == "loss backward" and gradients > 0
    assert one["gradients"] == 0
    _, two, _ = alive("hf-trainer", 2)
    assert two["gradients"] == gradients
    _, kept, _ = alive("megatron-core", 1)
    assert kept["gradients"] == gradients


def test_foreach_optimizer_copies_the_second_moments():
    """torch.optim's _multi_tensor_adam: torch._foreach_sqrt(exp_avg_sqs) is one fp32
    copy of the second moments of the GPU's parameters, alive in the optimizer step."""
    plan = llmpar.evaluate("specs/examples/llama-3-8b-fsdp-8-h100.toml",
                           {"training.framework": "pytorch-fsdp2"})
    timeline = llmpar.Session().memory_timeline("specs/examples/llama-3-8b-fsdp-8-h100.toml",
                                                {"training.framework": "pytorch-fsdp2"})
    step = next(m for m in timeline if m.moment == "optimizer step")
    start = next(m for m in timeline if m.moment == "start")
    # AdamW in mixed precision: fp32 master + two moments = 12 bytes per parameter
    assert step.allocated_bytes - start.allocated_bytes == pytest.approx(
        plan.optimizer_bytes / 12 * 4, rel=1e-6)
    moments = {m.moment: m.allocated_bytes for m in llmpar.Session().memory_timeline(
        "specs/examples/llama-3-8b-fsdp-8-h100.toml", {"training.framework": "torchtitan"})}
    assert moments["optimizer step"] == moments["start"]


def _every_transient_bound(session, spec_table) -> list[tuple[int, int, int]]:
    """(stage, its highest modelled moment, its steady state + every transient of all
    its moments together) of every stage: persistent stack buffers once, every other
    transient of every moment (the loss's, the output layer's, each layer option's, the
    unsharded weights and gradients, the optimizer step's copies) added up."""
    from llmpar.evaluation.evaluate import evaluate_core, transforms_of
    from llmpar.evaluation.peak import (
        edge_unit_blocks,
        foreach_share,
        kind_moments,
        unsharded_blocks,
        workspace_blocks,
    )
    from llmpar.footprint.baseline import baseline_footprint

    spec, layout = session._checked(spec_table, None)
    plan = session.evaluate(spec)
    timeline = session.memory_timeline(spec)
    footprint = baseline_footprint(spec)
    core = evaluate_core(spec, footprint, layout,
                         transforms_of(spec, footprint, layout, session.strategies))
    found = []
    for kind, memory in enumerate(core.memory.kinds):
        parts = core.facts.peak_parts[kind]
        pipelined = len(core.stages) > 1
        edges = edge_unit_blocks(spec, core.composition, core.parameters[kind], parts,
                                 pipelined)
        moments = kind_moments(core.composition, memory.states, memory.activations,
                               memory.in_flight, core.memory.buffers, parts,
                               foreach_share(spec), "", unsharded_blocks(
                                   spec, core.composition, core.parameters[kind],
                                   pipelined), edges=edges)
        persistent = {p.name for p in parts.persistent}
        every = sum(int(b.size) for b in moments[0].blocks if b.name in persistent)
        for m in moments:
            if m.name == "layer backward":
                continue  # every option of it below, not only the one alive
            every += sum(int(b.size) for b in m.blocks
                         if b.transient and b.name not in persistent)
        every += sum(int(sum(_part_sizes(core.composition, option)))
                     for option in parts.layer_options)
        if "layer backward" in edges:  # the edge unit gathered at the layer backward
            every += int(edges["layer backward"].size)
        every += sum(int(b.size) for b in workspace_blocks(spec))
        for index in core.kinds.members[kind]:
            record = plan.stages[index]
            top = max(m.allocated_bytes for m in timeline if m.stage == record.stage)
            found.append((record.stage, top, record.total_bytes + every))
    return found


def _part_sizes(composition, option) -> list[int]:
    from llmpar.evaluation.peak import part_bytes

    return [int(part_bytes(composition, part)) for part in option]


@settings(max_examples=15, deadline=None)
@given(parallel_training_specs(), st.sampled_from(SHIPPED))
def test_every_moment_is_at_most_the_steady_state_plus_every_transient(spec, profile):
    """The issue's bound, on drawn layouts under every shipped profile: no modelled
    moment of any stage exceeds that stage's steady state plus all its transients
    together, and the plan's peak is the highest moment."""
    session = llmpar.Session(load_entry_points=False)
    table = _profiled(spec, profile)
    try:
        plan = session.evaluate(table)
    except SpecError:
        return
    if plan.training.memory_peak is None:
        return
    bounds = _every_transient_bound(session, table)
    for stage, top, bound in bounds:
        assert top <= bound, (stage, top, bound)
    assert max(top for _, top, _ in bounds) == plan.training.memory_peak.allocated_bytes


@settings(max_examples=15, deadline=None)
@given(parallel_training_specs(), st.sampled_from(SHIPPED), st.sampled_from([2, 3]),
       st.sampled_from(["training.micro_batch_size", "training.sequence_length"]))
def test_peak_never_falls_as_micro_batch_or_sequence_grows(spec, profile, factor, key):
    """More tokens per micro-batch (a larger micro-batch, the same micro-batches per
    step; or a longer sequence) never lowers the allocated, reserved or device peak, on
    drawn layouts under every shipped profile."""
    session = llmpar.Session(load_entry_points=False)
    table = _profiled(spec, profile)
    training = table["training"]
    grown = dict(training)
    if key == "training.micro_batch_size":
        grown.update(micro_batch_size=training["micro_batch_size"] * factor,
                     global_batch_size=training["global_batch_size"] * factor)
    else:
        grown.update(sequence_length=training["sequence_length"] * factor)
    try:
        before = session.evaluate(table).training.memory_peak
        after = session.evaluate({**table, "training": grown}).training.memory_peak
    except SpecError:
        return
    if before is None or after is None:
        return
    for field in ("allocated_bytes", "reserved_bytes", "device_bytes"):
        assert getattr(after, field) >= getattr(before, field), field


@pytest.mark.parametrize("key, values", [("training.micro_batch_size", (1, 2, 4)),
                                         ("training.sequence_length", (2048, 4096, 8192))])
@pytest.mark.parametrize("profile", SHIPPED)
def test_peak_never_falls_as_the_batch_grows(key, values, profile):
    peaks = [llmpar.evaluate("specs/examples/llama-3-8b-pp8-a100.toml", {
        "training.framework": profile, key: value}).training.memory_peak.allocated_bytes
             for value in values]
    assert peaks == sorted(peaks)


def test_allocated_peak_falls_with_tensor_degree():
    """The contract's "memory falls with degree" holds for allocated memory."""
    peaks = [llmpar.evaluate("specs/examples/llama-3-8b-tp8-sp-a100.toml", {
        "parallel.tensor.degree": t, "parallel.data.degree": 8 // t}
    ).training.memory_peak.allocated_bytes for t in (2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True)


def test_allocator_rounding_follows_the_caching_allocator():
    """c10/cuda/CUDACachingAllocator.cpp: 512-byte blocks; above kMinLargeAlloc (10 MiB)
    a segment of its own rounded to kRoundLarge (2 MiB)."""
    assert allocator_rounded(0) == 0
    assert allocator_rounded(1) == K_MIN_BLOCK_BYTES
    assert allocator_rounded(513) == 2 * K_MIN_BLOCK_BYTES
    assert allocator_rounded(MiB + 1) == MiB + K_MIN_BLOCK_BYTES
    assert allocator_rounded(10 * MiB + 1) == 12 * MiB
    assert allocator_rounded(20 * MiB) == 20 * MiB == 10 * K_ROUND_LARGE_BYTES


def test_nccl_buffers_per_communicator():
    """Data parallelism alone: one communicator, NCCL_BUFFSIZE x 2 ring peers."""
    plan = llmpar.evaluate("specs/examples/llama-3-8b-fsdp-8-h100.toml")
    peak = plan.training.memory_peak
    strategies = {c.strategy for c in plan.collectives if c.group_size > 1}
    assert strategies == {"data"}
    assert peak.nccl_bytes == len(strategies) * NCCL_BUFFSIZE_BYTES * 2


def test_plan_json_round_trips_the_peak():
    plan = llmpar.evaluate("specs/examples/llama-3-70b-tp8-pp4-cp2.toml")
    again = llmpar.Plan.from_dict(plan.to_dict())
    assert again.training.memory_peak == plan.training.memory_peak
    stages = {m.stage for m in llmpar.Session().memory_timeline(
        "specs/examples/llama-3-70b-tp8-pp4-cp2.toml")}
    assert stages == {s.stage for s in plan.stages}


def test_timeline_series_is_step_order_and_peaks_at_the_plan_peak():
    from llmpar.plot import TIMELINE_MOMENTS, timeline_series

    session = llmpar.Session()
    moments = session.memory_timeline("specs/examples/llama-3-70b-tp8-pp4-cp2.toml")
    plan = session.evaluate("specs/examples/llama-3-70b-tp8-pp4-cp2.toml")
    series = timeline_series(moments)
    assert sorted(series) == [s.stage for s in plan.stages]
    for points in series.values():
        assert [x for x, _ in points] == sorted(x for x, _ in points)
        assert points[0][0] == TIMELINE_MOMENTS.index("start")
    top = max(y for points in series.values() for _, y in points)
    assert top * 2**30 == pytest.approx(plan.training.memory_peak.allocated_bytes)


def test_timeline_figure_marks_the_peak(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from llmpar.cli.main import main

    out = tmp_path / "timeline.png"
    assert main(["plot", "timeline", "specs/examples/llama-3-70b-tp8-pp4-cp2.toml",
                 "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    from llmpar.plot import timeline_figure

    session = llmpar.Session()
    plan = session.evaluate("specs/examples/llama-3-70b-tp8-pp4-cp2.toml")
    figure = timeline_figure(session.memory_timeline(
        "specs/examples/llama-3-70b-tp8-pp4-cp2.toml"), plan, "t")
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert any(plan.training.memory_peak.moment in text for text in texts)


ROOT = Path(__file__).resolve().parent.parent
_LOADER = importlib.util.spec_from_file_location(
    "report_memory_peak", ROOT / "validation" / "report_memory_peak.py")
assert _LOADER is not None and _LOADER.loader is not None
REPORT = importlib.util.module_from_spec(_LOADER)
_LOADER.loader.exec_module(REPORT)


@pytest.mark.parametrize("row", REPORT.rows(), ids=lambda r: (
    f"{r['run'].get('profile', 'hf-trainer')}-{r['run'].get('world_size', 1)}-"
    f"{r['run'].get('attention', 'sdpa')}-{r['run'].get('optimizer', 'foreach')}-"
    f"{r['run'].get('dtype', 'bf16')}-b{r['run']['micro_batch_size']}-"
    f"s{r['run']['sequence_length']}-{r['run']['recompute']}-m{r['run']['micro_batches']}"
    + ("" if r['run'].get('reshard_after_forward', True) else "-kept")))
def test_allocated_peak_matches_the_measured_step(row):
    """Measured with validation/measure_peak.py and validation/measure_peak_fsdp.py
    (versions in the data files: live tensor storages after every operator of the second
    step), the rows of docs/validation-memory.md: each within the issue's worst case (8%),
    in the phase the measurement peaks in (a backward peak at a backward moment or an FSDP
    unit's gradient reduce-scatter, the optimizer step's at the optimizer step)."""
    assert abs(row["error"]) < REPORT.WORST_TARGET, row
    backward = row["phase"].startswith("backward")
    assert backward == ("backward" in row["moment"] or row["moment"] == "loss forward"
                        or row["moment"].endswith("reduce-scatter")), row


def test_per_profile_targets_hold_on_the_measured_steps():
    """The issue's targets, per framework profile: the median absolute error of the
    allocated peak within 3%, the worst within 8%."""
    for profile, (count, median, worst, holds) in REPORT.summary(REPORT.rows()).items():
        assert count >= 1 and holds, (profile, median, worst)


def test_the_memory_page_is_what_the_script_writes(capsys):
    REPORT.main()
    written = capsys.readouterr().out
    page = (ROOT / "docs" / "validation-memory.md").read_text()
    strip = [line for line in written.splitlines() if not line.startswith("Generated by")]
    assert strip == [line for line in page.splitlines() if not line.startswith("Generated by")]


def test_published_vllm_profile_logs():
    """vLLM's start-up memory profile of Meta-Llama-3-8B on an H100 80GB (vllm-project/
    vllm pull request #10511; validation/published/memory/): the weights of one GPU within
    the log's two decimals of GiB; the preset's capacity (nvidia-smi's 81,559 MiB) above
    the 79.22 GiB CUDA lets a process allocate, by under 1% (the page states it); the
    serving allowance's context and NCCL buffers below the memory the log finds outside
    PyTorch's allocator."""
    rows = {(r["label"], r["quantity"]): r for r in REPORT.published_rows()}
    assert len(rows) == 8
    for (_, quantity), row in rows.items():
        if quantity == "model weights (one GPU)":
            assert abs(row["predicted_gib"] - row["logged_gib"]) <= 0.005
        elif quantity in ("total GPU memory", "memory the instance may use"):
            assert 0 < row["error"] < 0.01
        else:
            assert row["predicted_gib"] < row["logged_gib"]
