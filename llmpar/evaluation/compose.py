"""Composing the strategies' transforms: what divides, multiplies, moves or splits each
parameter group's model states and each tag of saved activations on one GPU.

Every number may be an array over a search node (`llmpar.arrays`); the composition
is the same for one layout and for many.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from llmpar.arrays import Value, logical_or, where
from llmpar.finetune.footprint import beside
from llmpar.strategy import (
    COMPONENTS,
    Collective,
    Copy,
    FrozenWeights,
    GroupSelection,
    HostWork,
    Offload,
    ProductSplit,
    Shard,
    Transform,
)

_ShardEntry = tuple[str, Value, frozenset[str] | None, frozenset[str]]
"""(strategy, divisor, groups, excluded) of one shard (`Shard`)."""


class Composition:
    """The transforms of one layout (or node), indexed for the evaluator's questions."""

    def __init__(self, transforms: Sequence[Transform]):
        self.transforms = tuple(transforms)
        self.shards: list[tuple[str, Shard]] = []
        self.copies: list[Copy] = []
        self.offloads: list[Offload] = []
        self.host_work: list[HostWork] = []
        self.frozen_weights: list[FrozenWeights] = []
        # Each component's shards, in order: a divisor multiplies only its component's.
        # Kept as (strategy, divisor, groups, excluded): asked for every group of every
        # kind of stage, the selection is read without a method call.
        self._shards_of: dict[str, list[_ShardEntry]] = {c: [] for c in COMPONENTS}
        self._tags: dict[str, Value] = {}
        for transform in self.transforms:  # one pass: most of a transform's fields are empty
            for shard in transform.shards:
                # A shard by 1 (the fast form states its shards everywhere) changes nothing.
                if isinstance(shard.divisor, (int, float)) and shard.divisor == 1:
                    continue
                self.shards.append((transform.strategy, shard))
                self._shards_of[shard.component].append(
                    (transform.strategy, shard.divisor, shard.groups, shard.excluded))
            if transform.copies:
                self.copies += transform.copies
            if transform.offloads:
                self.offloads += transform.offloads
            if transform.host_work:
                self.host_work += transform.host_work
            if transform.frozen_weights:
                self.frozen_weights += transform.frozen_weights
            for split in transform.activation_splits:
                self._tags[split.tag] = self._tags.get(split.tag, 1) * split.divisor
        self._divisors: dict[tuple[str, str | None], dict[str, Value]] = {}
        self._sums: dict[str, Value] = {}
        self._tag_divisors: dict[frozenset[str], Value] = {}
        self._active: tuple[tuple[Collective, Value], ...] | None = None
        self._split: ProductSplit | None = None

    def divisor(self, component: str, group: str, without: str | None = None) -> Value:
        """What `component` of `group` is divided by on one GPU: the product of the
        divisors of every shard that applies (but those of strategy `without`)."""
        return self._divisors_for(component, {group}, without)[group]

    def shard_key(self, component: str) -> tuple[_ShardEntry, ...]:
        """`component`'s shards (one layout: hashable): every `divisor` of it follows from
        them and the group."""
        return tuple(self._shards_of[component])

    def _divisors_for(self, component: str, groups: AbstractSet[str],
                      without: str | None) -> dict[str, Value]:
        """`divisor` of each of `groups` and of those asked for before, each computed once
        per evaluation (asked for every group of every kind of stage)."""
        found = self._divisors.get((component, without))
        if found is None:
            found = self._divisors[(component, without)] = self._products(
                component, groups, without)
        elif not found.keys() >= groups:
            found.update(self._products(component, groups - found.keys(), without))
        return found

    def _products(self, component: str, groups: Iterable[str],
                  without: str | None) -> dict[str, Value]:
        """For each of `groups`, the product of the divisors of `component`'s shards that
        apply to it, in the shards' order, but those of strategy `without`: one pass over
        the shards for all the groups."""
        found: dict[str, Value] = dict.fromkeys(groups, 1)
        for strategy, divisor, named, excluded in self._shards_of[component]:
            if strategy == without:
                continue
            # `Shard.applies_to`, in line: a shard that names its groups reaches only those
            for group in found if named is None else named:
                if group in found and group not in excluded:
                    found[group] = found[group] * divisor
        return found

    def held(self, parameters: Mapping[str, float], bytes_per_parameter: float,
             component: str, without: str | None = None,
             selection: GroupSelection | None = None) -> Value:
        """Bytes of `component` one GPU holds of `parameters` (of the groups in
        `selection`, None: all), each group under its shards and copies (but those of
        strategy `without`)."""
        copies = [c for c in self.copies if c.component == component] if self.copies else ()
        divisors = self._divisors_for(component, parameters.keys(), without)
        total: Value = 0.0
        for group, count in parameters.items():
            if selection is not None and not selection.applies_to(group):
                continue
            size = count * bytes_per_parameter
            for copy in copies:
                if copy.applies_to(group):
                    size = size * copy.copies
            total = total + size / divisors[group]
        return total

    def frozen_held(self, parameters: Mapping[str, float]) -> Value:
        """Bytes one GPU holds of other models' weights (`Transform.frozen_weights`): each
        base group of `parameters` (not an adapter or a trained copy) at the model's
        bytes per parameter, under every shard of the trained model's weights."""
        total: Value = 0.0
        for weights in self.frozen_weights:
            for group, count in parameters.items():
                if beside(group) == group and weights.applies_to(group):
                    total = total + (count * weights.bytes_per_parameter
                                     / self.divisor("weights", group))
        return total

    def offloaded(self, parameters: Mapping[str, float], bytes_per_parameter: float,
                  component: str) -> Value:
        """The part of `held` that strategies keep in host memory instead."""
        moved = [o for o in self.offloads if o.component == component] if self.offloads else ()
        if not moved:
            return 0.0
        total: Value = 0.0
        for group, count in parameters.items():
            where_moved: Value = False
            for offload in moved:
                if offload.applies_to(group):
                    where_moved = logical_or(where_moved, offload.active)
            total = total + where(where_moved, self.held({group: count}, bytes_per_parameter,
                                                         component), 0.0)
        return total

    def tag_key(self) -> tuple[tuple[str, Value], ...]:
        """The activation splits, by tag (one layout: hashable)."""
        return tuple(sorted(self._tags.items()))

    def tag_divisor(self, tags: Iterable[str]) -> Value:
        """What a saved tensor carrying `tags` is divided by."""
        try:  # the inventory's frozen sets of tags: asked once per tensor and kind
            return self._tag_divisors[tags]  # type: ignore[index]
        except (KeyError, TypeError):
            found = math.prod((self._tags[tag] for tag in tags if tag in self._tags), start=1)
            if isinstance(tags, frozenset):
                self._tag_divisors[tags] = found
            return found

    def split_bytes(self, tag_bytes: Mapping[frozenset[str], Value]) -> Value:
        """Activation bytes after every strategy's splits."""
        total: Value = 0.0
        for tags, size in tag_bytes.items():
            total = total + size / self.tag_divisor(tags)
        return total

    def sum_of(self, field: str) -> Value:
        """A Transform field summed over the strategies (buffers, bubbles, FLOPs...)."""
        if field not in self._sums:  # transforms are frozen: each field summed once
            self._sums[field] = sum([getattr(t, field) for t in self.transforms], start=0.0)
        return self._sums[field]

    def micro_batches_per_step(self) -> Value:
        """The first transform's gradient accumulation that states one (by phase), or 1."""
        for transform in self.transforms:
            if transform.micro_batches_per_step is not None:
                return transform.micro_batches_per_step
        return 1

    def active_collectives(self) -> tuple[tuple[Collective, Value], ...]:
        """Every collective with a group of more than one GPU, and where it still runs:
        its calls per step, 0 where another strategy replaces it."""
        if self._active is not None:  # asked for by the time and by the memory peak
            return self._active
        replaced: dict[str, Value] = {}
        for transform in self.transforms:
            for name in transform.replaces:
                replaced[name] = logical_or(replaced.get(name, False), transform.replaces_where)
        found = []
        for transform in self.transforms:
            for collective in transform.collectives:
                if collective.group_size <= 1:
                    continue
                gone = replaced.get(collective.name)
                calls = (collective.calls_per_step if gone is None
                         else where(gone, 0.0, collective.calls_per_step))
                found.append((collective, calls))
        self._active = tuple(found)
        return self._active

    def product_split(self) -> ProductSplit:
        """The transforms' splits of each GPU's matrix products, composed: factors
        multiply; the last expert width stated wins."""
        if self._split is not None:  # asked for by each model of the products' shapes
            return self._split
        width = tokens = experts = 1
        steps: Value = 1
        expert_width = None
        for transform in self.transforms:
            split = transform.product_split
            if split is None:
                continue
            width *= split.width
            tokens *= split.tokens
            experts *= split.experts
            steps = steps * split.attention_steps
            expert_width = split.expert_width if split.expert_width is not None else expert_width
        self._split = ProductSplit(width=width, tokens=tokens, attention_steps=steps,
                                   experts=experts, expert_width=expert_width)
        return self._split
