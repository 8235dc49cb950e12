"""The search's fast path: every layout of a node evaluated in one call of evaluation's
own code, on arrays.

A node fixes every degree; the other settings a search varies (each strategy's option
fields, whether a strategy's table is in the spec, the micro-batch size and the
recomputation mode) become numpy arrays over the node's grid (`Grid`), and the
strategies that declare a fast form (`Strategy.vectorised`) get them as their table's
fields and the spec's `[training]`. Their rules give each layout's first problem,
`llmpar.evaluation.evaluate_core` its memory and step time. Nothing here knows any
strategy's formula: it builds arrays and reads results.

- A dimension that is not `vectorised` (it changes a transform's structure) is taken one
  value at a time.
- A strategy without a fast form leaves the others on this path: the layouts whose
  spec holds its table are evaluated one by one (`Judge`), the rest here without it.
- A strategy whose table a dimension adds or leaves out is composed with its effects
  masked where the table is absent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from llmpar.arrays import logical_and, where
from llmpar.errors import PluginError
from llmpar.evaluation.cache import layers_of
from llmpar.evaluation.evaluate import (
    Evaluation,
    device_peak,
    evaluate_core,
    global_batch_of,
    structure_of,
    transforms_of,
)
from llmpar.evaluation.facts import TrainingFacts, training_facts
from llmpar.evaluation.utilization import assumed_hfu, mfu_path
from llmpar.footprint.baseline import Footprint
from llmpar.search.candidates import default_config
from llmpar.search.dimension import DEGREE
from llmpar.search.exhaustive import Judge
from llmpar.search.grid import Grid
from llmpar.search.ranking import Entry
from llmpar.search.result import REJECTED_MEMORY
from llmpar.search.space import MICRO_BATCH, RECOMPUTE, TRAINING_KEYS, Node
from llmpar.search.tally import Tally
from llmpar.strategy import Layout, Transform, fast_capable

if TYPE_CHECKING:
    from llmpar.search.prepare import Prepared
    from llmpar.session import Session
    from llmpar.spec import Spec
    from llmpar.spec.workload import Recompute


def unchecked(instance: Any, **changes: Any) -> Any:
    """A copy of a frozen attrs instance with fields changed, without its validators:
    how array settings enter specs and tables (a validator checks one value)."""
    cls = type(instance)
    copy = object.__new__(cls)
    for field in attrs.fields(cls):
        object.__setattr__(copy, field.name, changes.get(field.name, getattr(instance, field.name)))
    if "_attrs_cached_hash" in getattr(cls, "__slots__", ()):  # `cache_hash`: none kept yet
        object.__setattr__(copy, "_attrs_cached_hash", None)
    return copy


def masked(transform: Transform, where_present: Any) -> Transform:
    """A transform whose effects hold only where its strategy's table is present."""
    if transform.stages or transform.micro_batches_per_step is not None or (
            transform.product_split is not None):
        raise PluginError(f"strategy {transform.strategy!r}: a search dimension adds or drops "
                          "its table, but its transform sets stages, micro-batches or product "
                          "splits, which cannot be masked")

    def keep(value: Any, neutral: Any) -> Any:
        return where(where_present, value, neutral)

    return attrs.evolve(
        transform,
        shards=tuple(attrs.evolve(s, divisor=keep(s.divisor, 1)) for s in transform.shards),
        copies=tuple(attrs.evolve(c, copies=keep(c.copies, 1)) for c in transform.copies),
        activation_splits=tuple(attrs.evolve(s, divisor=keep(s.divisor, 1))
                                for s in transform.activation_splits),
        added_activation_bytes=keep(transform.added_activation_bytes, 0.0),
        collectives=tuple(attrs.evolve(c, calls_per_step=keep(c.calls_per_step, 0.0))
                          for c in transform.collectives),
        replaces_where=logical_and(transform.replaces_where, where_present),
        extra_flops_per_step=keep(transform.extra_flops_per_step, 0.0),
        skipped_flops_per_step=keep(transform.skipped_flops_per_step, 0.0),
        bubble_fraction=keep(transform.bubble_fraction, 0.0),
        buffer_bytes=keep(transform.buffer_bytes, 0.0),
        offloads=tuple(attrs.evolve(o, active=logical_and(o.active, where_present))
                       for o in transform.offloads),
        host_work=tuple(attrs.evolve(w, passes_per_step=keep(w.passes_per_step, 0.0))
                        for w in transform.host_work))


