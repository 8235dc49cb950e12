"""What a workload is: a training recipe beyond one model's forward and backward.

Pre-training and `[finetune]` train one model. A workload plugin adds what a recipe runs
beside it: other models held in memory (DPO's frozen reference, a distillation teacher,
RLHF's reward model), their forward passes and FLOPs, and their working memory. It owns
the spec table `[workload.<name>]`, whose schema is an attrs class it declares, checks it
against the rest of the spec with `Rule`s, and turns it into a `Transform` that composes
with every strategy's: its other models' weights are `FrozenWeights`, sharded as the
trained model's weights are; their forward FLOPs are `model_flops_per_step`. A workload
adds work and memory, never takes them away: its transform states none of a strategy's
divisions (shards, splits, stages, replaced collectives, skipped FLOPs), and the evaluator
refuses one that does.

A plugin registers workloads through `llmpar_register_workloads(register)`; the contract
suite (`llmpar.testing.check_workload_contract`) checks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import attrs

from llmpar.errors import Problem
from llmpar.strategy import Rule, StrategyContext, Transform, problems_of

if TYPE_CHECKING:
    from llmpar.spec import Spec

ConfigT = TypeVar("ConfigT")

DIVIDING_FIELDS = ("shards", "copies", "activation_splits", "stages", "replaces", "offloads",
                   "product_split", "micro_batches_per_step", "skipped_flops_per_step",
                   "bubble_fraction", "busiest_rank_extra_work")
"""Transform fields that belong to strategies: a workload's transform leaves them at
their defaults (it adds models and work; how they are divided is the strategies' job)."""


class Workload(Generic[ConfigT]):
    """Base class for workloads, built-in or third-party.

    Subclasses set `name` (the `[workload.<name>]` table, a bare TOML key that no
    strategy has) and `config_type` (an attrs class: the table's schema, every field with
    a default and a docstring), and override `rules` and `transform`. Both are pure
    functions of their arguments; `transform` takes arrays where the search varies
    `[training] micro_batch_size` or `recompute` (plain arithmetic does).
    """

    name: ClassVar[str]
    config_type: ClassVar[type[Any]]

    def rules(self, config: ConfigT, spec: Spec) -> Sequence[Rule]:
        """The checks of this workload with the rest of the spec (`Rule(path, fails,
        message)`, paths under `$.workload.<name>` or the key at fault); none by default."""
        return ()

    def check(self, config: ConfigT, spec: Spec) -> list[Problem]:
        """Problems of this workload with the rest of the spec: the failing `rules`."""
        return problems_of(list(self.rules(config, spec)))

    def transform(self, config: ConfigT, ctx: StrategyContext) -> Transform:
        """What the workload adds on one GPU under the layout `ctx.layout`: its other
        models (`Transform.frozen_weights`), their FLOPs (`model_flops_per_step`,
        `extra_flops_per_step`), working memory (`buffer_bytes`, `added_activation_bytes`),
        collectives, notes and warnings; `Transform.strategy` is the workload's name.
        The default adds nothing."""
        return Transform(strategy=self.name)


@attrs.frozen(kw_only=True)
class WorkloadTable:
    """One `[workload.<name>]` table of a spec: the workload that owns it and its config.
    Specs compare by name and config."""

    name: str
    config: Any
    workload: Workload[Any] = attrs.field(eq=False, repr=False)


def workload_problems(spec: Spec) -> list[Problem]:
    """Every workload's problems with the rest of the spec."""
    problems: list[Problem] = []
    for table in spec.workload.values():
        problems += table.workload.check(table.config, spec)
    return problems


def workload_transforms(ctx: StrategyContext) -> list[Transform]:
    """Each workload's transform, by name, as the evaluator composes them after the
    strategies'."""
    spec = ctx.spec
    return [spec.workload[name].workload.transform(spec.workload[name].config, ctx)
            for name in sorted(spec.workload)]


def dividing_fields(transform: Transform) -> list[str]:
    """The strategy-only fields a workload's transform sets (empty when none)."""
    found = []
    for field in DIVIDING_FIELDS:
        value = getattr(transform, field)
        unset = (value is None or (isinstance(value, tuple) and not value)
                 or (isinstance(value, (int, float)) and value == 0))
        if not unset:
            found.append(field)
    return found


__all__ = ["DIVIDING_FIELDS", "Workload", "WorkloadTable", "dividing_fields",
           "workload_problems", "workload_transforms"]
