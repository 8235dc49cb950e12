"""evaluate: spec -> baseline footprint -> strategy transforms -> Plan.

`evaluate_core` composes the transforms into memory and step time; it runs on plain
numbers for one spec and on arrays for every layout of a search node
(`llmpar.search.vectorised`), the same code either way. `build_plan` adds what a Plan
shows of one layout: every stage, every collective, the saved tensors, derivations
and warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.deferred import deferred
from llmpar.dtypes import bytes_per_element, math_format
from llmpar.errors import PluginError
from llmpar.evaluation.attention import kernel_fallback_warning
from llmpar.evaluation.cache import EvaluationCache
from llmpar.evaluation.casts import weight_copy_bytes
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import (
    StageKinds,
    TrainingFacts,
    finetune_flops_per_sequence,
    stage_kind,
    stage_kinds,
    training_facts,
)
from llmpar.evaluation.goodput import run_goodput
from llmpar.evaluation.memory import (
    MemoryCore,
    memory_core,
    memory_derivations,
    stage_records,
    tensor_rows,
)
from llmpar.evaluation.offload import host_memory_warning
from llmpar.evaluation.peak import (
    MemoryMoment,
    PeakCore,
    gradients_freed,
    memory_peak,
    peak_candidates,
    peak_core,
    step_timeline,
)
from llmpar.evaluation.stages import stage_inventory, stage_parameters, stages_of
from llmpar.evaluation.step_time import TimeCore, cost_records, time_core, uncosted_links
from llmpar.evaluation.time_records import StepTime, step_time_derivations, step_time_record
from llmpar.evaluation.timing import StepFlops, run_length, step_flops
from llmpar.evaluation.utilization import check_utilization
from llmpar.evaluation.validity import transform_problems
from llmpar.finetune.derivations import finetune_derivations
from llmpar.finetune.states import kinds_state_counts
from llmpar.footprint.baseline import Footprint, baseline_footprint
from llmpar.plan import (
    Derivation,
    FinetunePart,
    MemoryPeak,
    Plan,
    StageMemory,
    StrategyNote,
    TrainingPart,
)
from llmpar.positions import TRAINED_POSITIONS, position_limit_warning
from llmpar.spec import Spec
from llmpar.spec.hardware import AttentionKernelRate
from llmpar.strategies import CHECKED_STRATEGY_MODULES
from llmpar.strategy import Layout, Stage, StrategyContext, Transform
from llmpar.trust import load_families, step_time_trust
from llmpar.workload import dividing_fields

if TYPE_CHECKING:
    from llmpar.strategy import Strategy


def transforms_of(spec: Spec, footprint: Footprint, layout: Layout,
                  strategies: Mapping[str, Strategy[Any]]) -> list[Transform]:
    """Each active strategy's transform, by phase then name (never plugin order), each
    checked before it is composed (but those of llmpar's own strategy classes, which the
    contract suite checks)."""
    ctx = StrategyContext(spec=spec, footprint=footprint, layout=layout)
    transforms = []
    for name in sorted(spec.parallel, key=lambda n: (strategies[n].phase, n)):
        strategy = strategies[name]
        try:
            transform = strategy.transform(spec.parallel[name], ctx)
        except Exception as exc:
            raise PluginError(f"strategy {name!r} failed to transform the spec: "
                              f"{type(exc).__name__}: {exc}") from exc
        if type(strategy).__module__ in CHECKED_STRATEGY_MODULES:
            transforms.append(transform)
            continue
        problems = transform_problems(transform, name, spec)
        if problems:
            raise PluginError(f"strategy {name!r} returned a transform the contract does not "
                              f"allow: {'; '.join(problems)}")
        transforms.append(transform)
    if spec.workload:
        transforms += workload_transforms_of(spec, ctx)
    return transforms


def workload_transforms_of(spec: Spec, ctx: StrategyContext) -> list[Transform]:
    """The workloads' transforms (`llmpar.workload`), after the strategies', each
    checked: well formed, and stating none of the strategies' divisions."""
    found = []
    for name in sorted(spec.workload):
        table = spec.workload[name]
        try:
            transform = table.workload.transform(table.config, ctx)
        except Exception as exc:
            raise PluginError(f"workload {name!r} failed to transform the spec: "
                              f"{type(exc).__name__}: {exc}") from exc
        problems = transform_problems(transform, name, spec)
        if not problems:
            problems = [f"{field} is the strategies' to state, not a workload's"
                        for field in dividing_fields(transform)]
        if problems:
            raise PluginError(f"workload {name!r} returned a transform the contract does not "
                              f"allow: {'; '.join(problems)}")
        found.append(transform)
    return found


