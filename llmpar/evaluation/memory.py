"""Per-GPU memory of each pipeline stage: model states and activations under the
strategies' transforms, computed once per kind of stage.

    states(c)    = sum over groups g the stage holds of N_g * bytes(c) * copies / shards,
                   less what strategies offload to the host
    activations  = (saved tensors of one micro-batch after splits + what strategies add)
                   * micro-batches in flight
    total        = weights + gradients + optimizer + activations + buffers

Stages of one kind (same layers, same embedding and output layer: `stage_kind`) hold the
same states; among them the one with the most micro-batches in flight holds the most,
so the peak is found over kinds. Every number may be an array over a search node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

import attrs

from llmpar.arrays import Value, is_array, largest, maximum, rounded, where
from llmpar.dtypes import bytes_per_element
from llmpar.evaluation.compose import Composition
from llmpar.evaluation.facts import StageKinds, TrainingFacts
from llmpar.evaluation.stages import recompute_modules_text
from llmpar.finetune.states import StateCounts
from llmpar.footprint.inventory import ActivationInventory, SavedTensor
from llmpar.plan import Derivation, SavedTensorRow, StageMemory
from llmpar.spec import Spec
from llmpar.strategy import Stage

MODEL_STATE_SOURCE = (
    "ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1): weights and gradients in "
    "their formats, plus the optimizer's states per parameter"
)
COMPONENTS = ("weights", "gradients", "optimizer")


def bytes_per_parameter(spec: Spec) -> dict[str, float]:
    """Bytes of each model-state component per parameter."""
    precision = spec.precision
    return {"weights": bytes_per_element(precision.weights),
            "gradients": bytes_per_element(spec.gradients_dtype),
            "optimizer": spec.optimizer.bytes_per_parameter(precision.weights)}


@attrs.frozen(kw_only=True)
class KindMemory:
    """One kind of stage on one GPU: rounded bytes of each state on the GPU, in host
    memory, and the activations of one micro-batch after splits (None: no estimate)."""

    states: Mapping[str, Value]
    held: Mapping[str, Value]
    """Each state's bytes before offloading (unrounded)."""
    offloaded: Mapping[str, Value]
    """The part of each that is in host memory (unrounded)."""
    host: Value
    activations: Value | None
    in_flight: Value
    """The most micro-batches in flight on a stage of this kind."""
    frozen: Value = 0.0
    """Rounded bytes of other models' weights (a workload's frozen reference), counted
    with the weights but outside the optimizer's states and traffic."""
    head_correction: Value = 0.0
    """Bytes the output layer's and loss's tensors take off `in_flight` micro-batches'
    activations where the schedule holds fewer of them (`Stage.head_micro_batches_in_flight`);
    `activations` is one micro-batch's share of the rest."""

    @property
    def states_bytes(self) -> Value:
        return (self.states["weights"] + self.states["gradients"] + self.states["optimizer"]
                + self.frozen)


@attrs.frozen(kw_only=True)
class MemoryCore:
    """Memory of every kind of stage, and the peak."""

    kinds: tuple[KindMemory, ...]
    buffers: Value
    totals: tuple[Value, ...]
    """Each kind's total at its most micro-batches in flight."""
    peak_total: Value

    def at_peak(self, values: Sequence[Value]) -> Value:
        """Of one value per kind, the peak kind's: the first kind with the largest total."""
        best, found = self.totals[0], values[0]
        for total, value in zip(self.totals[1:], values[1:]):
            better = total > best
            if is_array(better):
                found = where(better, value, found)
                best = where(better, total, best)
            elif better:  # one layout: `where` of a plain condition
                found, best = value, total
        return found


