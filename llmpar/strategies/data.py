"""Data parallelism: replicas of the whole model, each on its share of the batch.

Every replica holds all weights, gradients and optimizer states (ZeRO sharding
is not modelled yet) and runs global_batch / (micro_batch x degree)
micro-batches per optimizer step, accumulating gradients between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from llmpar.errors import Problem
from llmpar.hookspecs import hookimpl
from llmpar.spec import Spec
from llmpar.spec.validators import FieldError
from llmpar.strategy import Layout, Strategy, StrategyContext, Transform


def _degree_or_fill(_instance: Any, attribute: Any, value: int) -> None:
    if value != -1 and value < 1:
        raise FieldError(attribute.name, f"must be >= 1, or -1 for all GPUs left, got {value!r}")


@attrs.frozen(kw_only=True)
class DataConfig:
    """`[parallel.data]`."""

    degree: int = attrs.field(default=-1, validator=_degree_or_fill)
    """Replicas; -1 (the default) takes every GPU the other strategies leave."""


def micro_batches_per_step(spec: Spec, degree: int) -> int:
    """Gradient-accumulation steps: global batch / (micro-batch x replicas)."""
    training = spec.training
    if training.global_batch_size is None:
        return 1
    return training.global_batch_size // (training.micro_batch_size * degree)


class DataParallel(Strategy):
    name = "data"
    config_type = DataConfig
    phase = 10
    always_active = True

    def check(self, config: DataConfig, spec: Spec, layout: Layout) -> list[Problem]:
        training = spec.training
        degree = layout.degree(self.name)
        per_pass = training.micro_batch_size * degree
        batch = training.global_batch_size
        if batch is not None and batch % per_pass:
            return [Problem("$.training.global_batch_size",
                            f"global_batch_size ({batch}) must be a multiple of "
                            f"micro_batch_size ({training.micro_batch_size}) x data degree "
                            f"({degree}) = {per_pass}")]
        return []

    def transform(self, config: DataConfig, ctx: StrategyContext) -> Transform:
        degree = ctx.layout.degree(self.name)
        return Transform(
            strategy=self.name,
            micro_batches_per_step=micro_batches_per_step(ctx.spec, degree),
            notes=(f"{degree} replicas, each with the whole model",),
        )


@hookimpl
def llmpar_register_strategies(register: Callable[[Strategy], None]) -> None:
    register(DataParallel())