@attrs.frozen(kw_only=True)
class Evaluation:
    """Memory and step time of one layout, or of every layout of a search node."""

    composition: Composition
    stages: tuple[Stage, ...]
    kinds: StageKinds
    parameters: tuple[dict[str, float], ...]
    """Each kind of stage's parameters by group, before shards."""
    facts: TrainingFacts
    memory: MemoryCore
    time: TimeCore


def global_batch_of(spec: Spec, layout: Layout) -> int:
    """Sequences per step: `[training] global_batch_size`, or a micro-batch per replica."""
    training = spec.training
    return training.global_batch_size or training.micro_batch_size * layout.degree("data")


def structure_of(spec: Spec, footprint: Footprint, transforms: Sequence[Transform],
                 cache: EvaluationCache | None = None
                 ) -> tuple[tuple[Stage, ...], StageKinds, tuple[dict[str, float], ...]]:
    """The stages, their kinds, and each kind's parameters."""
    stages = stages_of(spec, transforms)

    def compute() -> tuple[StageKinds, tuple[dict[str, float], ...]]:
        kinds = stage_kinds(spec, stages)
        return kinds, tuple(stage_parameters(spec, footprint, stage)
                            for stage in kinds.representatives)

    kinds, parameters = compute() if cache is None else cache.structure(
        spec, footprint, stages, compute)
    return stages, kinds, parameters


def evaluate_core(spec: Spec, footprint: Footprint, layout: Layout,
                  transforms: Sequence[Transform], facts: TrainingFacts | None = None,
                  cache: EvaluationCache | None = None) -> Evaluation:
    """Compose the transforms; `facts` (per training table, arrays in a search) are
    computed here when not given (kept in `cache` when one is given)."""
    composition = Composition(transforms)
    stages, kinds, parameters = structure_of(spec, footprint, transforms, cache)
    if facts is None:
        batch = global_batch_of(spec, layout)
        facts = (training_facts(spec, footprint, stages, kinds, batch) if cache is None
                 else cache.facts(spec, footprint, stages, kinds, batch))
    tuned = footprint.finetune
    counts = kinds_state_counts(spec, tuned, kinds.representatives, parameters)
    memory = memory_core(spec, composition, facts, stages, kinds, parameters, counts,
                         0.0 if tuned is None else tuned.transient_bytes)
    scores = footprint.attention_kernel == "eager"
    time = time_core(spec, composition, facts, memory, kinds, parameters, scores, cache, counts)
    return Evaluation(composition=composition, stages=stages, kinds=kinds,
                      parameters=parameters, facts=facts, memory=memory, time=time)


def activation_k(spec: Spec, footprint: Footprint, inventory_bytes: float) -> float | None:
    """The founding document's k = M / (b * s * L * h * d), before recompute or splits;
    `inventory_bytes` is M, the footprint's whole inventory."""
    model, training = spec.model, spec.training
    if footprint.activations is None or model.hidden_size is None or not model.num_layers:
        return None
    d = bytes_per_element(spec.precision.activations)
    denominator = (training.micro_batch_size * training.sequence_length * model.num_layers
                   * model.hidden_size * d)
    return inventory_bytes / denominator


def product_format_warnings(spec: Spec) -> list[str]:
    """What a per-operation format leaves out: an fp8 rate the GPU does not state (the
    casts around fp8 products are costed, `llmpar.evaluation.casts`)."""
    precision, gpu = spec.precision, spec.hardware.gpu
    found = []
    formats = {precision.linear_format, precision.attention_format} - {precision.compute}
    for dtype in sorted(formats):
        if math_format(dtype) == "fp8" and gpu.fp8_matmul_efficiency is None:
            found.append(f"{gpu.name!r} states no fp8_matmul_efficiency: {dtype} products "
                         "are timed at its bf16 matmul_efficiency")
    return found