def kind_memory(composition: Composition, parameters: Mapping[str, float],
                per_parameter: Mapping[str, float], tags: Mapping[frozenset[str], Value] | None,
                in_flight: Value, counts: StateCounts | None = None, *,
                head: Value | None = None,
                head_tags: Mapping[frozenset[str], Value] | None = None,
                offloaded_tags: Mapping[frozenset[str], Value] | None = None) -> KindMemory:
    """`counts`: the parameters each component counts (fine-tuning), else `parameters`;
    `head`: the micro-batches whose output-layer and loss tensors (`head_tags`) the kind
    holds where the schedule holds fewer of them than `in_flight`; `offloaded_tags`: the
    activations it keeps in host memory."""
    held, offloaded, states, host = {}, {}, {}, 0.0
    for component in COMPONENTS:
        size = per_parameter[component]
        counted = parameters if counts is None else counts[component]
        held[component] = composition.held(counted, size, component)
        if composition.offloads:
            offloaded[component] = composition.offloaded(counted, size, component)
            moved = rounded(offloaded[component])
        else:  # nothing offloaded: `offloaded` is 0.0, rounded 0
            offloaded[component], moved = 0.0, 0
        states[component] = rounded(held[component]) - moved
        host = host + moved
    activations, correction = None, 0.0
    if tags is not None:
        activations = composition.split_bytes(tags) + composition.sum_of(
            "added_activation_bytes")
        if head is not None and head_tags:
            # the output layer's tensors held for `head` micro-batches, not `in_flight`
            correction = composition.split_bytes(head_tags) * (head - in_flight)
            activations = activations + correction / in_flight
    if offloaded_tags is not None:
        host = host + rounded(composition.split_bytes(offloaded_tags) * in_flight)
    frozen = rounded(composition.frozen_held(parameters)) if composition.frozen_weights else 0.0
    return KindMemory(states=states, held=held, offloaded=offloaded, host=host,
                      activations=activations, in_flight=in_flight, frozen=frozen,
                      head_correction=correction)


def activation_bytes(kind: KindMemory, in_flight: Value) -> Value:
    return 0.0 if kind.activations is None else rounded(kind.activations * in_flight)


def memory_core(spec: Spec, composition: Composition, facts: TrainingFacts, stages: Sequence[Stage],
                kinds: StageKinds, parameters: Sequence[Mapping[str, float]],
                counts: Sequence[StateCounts] | None = None,
                transient_bytes: float = 0.0) -> MemoryCore:
    """Every kind's memory; `parameters` are each kind's unsharded parameters, `counts`
    what each component counts of them in fine-tuning, and `transient_bytes` the
    fine-tuning method's working copy, held beside the strategies' buffers."""
    found = []
    per_parameter = bytes_per_parameter(spec)
    for position, members in enumerate(kinds.members):
        tags = facts.stage_tags[position] if facts.stage_tags else None
        in_flight = largest([stages[i].micro_batches_in_flight for i in members])
        found.append(kind_memory(
            composition, parameters[position], per_parameter, tags, in_flight,
            None if counts is None else counts[position],
            head=stages[members[0]].head_micro_batches_in_flight,
            head_tags=facts.head_tags[position] if facts.head_tags else None,
            offloaded_tags=facts.offloaded_tags[position] if facts.offloaded_tags else None))
    buffers = rounded(composition.sum_of("buffer_bytes") + transient_bytes
                      + transit_bytes(composition, facts))
    totals = tuple(k.states_bytes + activation_bytes(k, k.in_flight) + buffers for k in found)
    return MemoryCore(kinds=tuple(found), buffers=buffers, totals=totals,
                      peak_total=largest(totals))


def transit_bytes(composition: Composition, facts: TrainingFacts) -> Value:
    """The GPU buffer of offloaded activations: the largest layer's worth of any kind of
    stage, on its way to or from host memory."""
    found: Value = 0.0
    for tags in facts.transit_tags:
        found = maximum(found, composition.split_bytes(tags))
    return found


class StageRecords(Sequence[StageMemory]):
    """Every stage's memory of one layout, each record made when first indexed: a plan
    needs its peak stage's and each kind's peak candidate's for its numbers, and lists
    the others (`Plan.stages`) only when they are read. Made from one evaluation's
    values, and never shared between evaluations."""

    def __init__(self, core: MemoryCore, stages: Sequence[Stage], kinds: StageKinds):
        self.stages, self.kinds = stages, kinds
        buffers = int(core.buffers)
        self.buffers = buffers
        # What a kind's stages share, once per kind: a plan lists every stage.
        self.shared = [(int(k.states["weights"] + k.frozen), int(k.states["gradients"]),
                        int(k.states["optimizer"]), int(k.states_bytes) + buffers,
                        int(k.host), k.activations) for k in core.kinds]
        self.made: list[StageMemory | None] = [None] * len(stages)

    def __len__(self) -> int:
        return len(self.stages)

    @overload
    def __getitem__(self, index: int) -> StageMemory: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StageMemory]: ...

    def __getitem__(self, index: int | slice) -> StageMemory | Sequence[StageMemory]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        found = self.made[index]
        if found is None:
            found = self.made[index] = self._record(index)
        return found

    def _record(self, index: int) -> StageMemory:
        stage = self.stages[index]
        weights, gradients, optimizer, fixed, host, per_micro_batch = self.shared[
            self.kinds.kind_of[index]]
        in_flight = stage.micro_batches_in_flight
        # one layout: Python's round, as `rounded` takes for a plain number
        activations = None if per_micro_batch is None else int(round(per_micro_batch
                                                                      * in_flight))
        return StageMemory(
            stage=stage.index, layers=stage.num_layers, weights_bytes=weights,
            gradients_bytes=gradients, optimizer_bytes=optimizer,
            activations_bytes=activations, buffers_bytes=self.buffers,
            total_bytes=fixed + (activations or 0), micro_batches_in_flight=float(in_flight),
            host_bytes=host)

    @property
    def host_bytes(self) -> int:
        """The most any stage keeps in host memory (every kind has a stage)."""
        return max(shared[4] for shared in self.shared)


