"""Results that many evaluations share, kept by the session that made them.

The baseline footprint depends only on the model, the formats and the training table;
the training facts only on those, the pipeline stages and the global batch. A sweep,
a search or an embedder evaluating many layouts of one model reuses them. They are
pure functions of their keys (frozen specs), so a cached result is the result; the
cache holds at most `size` of each, dropping the oldest.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from llmpar.evaluation.facts import StageKinds, TrainingFacts, stage_kind, training_facts
from llmpar.evaluation.stages import stage_inventory
from llmpar.footprint.activations import ActivationModel
from llmpar.footprint.baseline import Footprint, baseline_footprint
from llmpar.footprint.inventory import ActivationInventory
from llmpar.footprint.parameters import ParameterCount, count_parameters
from llmpar.roofline import Rates, rates_of
from llmpar.spec import Gpu, Hardware, Model, Spec
from llmpar.strategy import Collective, Stage
from llmpar.trust import Family, load_families

T = TypeVar("T")
CollectiveSeconds = Callable[[Collective, Hardware, Any], tuple[Any, str]]
"""(collective, hardware, buffer bytes) -> (seconds of one call or None, link tier)."""
SIZE = 64


class Bounded:
    """A dict of at most `size` entries, oldest dropped first."""

    def __init__(self, size: int = SIZE):
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        try:
            found = self._items.get(key, self)
        except TypeError:  # an array inside the key (a search node): nothing to share
            return compute()
        if found is self:
            found = compute()
            if self.size > 0:
                self._items[key] = found
                if len(self._items) > self.size:
                    self._items.popitem(last=False)
        return found  # type: ignore[no-any-return]

    def peek(self, key: Hashable) -> Any:
        """What is kept under `key`, or None."""
        return self._items.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        """Keep `value` under `key` (nothing with a size of 0)."""
        if self.size > 0:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self.size:
                self._items.popitem(last=False)


class EvaluationCache:
    """What a session brings to every evaluation: its plugins' activation models and
    collective cost model, and the footprints and training facts it keeps."""

    def __init__(self, size: int = SIZE,
                 activation_models: Mapping[str, ActivationModel] | None = None,
                 collective_seconds: CollectiveSeconds | None = None):
        self.activation_models = activation_models
        self.collective_seconds = collective_seconds
        self._families: tuple[Family, ...] | None = None
        """Cost of one collective call; None: llmpar's (`seconds_of`)."""
        self._footprints = Bounded(size)
        self._parameters = Bounded(size)
        self._facts = Bounded(size)
        self._inventories = Bounded(size)
        self._structures = Bounded(size)
        self._shape_losses = Bounded(size)
        self._rows = Bounded(size)
        self._peaks = Bounded(size)
        self._checked = Bounded(size)
        self._rates = Bounded(size)
        self._last_layers: tuple[Sequence[Stage], tuple[tuple[object, ...], ...]] | None = None
        self._footprint_tokens = Bounded(size)
        self._tokens = itertools.count()  # never reused: a dropped token keys nothing again
        self._last_footprint_key: tuple[Spec, Hashable] | None = None

    def checked(self, spec: Spec, compute: Callable[[], T]) -> T:
        """What checking `spec` gave (its layout), kept for the very object checked: a
        spec is frozen, so the same object checks the same; another object, even an equal
        one, is checked again. The entry holds a weak reference, so that a dropped spec's
        id reused by another object cannot answer for it."""
        key = id(spec)
        found: tuple[weakref.ref[Spec], T] | None = self._checked.peek(key)
        if found is not None and found[0]() is spec:
            return found[1]
        result = compute()
        self._checked.put(key, (weakref.ref(spec), result))
        return result

    def footprint_key(self, spec: Spec) -> Hashable:
        """What the footprint depends on (the model, formats, training and fine-tuning),
        as a token that hashes at once: every cache of an evaluation keys on it, so the
        token of the spec object asked for last is kept (a frozen spec keys the same), and
        equal parts get the same token while it is kept. Parts a search node fills with
        arrays are their own key, which no cache keeps (`Bounded.get`)."""
        last = self._last_footprint_key
        if last is not None and last[0] is spec:
            return last[1]
        parts = (spec.model, spec.precision, spec.training, spec.finetune)
        try:
            hash(parts)
        except TypeError:  # an array inside the parts
            token: Hashable = parts
        else:
            token = self._footprint_tokens.get(parts, self._tokens.__next__)
        self._last_footprint_key = (spec, token)
        return token

    def validation_families(self) -> tuple[Family, ...]:
        """llmpar's validation families (`llmpar.trust`), read on first use."""
        if self._families is None:
            self._families = load_families()
        return self._families

    def footprint(self, spec: Spec) -> Footprint:
        return self._footprints.get(self.footprint_key(spec), lambda: baseline_footprint(
            spec, self.activation_models))

    def parameters(self, model: Model) -> ParameterCount:
        """The model's parameters by group (`count_parameters`), by the model alone: what
        a serving spec's footprint holds."""
        return self._parameters.get(model, lambda: count_parameters(model))

    def facts(self, spec: Spec, footprint: Footprint, stages: Sequence[Stage],
              kinds: StageKinds, global_batch: int) -> TrainingFacts:
        key = (self.footprint_key(spec), self.layers_key(stages), global_batch)
        return self._facts.get(key, lambda: training_facts(spec, footprint, stages, kinds,
                                                           global_batch))

    def stage_inventory(self, spec: Spec, footprint: Footprint,
                        stage: Stage) -> ActivationInventory:
        key = (self.footprint_key(spec), stage_kind(spec, stage))
        return self._inventories.get(key, lambda: stage_inventory(spec, footprint, stage))

    def structure(self, spec: Spec, footprint: Footprint, stages: Sequence[Stage],
                  compute: Callable[[], tuple[StageKinds, tuple[dict[str, float], ...]]]
                  ) -> tuple[StageKinds, tuple[dict[str, float], ...]]:
        """The stages' kinds and each kind's parameters, by the stages' layers."""
        key = (self.footprint_key(spec), self.layers_key(stages))
        return self._structures.get(key, compute)

    def layers_key(self, stages: Sequence[Stage]) -> tuple[tuple[object, ...], ...]:
        """`layers_of(stages)`, once per evaluation: the structure, the training facts and
        the memory peak of one evaluation key on the same stages (the very object, which
        a frozen tuple of frozen stages cannot change)."""
        last = self._last_layers
        if last is not None and last[0] is stages:
            return last[1]
        key = layers_of(stages)
        self._last_layers = (stages, key)
        return key

    def rates(self, gpu: Gpu) -> Rates:
        """The GPU's rates (`llmpar.roofline.rates_of`), by the GPU alone."""
        return self._rates.get(gpu, lambda: rates_of(gpu))

    def shape_loss(self, key: Hashable, compute: Callable[[], float]) -> float:
        """What products lose to their shapes (`llmpar.evaluation.matmuls`), by the spec's
        model, formats and training, the GPU and the rank's shape."""
        return self._shape_losses.get(key, compute)

    def rows(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The plan's saved-tensor rows, by stage inventory and activation splits."""
        return self._rows.get(key, compute)


    def memory_peak(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The plan's memory peak (`llmpar.evaluation.peak`), by everything it reads."""
        return self._peaks.get(key, compute)


def layers_of(stages: Sequence[Stage]) -> tuple[tuple[object, ...], ...]:
    """What a set of stages is, but for the micro-batches in flight: a cache key (a
    DualPipe mirror's layers and share included)."""
    return tuple((s.first_layer, s.num_layers, s.has_embedding, s.has_head)
                 + (() if s.mirror is None else (layers_of((s.mirror,)), s.mirror_share))
                 for s in stages)