def _warnings(spec: Spec, footprint: Footprint, transforms: Sequence[Transform],
              peak: MemoryPeak, capacity: int, time: StepTime,
              attention_rates: tuple[AttentionKernelRate, AttentionKernelRate] | None = None
              ) -> list[str]:
    """`attention_rates`: the kernel rates the time model timed attention at (None: at
    matmul_efficiency)."""
    warnings = list(time.warnings)
    positions = position_limit_warning(spec.model, spec.training.sequence_length,
                                       TRAINED_POSITIONS)
    if positions is not None:
        warnings.append(positions)
    if footprint.activations_unavailable:
        warnings.append(f"no activation estimate: {footprint.activations_unavailable}; "
                        "total_bytes and fits count model states only")
    inventory = footprint.activations
    selective = spec.training.recompute == "selective"
    if selective and inventory is not None and not inventory.has_attention_scores:
        warnings.append(f"selective recomputation changes nothing: the {inventory.model!r} "
                        "activation model keeps no attention scores")
    if peak.device_bytes > capacity:
        warnings.append(f"does not fit: needs {peak.device_bytes / 2**30:,.2f} GiB of device "
                        f"memory per GPU at its peak (steady state {peak.steady_bytes / 2**30:,.2f}"
                        f" GiB), has {capacity / 2**30:,.2f} GiB")
    warnings += product_format_warnings(spec)
    if (time.time_model == "modelled" and footprint.attention_kernel != "eager"
            and attention_rates is None):  # fused attention, as time_core has it, at no rate
        fallback = kernel_fallback_warning(spec)
        if fallback is not None:
            warnings.append(fallback)
    for transform in transforms:
        warnings += [f"{transform.strategy}: {text}" for text in transform.warnings]
    return warnings