def stage_records(core: MemoryCore, stages: Sequence[Stage],
                  kinds: StageKinds) -> tuple[StageRecords, int]:
    """Every stage's memory (one layout), and the peak stage: the stage of the peak kind
    with the most micro-batches in flight."""
    peak_kind = core.at_peak(list(range(len(core.kinds))))
    members = kinds.members[int(peak_kind)]
    peak = members[0]  # the most micro-batches in flight, the first stage of those
    for i in members[1:]:
        if ((stages[i].micro_batches_in_flight, -i)
                > (stages[peak].micro_batches_in_flight, -peak)):
            peak = i
    return StageRecords(core, stages, kinds), peak


def memory_derivations(spec: Spec, parameters_total: float, peak: StageMemory,
                       inventory: ActivationInventory | None,
                       rows: Sequence[SavedTensorRow],
                       trainable_total: float | None = None) -> tuple[Derivation, ...]:
    """`trainable_total`: the parameters with gradients and optimizer states, where not
    all are (`[finetune]`)."""
    precision = spec.precision
    trained = parameters_total if trainable_total is None else trainable_total
    states = spec.optimizer.kept_states(precision.weights)
    listed = " + ".join([f"{s.name} ({s.dtype})" for s in states]) or "no states"
    rule = "sum over parameter groups held by the stage of N_g * {} / (shards applying to g)"
    found = [
        Derivation(quantity="weights_bytes", value=peak.weights_bytes, unit="bytes",
                   rule=rule.format(f"bytes({precision.weights})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": parameters_total, "stage": peak.stage}),
        Derivation(quantity="gradients_bytes", value=peak.gradients_bytes, unit="bytes",
                   rule=rule.format(f"bytes({spec.gradients_dtype})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": trained, "stage": peak.stage}),
        Derivation(quantity="optimizer_bytes", value=peak.optimizer_bytes, unit="bytes",
                   rule=rule.format(f"({listed})"), source=MODEL_STATE_SOURCE,
                   inputs={"N": trained, "bytes_per_parameter":
                           spec.optimizer.bytes_per_parameter(precision.weights)}),
    ]
    if inventory is not None:
        # one pass over the rows each (a row is per layer where it names a layer kind)
        layers = sum([row.layers * row.bytes for row in rows if row.layer_kind])
        outside = sum([row.bytes for row in rows if not row.layer_kind])
        found.append(Derivation(
            quantity="activations_bytes", value=peak.activations_bytes, unit="bytes",
            rule=("(stage layers' saved tensors + embedding/output tensors it holds) * "
                  f"micro_batches_in_flight, after splits; recompute = {spec.training.recompute}"
                  + recompute_modules_text(spec)),
            source=inventory.source or f"activation model {inventory.model!r}",
            inputs={"layers": inventory.num_layers, "layers_bytes": layers,
                    "outside_layers_bytes": outside,
                    "micro_batches_in_flight": peak.micro_batches_in_flight}))
    return tuple(found)


def tensor_rows(inventory: ActivationInventory,
                composition: Composition) -> tuple[SavedTensorRow, ...]:
    """The saved tensors of one micro-batch on one GPU, after the strategies' splits,
    for the plan (`inventory` is the stage's, unsplit)."""
    def row(tensor: SavedTensor, kind: str, layers: int) -> SavedTensorRow:
        return SavedTensorRow(name=tensor.name, reason=tensor.reason, shape=tensor.shape_text,
                              bytes_per_element=tensor.bytes_per_element,
                              bytes=tensor.bytes / composition.tag_divisor(tensor.splits),
                              layer_kind=kind, layers=layers)

    rows = [row(t, group.kind, group.count) for group in inventory.groups
            if group.count for t in group.tensors]
    return tuple(rows) + tuple(row(t, "", 1) for t in inventory.fixed)