@attrs.frozen(kw_only=True)
class NodeResult:
    """What the fast path found in one node, grid-shaped then flattened."""

    codes: np.ndarray
    """0: valid; else 1 + the index of the first problem's path in `paths`."""
    total_bytes: np.ndarray
    device_bytes: np.ndarray
    """Device memory at the step's peak (`llmpar.evaluation.peak`): what fits."""
    step_seconds: np.ndarray
    exact: np.ndarray
    """Layouts to evaluate one by one instead (a strategy without a fast form applies)."""
    time_model: str


class FastPath:
    """Evaluates the nodes of one prepared search."""

    def __init__(self, prepared: Prepared, session: Session):
        self.prepared = prepared
        self.spec = prepared.spec
        self.strategies = strategies = session.strategies
        self.nested = session.nested_axes
        self.cache = session.cache
        self.judge = Judge(prepared, strategies, session.cache)
        self.paths: list[str] = []
        self.shared: dict[tuple[Any, ...], Any] = {}
        self._facts: dict[tuple[Any, ...], TrainingFacts] = {}
        """Per search, unbounded: a search meets more stage structures and training
        tables than the session's cache keeps."""
        self._stacked: dict[tuple[Any, ...], TrainingFacts] = {}
        builder = self.judge.builder
        self.fields, self.presence, self.order = builder.fields, builder.presence, builder.order
        self.structural = {d.key for d in prepared.space.dimensions if not d.vectorised}
        for name in self.order:
            if not fast_capable(strategies[name]):
                self.structural |= {key for key, _ in self.fields.get(name, ())}
                if name in self.presence:
                    self.structural.add(name)

    # --- per training table -------------------------------------------------------

    def footprint(self, micro_batch_size: int, recompute: Recompute) -> Footprint:
        return self.cache.footprint(self.training(micro_batch_size, recompute))

    def training(self, micro_batch_size: int, recompute: Recompute) -> Spec:
        training = self.spec.training.with_recompute(recompute,
                                                     micro_batch_size=int(micro_batch_size))
        return attrs.evolve(self.spec, training=training, parallel={})

    def facts(self, grid: Grid, transforms: Sequence[Transform], layout: Layout) -> TrainingFacts:
        """The training facts of every training table of the node, stacked along its axis."""
        base = self.footprint(self.spec.training.micro_batch_size, self.spec.training.recompute)
        stages, kinds, _ = structure_of(self.spec, base, transforms, self.cache)
        structure = layers_of(stages)
        global_batch = global_batch_of(self.spec, layout)
        axis = grid.axis(MICRO_BATCH) if grid.has(MICRO_BATCH) else grid.axis(RECOMPUTE)
        combos = [(b, r) for b, r in zip(grid.values(MICRO_BATCH, self.spec.training
                                                     .micro_batch_size),
                                         grid.values(RECOMPUTE, self.spec.training.recompute))]
        found = []
        keys = []
        for b, r in combos:
            key = (structure, b, r, global_batch)
            facts = self._facts.get(key)
            if facts is None:
                facts = self._facts[key] = training_facts(
                    self.training(b, r), self.footprint(b, r), stages, kinds, global_batch)
            found.append(facts)
            keys.append(key)
        # nodes of one stage structure share their stacked facts (the arrays' shape follows
        # from the training axis and the grid's rank)
        shared = (tuple(keys), axis, len(grid.shape))
        stacked: TrainingFacts | None = self._stacked.get(shared)
        if stacked is None:
            stacked = self._stacked[shared] = stack(found, lambda values: grid.along(axis,
                                                                                     values))
        return stacked

    # --- per node ------------------------------------------------------------------

    def evaluate(self, node: Node) -> NodeResult:
        grid = Grid(node, self.shared)
        shape = grid.shape
        codes = np.zeros(shape, dtype=np.int16)
        total = np.zeros(shape)
        device = np.zeros(shape)
        seconds = np.zeros(shape)
        exact = np.zeros(shape, dtype=bool)
        time_model = "none"
        for fixed, where_fixed in self._structural_values(grid):
            part = self._evaluate(grid, fixed)
            codes = np.where(where_fixed, part.codes, codes)
            total = np.where(where_fixed, part.total_bytes, total)
            device = np.where(where_fixed, part.device_bytes, device)
            seconds = np.where(where_fixed, part.step_seconds, seconds)
            exact = np.where(where_fixed, part.exact, exact)
            time_model = part.time_model
        return NodeResult(codes=grid.full(codes), total_bytes=grid.full(total),
                          device_bytes=grid.full(device), step_seconds=grid.full(seconds),
                          exact=grid.full(exact), time_model=time_model)

    def _structural_values(self, grid: Grid) -> Iterator[tuple[dict[str, Any], Any]]:
        """Each combination of the node's structural keys, and where it holds."""
        keys = [k for k in sorted(self.structural) if grid.has(k)]
        distinct = [list(dict.fromkeys(map(_hashable, grid.values(k)))) for k in keys]
        for combo in itertools.product(*distinct):
            mask: Any = True
            for key, value in zip(keys, combo):
                mask = logical_and(mask, grid.along(
                    grid.axis(key), [_hashable(v) == value for v in grid.values(key)], bool))
            yield dict(zip(keys, combo)), mask

    def _evaluate(self, grid: Grid, fixed: Mapping[str, Any]) -> NodeResult:
        spec, node = self.spec, grid.node

        def value(key: str, default: Any, dtype: Any = float) -> Any:
            if key in fixed:
                return fixed[key]
            if not grid.has(key):
                return default
            return grid.array(key, default=default, dtype=dtype)

        # Micro-batch sizes as floats: exact up to 2**53, and a product of them with a large
        # sequence length grows instead of wrapping around as an int64 would.
        training = unchecked(spec.training,
                             micro_batch_size=value(MICRO_BATCH, spec.training.micro_batch_size),
                             recompute=value(RECOMPUTE, spec.training.recompute, str))
        tables, present, exact = self._tables(grid, value)
        vector_spec = unchecked(spec, training=training, parallel=tables)
        layout = self._layout(node, tables, present, vector_spec)
        codes = self._codes(grid, vector_spec, layout, present)
        if np.all(codes != 0):  # every layout breaks a rule: nothing to evaluate
            return NodeResult(codes=codes, total_bytes=np.zeros(grid.shape),
                              device_bytes=np.zeros(grid.shape),
                              step_seconds=np.zeros(grid.shape),
                              exact=np.broadcast_to(exact, grid.shape), time_model="none")
        base = self.footprint(spec.training.micro_batch_size, spec.training.recompute)
        # A workload's transform (not a strategy's) is in every layout of the node.
        transforms = [masked(t, present[t.strategy])
                      if present.get(t.strategy, True) is not True else t
                      for t in transforms_of(vector_spec, base, layout, self.strategies)]
        facts = self.facts(grid, transforms, layout)
        core = evaluate_core(vector_spec, base, layout, transforms, facts, self.cache)
        codes = self._utilization_codes(codes, vector_spec, core)
        step = core.time.step
        device = device_peak(vector_spec, core).device
        return NodeResult(codes=codes, total_bytes=np.broadcast_to(core.memory.peak_total,
                                                                   grid.shape),
                          device_bytes=np.broadcast_to(device, grid.shape),
                          step_seconds=np.broadcast_to(np.inf if step is None else step,
                                                       grid.shape),
                          exact=np.broadcast_to(exact, grid.shape), time_model=core.time.time_model)

    def _tables(self, grid: Grid, value: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """The node's `[parallel.*]` tables with array fields, where each is present, and
        which layouts need a strategy without a fast form (to evaluate one by one)."""
        spec, node = self.spec, grid.node
        tables: dict[str, Any] = {}
        present: dict[str, Any] = {}
        exact: Any = False
        for name in self.order:
            strategy = self.strategies[name]
            default = default_config(spec, strategy, name)
            base = spec.parallel.get(name, default)
            fields = {field: value(key, getattr(base, field), None)
                      for key, field in self.fields.get(name, ())}
            if name in node.degrees and hasattr(default, DEGREE):
                fields[DEGREE] = node.degrees[name]
            here = value(name, name in spec.parallel, bool) if name in self.presence else True
            if not fast_capable(strategy):  # its keys are structural here: plain values
                config = attrs.evolve(base, **fields) if fields else base
                layout = Layout(degrees=dict(node.degrees), num_gpus=spec.hardware.num_gpus,
                                order=spec.rank_order, nested=self.nested)
                if self.judge.builder.included(name, {name: here}, config, layout):
                    exact = True
                continue
            tables[name] = unchecked(base, **fields) if fields else base
            present[name] = True if here is True else here
        return tables, present, exact

    def _layout(self, node: Node, tables: Mapping[str, Any], present: Mapping[str, Any],
                spec: Spec) -> Layout:
        degrees = dict(node.degrees)
        active: dict[str, Any] = {}
        shared: dict[str, Any] = {}
        for name, config in tables.items():
            strategy = self.strategies[name]
            degrees.update(strategy.side_degrees(config))
            active[name] = logical_and(present[name], strategy.active(config))
            shared.update(strategy.shared_settings(config))
        return Layout(degrees=degrees, num_gpus=spec.hardware.num_gpus, order=spec.rank_order,
                      active=active, nested=self.nested, settings=shared)

    def _codes(self, grid: Grid, spec: Spec, layout: Layout,
               present: Mapping[str, Any]) -> np.ndarray:
        """Per layout, 1 + the index (in `self.paths`) of the first failing rule, or 0."""
        codes = np.zeros(grid.shape, dtype=np.int16)
        for name in sorted(spec.parallel, key=lambda n: (self.strategies[n].phase, n)):
            strategy = self.strategies[name]
            try:
                rules = strategy.rules(spec.parallel[name], spec, layout) or ()
            except Exception as exc:
                raise PluginError(f"strategy {name!r} failed to check the spec: "
                                  f"{type(exc).__name__}: {exc}") from exc
            for rule in rules:
                fails = logical_and(rule.fails, present[name])
                if not np.any(fails):
                    continue
                if rule.path not in self.paths:
                    self.paths.append(rule.path)
                code = self.paths.index(rule.path) + 1
                codes = np.where((codes == 0) & fails, code, codes)
        return codes

    def _utilization_codes(self, codes: np.ndarray, spec: Spec, core: Evaluation) -> np.ndarray:
        """Reject the layouts whose HFU the assumed MFU puts above 1, as `score` does."""
        hfu = assumed_hfu(core.time, core.facts, core.composition)
        over = np.broadcast_to(False if hfu is None else hfu > 1.0, codes.shape)
        if not np.any(over & (codes == 0)):
            return codes
        path = mfu_path(spec)
        if path not in self.paths:
            self.paths.append(path)
        return np.where((codes == 0) & over, self.paths.index(path) + 1, codes)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def stack(items: Sequence[Any], along: Any) -> Any:
    """One value whose numbers are arrays (`along(values)`) from several of the same
    shape: attrs instances field by field, mappings key by key (a missing key is 0),
    tuples item by item; numbers that are all equal stay one number."""
    first = items[0]
    if attrs.has(type(first)):
        return type(first)(**{f.name: stack([getattr(i, f.name) for i in items], along)
                              for f in attrs.fields(type(first))})
    if isinstance(first, Mapping):
        keys = list(dict.fromkeys(k for item in items for k in item))
        return {k: stack([item.get(k, 0.0) for item in items], along) for k in keys}
    if isinstance(first, tuple):
        return tuple(stack([item[j] for item in items], along) for j in range(len(first)))
    if all(item == first for item in items[1:]):
        return first
    return along(items)


def run_fast(prepared: Prepared, session: Session, nodes: Sequence[int],
             progress: Any) -> Tally:
    """Evaluate the layouts of `nodes`; keep the top layouts and the Pareto front."""
    path = FastPath(prepared, session)
    tally = Tally()
    settings = prepared.settings
    limit = prepared.memory_limit_bytes
    firsts: dict[int, int] = {}
    done, total = 0, sum(prepared.space.nodes[n].size for n in nodes)
    for n in nodes:
        node = prepared.space.nodes[n]
        result = path.evaluate(node)
        offset = prepared.offsets[n]
        fast = ~result.exact
        codes = result.codes
        for code, count in zip(*np.unique(codes[fast & (codes > 0)], return_counts=True)):
            tally.reject(path.paths[code - 1], int(count))
            firsts.setdefault(int(code), offset + int(np.argmax(fast & (codes == code))))
        valid = fast & (codes == 0)
        tally.evaluated += int(valid.sum())
        if valid.any():
            tally.time_models.add(result.time_model)
        fits = valid & (result.device_bytes <= limit)
        tally.reject(REJECTED_MEMORY, int((valid & ~fits).sum()))
        if prepared.step_limit is not None:
            meets = fits & (result.step_seconds <= prepared.step_limit.seconds)
            tally.reject(prepared.step_limit.path, int((fits & ~meets).sum()),
                         prepared.step_limit.message)
            fits = meets
        keep = np.flatnonzero(fits)
        tally.fitting += int(keep.size)
        tally.entries += candidates(offset + keep, result.total_bytes[keep],
                                    result.step_seconds[keep], settings.objective, settings.top)
        for index in np.flatnonzero(result.exact).tolist():
            entry = path.judge.judge(offset + index, tally)
            if entry is not None:
                tally.fitting += 1
                tally.entries.append(entry)
        done += node.size
        if progress is not None:
            progress("evaluating", done, total)
    _examples(path, firsts, tally)
    return tally


def candidates(index: np.ndarray, memory: np.ndarray, seconds: np.ndarray, objective: str,
               top: int) -> list[Entry]:
    """The layouts that can be among the top N or on the Pareto front."""
    if not index.size:
        return []
    primary, secondary = (memory, seconds) if objective == "memory" else (seconds, memory)
    best = np.lexsort((index, secondary, primary))[:top]
    order = np.lexsort((index, seconds, memory))
    fastest = np.minimum.accumulate(seconds[order])
    on_front = np.concatenate(([True], seconds[order][1:] < fastest[:-1]))
    chosen = np.unique(np.concatenate((best, order[on_front])))
    return [Entry(index=int(index[i]), total_bytes=int(memory[i]),
                  step_seconds=None if not np.isfinite(seconds[i]) else float(seconds[i]))
            for i in chosen.tolist()]


def _examples(path: FastPath, firsts: Mapping[int, int], tally: Tally) -> None:
    """The strategies' own message for each rule's first rejection; one that disagrees
    with the strategies' checks is reported (the fast form and `check` drifted)."""
    for code, index in sorted(firsts.items()):
        problem, _ = path.judge.examine(index)
        reason = path.paths[code - 1]
        if problem is None or problem.path != reason:
            found = "no problem" if problem is None else problem.path
            tally.notes.append(f"the fast path rejected layout {index} at {reason}, but the "
                               f"strategies' checks report {found}: rerun with exact=True "
                               "and report it")
            continue
        tally.examples.setdefault(problem.path, problem.message)


__all__ = ["FastPath", "NodeResult", "TRAINING_KEYS", "masked", "run_fast", "stack",
           "unchecked"]