def build_plan(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy[Any]],
               cache: EvaluationCache | None = None) -> Plan:
    """Compose the plan of a validated spec under a resolved layout (with what a
    session's `cache` keeps of earlier evaluations)."""
    footprint = baseline_footprint(spec) if cache is None else cache.footprint(spec)
    transforms = transforms_of(spec, footprint, layout, strategies)
    core = evaluate_core(spec, footprint, layout, transforms, cache=cache)
    check_utilization(spec, core.time, core.facts, core.composition)
    records, peak_index = stage_records(core.memory, core.stages, core.kinds)
    peak = records[peak_index]
    inventory, rows = None, ()
    if footprint.activations is not None:
        stage = core.stages[peak_index]
        inventory = (stage_inventory(spec, footprint, stage) if cache is None
                     else cache.stage_inventory(spec, footprint, stage))
        rows = _rows(spec, stage, inventory, core.composition, cache)
    extra = (core.composition.sum_of("extra_flops_per_step")
             - core.composition.sum_of("skipped_flops_per_step")
             + finetune_flops_per_sequence(footprint) * global_batch_of(spec, layout))
    flops = step_flops(spec, footprint, layout.degree("data"), extra,
                       core.facts.recomputed_fraction,
                       core.composition.sum_of("model_flops_per_step"), explain=False)
    time = step_time_record(spec, core, uncosted_links(core.time.costs), flops)
    run = run_length(spec, footprint.parameters.total, flops, time.step_seconds, "",
                     explain=False)
    goodput, goodput_derivations = run_goodput(spec, footprint, peak, run.train_seconds)
    capacity = spec.hardware.capacity_bytes
    tokens_per_second, mfu, hfu, _ = _utilization(spec, flops, time.step_seconds, False)
    host_bytes = records.host_bytes
    tuned = finetune_part(footprint, flops.global_batch_size)
    peak_memory, peak_derivations = _memory_peak(spec, footprint, core, records, cache)
    fits = peak_memory.device_bytes <= capacity
    families = load_families() if cache is None else cache.validation_families()

    def derivations() -> tuple[Derivation, ...]:
        # what `explain` shows, from this evaluation's values, on the first read
        timed = step_time_derivations(spec, core, training.collectives, flops)
        source = timed[0].source if timed else ""
        run_rules = run_length(spec, footprint.parameters.total, flops, time.step_seconds,
                               source).derivations
        return (memory_derivations(spec, footprint.parameters.total, peak, inventory, rows,
                                   None if tuned is None else tuned.trainable_parameters)
                + (_total_rule(peak, capacity), capacity_rule(spec)) + peak_derivations
                + _host_rules(spec, host_bytes, transforms)
                + step_flops(spec, footprint, layout.degree("data"), extra,
                             core.facts.recomputed_fraction,
                             core.composition.sum_of("model_flops_per_step")).derivations
                + timed + _utilization(spec, flops, time.step_seconds)[3]
                + run_rules + goodput_derivations + finetune_derivations(spec, tuned))

    training = TrainingPart(
        sequence_length=spec.training.sequence_length,
        micro_batch_size=spec.training.micro_batch_size,
        global_batch_size=flops.global_batch_size,
        micro_batches_per_step=int(core.composition.micro_batches_per_step()),
        tokens_per_step=flops.tokens_per_step, flops_per_step=flops.flops_per_step,
        flops_per_step_6nd=flops.flops_per_step_6nd, flops_method=flops.flops_method,
        hardware_flops_per_step=flops.hardware_flops_per_step,
        step_seconds=time.step_seconds,
        tokens_per_second=tokens_per_second,
        mfu=mfu, hfu=hfu, train_tokens=run.train_tokens, train_steps=run.train_steps,
        train_flops=run.train_flops, train_seconds=run.train_seconds, gpu_hours=run.gpu_hours,
        activation_model=spec.training.activation_model,
        activation_k=activation_k(spec, footprint, core.facts.inventory_bytes),
        activation_tensors=rows,
        time_model=time.time_model, compute_seconds=time.compute_seconds,
        communication_seconds=time.communication_seconds,
        exposed_communication_seconds=time.exposed_communication_seconds,
        bubble_fraction=time.bubble_fraction, bubble_seconds=time.bubble_seconds,
        optimizer_seconds=time.optimizer_seconds, offload_seconds=time.offload_seconds,
        exposed_offload_seconds=time.exposed_offload_seconds,
        collectives=deferred(lambda: cost_records(core.time.costs, spec.hardware)[0]),
        notes=deferred(lambda: strategy_notes(transforms)), framework=spec.training.profile.name,
        host_overhead_seconds=time.host_overhead_seconds,
        issue_seconds=time.issue_seconds, launch_bound_seconds=time.launch_bound_seconds,
        step_time_trust=deferred(lambda: step_time_trust(
            spec, time.time_model, families,
            tuple(name for transform in transforms for name in transform.mechanisms)
            + offload_mechanisms(core.facts))),
        goodput=goodput,
        memory_peak=None if footprint.activations is None else peak_memory,
        finetune=tuned, steady_state_fits=peak.total_bytes <= capacity)
    return Plan(
        model=spec.model.name, gpu=spec.hardware.gpu.name, num_gpus=spec.hardware.num_gpus,
        layout=dict(layout.degrees),
        weights_bytes=peak.weights_bytes, gradients_bytes=peak.gradients_bytes,
        optimizer_bytes=peak.optimizer_bytes, activations_bytes=peak.activations_bytes,
        buffers_bytes=peak.buffers_bytes, total_bytes=peak.total_bytes, capacity_bytes=capacity,
        fits=fits, host_bytes=host_bytes,
        parameters=round(footprint.parameters.total),
        active_parameters=round(footprint.parameters.active),
        parameters_by_group=dict(footprint.parameters.by_group),
        peak_stage=peak.stage, stages=deferred(lambda: tuple(records)), training=training,
        warnings=tuple(_warnings(spec, footprint, transforms, peak_memory, capacity, time,
                                 core.time.attention_rates)
                       + host_memory_warning(spec, host_bytes)),
        derivations=deferred(derivations),
    )


def finetune_part(footprint: Footprint, global_batch: int) -> FinetunePart | None:
    """The plan's account of `[finetune]` (None in full training)."""
    tuned = footprint.finetune
    if tuned is None:
        return None
    trainable = sum(tuned.trainable_by_group.values())
    adapters = sum(tuned.adapters_by_group.values())
    copies = sum(tuned.copies_by_group.values())
    return FinetunePart(
        method=tuned.method, trainable_parameters=round(trainable),
        adapter_parameters=round(adapters),
        frozen_parameters=round(footprint.parameters.total + adapters + copies - trainable),
        skipped_flops_per_step=tuned.skipped_flops_per_sequence * global_batch,
        adapter_flops_per_step=tuned.adapter_flops_per_sequence * global_batch,
        transient_bytes=round(tuned.transient_bytes))


def _memory_peak(spec: Spec, footprint: Footprint, core: Evaluation,
                 records: Sequence[StageMemory], cache: EvaluationCache | None
                 ) -> tuple[MemoryPeak, tuple[Derivation, ...]]:
    inventory = footprint.activations
    source = ("no activation estimate" if inventory is None
              else inventory.source or f"activation model {inventory.model!r}")

    def compute() -> tuple[MemoryPeak, tuple[Derivation, ...]]:
        return memory_peak(spec, core.composition, core.kinds, core.memory, core.facts,
                           records, source, core.parameters)

    if cache is None:
        return compute()
    # what memory_peak reads of the stages: each kind's peak candidate
    key = (cache.footprint_key(spec), spec.optimizer, spec.hardware.gpu.architecture,
           cache.layers_key(core.stages),
           tuple(records[i] for i in peak_candidates(core.kinds, core.stages)),
           # the transients follow from the footprint, the stages and the splits
           core.composition.tag_key(), communicator_key(core.composition),
           # the fp8 weight copies follow the model-parallel splits alone
           tuple(weight_copy_bytes(spec, core.composition, p) for p in core.parameters),
           gradients_freed(spec, core.composition),
           # the gathered embeddings, output layer and blocks follow the weights' shards
           core.composition.shard_key("weights"))
    return cache.memory_peak(key, compute)


def communicator_key(composition: Composition) -> frozenset[str]:
    """The strategies whose collectives run (one layout): what NCCL's buffers follow."""
    return frozenset(c.strategy for c, calls in composition.active_collectives() if calls > 0)


def device_peak(spec: Spec, core: Evaluation) -> PeakCore:
    """The step's allocated, reserved and device peaks (`llmpar.evaluation.peak`), for one
    layout or every layout of a search node: `fits` and the search's verdict are on
    `device`."""
    return peak_core(spec, core.composition, core.memory, core.facts, core.parameters,
                     len(core.stages) > 1)


def memory_timeline(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy[Any]],
                    cache: EvaluationCache | None = None) -> tuple[MemoryMoment, ...]:
    """Every stage's allocated memory at each modelled moment of one step (the data of
    `llmpar plot timeline`); empty without an activation estimate."""
    footprint = baseline_footprint(spec) if cache is None else cache.footprint(spec)
    if footprint.activations is None:
        return ()
    transforms = transforms_of(spec, footprint, layout, strategies)
    core = evaluate_core(spec, footprint, layout, transforms, cache=cache)
    return step_timeline(core.stages, core.kinds, core.memory, core.composition, core.facts,
                         spec, core.parameters)


def _rows(spec: Spec, stage: Stage, inventory: Any, composition: Composition,
          cache: EvaluationCache | None) -> tuple[Any, ...]:
    if cache is None:
        return tensor_rows(inventory, composition)
    key = (cache.footprint_key(spec), stage_kind(spec, stage), composition.tag_key())
    return cache.rows(key, lambda: tensor_rows(inventory, composition))


def offload_mechanisms(facts: TrainingFacts) -> tuple[str, ...]:
    """The mechanism validation rows check on their own that activation offload is
    ("activation-offload", `Transform.mechanisms`' sense), where some stage keeps
    activations in host memory (`[training] activation_offload_layers`)."""
    return ("activation-offload",) if any(facts.offloaded_tags) else ()


def strategy_notes(transforms: Sequence[Transform]) -> tuple[StrategyNote, ...]:
    """What each strategy says it did (`Transform.notes`), for the plan."""
    return tuple(StrategyNote(strategy=t.strategy, text=text)
                 for t in transforms for text in t.notes)


def _utilization(spec: Spec, flops: StepFlops, step_seconds: float | None,
                 explain: bool = True
                 ) -> tuple[float | None, float | None, float | None, tuple[Derivation, ...]]:
    """Tokens per second, MFU and HFU of a step, with their derivations when `explain`
    (MFU as in Chowdhery et al. 2022, arXiv:2204.02311, App. B; HFU as in Korthikanti
    et al. 2022, arXiv:2205.05198, Sec. 6)."""
    if step_seconds is None:
        return None, None, None, ()
    tokens_per_second = flops.tokens_per_step / step_seconds
    if not explain:
        peak_flops = spec.hardware.gpu.peak_flops_per_s(spec.precision.compute)
        if peak_flops is None:
            return tokens_per_second, None, None, ()
        total = spec.hardware.num_gpus * peak_flops * step_seconds
        return (tokens_per_second, flops.flops_per_step / total,
                flops.hardware_flops_per_step / total, ())
    per_second = Derivation(
        quantity="tokens_per_second", value=tokens_per_second,
        unit="tokens/s", rule="tokens_per_step / step_seconds", source="one step's tokens",
        inputs={"tokens_per_step": flops.tokens_per_step, "step_seconds": step_seconds})
    peak = spec.hardware.gpu.peak_flops_per_s(spec.precision.compute)
    if peak is None:
        return tokens_per_second, None, None, (per_second,)
    capacity = spec.hardware.num_gpus * peak * step_seconds
    mfu, hfu = flops.flops_per_step / capacity, flops.hardware_flops_per_step / capacity
    inputs: dict[str, float | int | str] = {
        "num_gpus": spec.hardware.num_gpus, "peak_flops_per_s": peak,
        "step_seconds": step_seconds, "compute_format": spec.precision.compute}
    source = (f"{spec.hardware.gpu.name}'s dense peak in {spec.precision.compute}; "
              "MFU: Chowdhery et al. 2022, App. B; HFU: Korthikanti et al. 2022, Sec. 6")
    return tokens_per_second, mfu, hfu, (per_second, Derivation(
        quantity="mfu", value=mfu, unit="", rule="flops_per_step / (num_gpus * peak_flops_per_s"
                                                 " * step_seconds)", source=source,
        inputs={"flops_per_step": flops.flops_per_step, **inputs}), Derivation(
        quantity="hfu", value=hfu, unit="",
        rule="hardware_flops_per_step / (num_gpus * peak_flops_per_s * step_seconds)",
        source=source, inputs={"hardware_flops_per_step": flops.hardware_flops_per_step,
                               **inputs}))


def _total_rule(peak: Any, capacity: int) -> Derivation:
    return Derivation(
        quantity="total_bytes", value=peak.total_bytes, unit="bytes",
        rule="weights + gradients + optimizer + activations + buffers of the peak stage",
        source="sum of the per-GPU components above",
        inputs={"capacity_bytes": capacity, "peak_stage": peak.stage})


def capacity_rule(spec: Spec) -> Derivation:
    """Where the memory a training plan must fit in comes from."""
    gpu, hardware = spec.hardware.gpu, spec.hardware
    reported = gpu.usable_memory_bytes is not None
    return Derivation(
        quantity="capacity_bytes", value=hardware.capacity_bytes, unit="bytes",
        rule=("the device's reported memory" if reported else "the datasheet's memory")
        + " - [hardware] memory_headroom_bytes",
        source=(gpu.usable_memory_source if reported else
                f"{gpu.name}: no reported total recorded; the datasheet's figure"),
        inputs={"usable_memory_bytes": gpu.usable_bytes,
                "memory_headroom_bytes": hardware.memory_headroom_bytes})


def _host_rules(spec: Spec, host_bytes: int,
                transforms: Sequence[Transform]) -> tuple[Derivation, ...]:
    if not host_bytes:
        return ()
    return (Derivation(
        quantity="host_bytes", value=host_bytes, unit="bytes",
        rule=("offloaded components' bytes on one GPU after shards (busiest stage), taken "
              "out of weights, gradients and optimizer bytes"),
        source="the strategies' Transform.offloads: " + "; ".join(
            f"{o.component}: {o.reason}" for t in transforms for o in t.offloads),
        inputs={"gpus_per_node": spec.hardware.gpus_per_node}),)


def score(spec: Spec, layout: Layout, strategies: Mapping[str, Strategy[Any]],
          cache: EvaluationCache) -> tuple[int, int, float | None, str]:
    """(total bytes, device bytes, step seconds, time model) of one layout, without
    building a Plan; SpecError where `build_plan` raises one (an assumed MFU the layout
    cannot reach)."""
    footprint = cache.footprint(spec)
    transforms = transforms_of(spec, footprint, layout, strategies)
    core = evaluate_core(spec, footprint, layout, transforms, cache=cache)
    check_utilization(spec, core.time, core.facts, core.composition)
    step = core.time.step
    return (int(core.memory.peak_total), int(device_peak(spec, core).device),
            None if step is None else float(step), core.time.time_model)


__all__ = ["Evaluation", "MemoryCore", "TimeCore", "build_plan", "device_peak", "evaluate_core",
           "global_batch_of", "memory_timeline", "score", "structure_of", "transforms_of"]
