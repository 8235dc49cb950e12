"""What every inference formula looks at: the spec, its layout, the unsplit footprint,
the strategies' transforms and the pipeline stages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from llmpar.footprint.baseline import Footprint
from llmpar.spec import Spec
from llmpar.spec.inference import Inference
from llmpar.strategy import Layout, Stage, Transform


@attrs.frozen(kw_only=True)
class Serving:
    spec: Spec
    layout: Layout
    footprint: Footprint
    transforms: tuple[Transform, ...]
    stages: tuple[Stage, ...]
    weights_by_group: Mapping[str, float] = attrs.field(factory=dict, eq=False)
    """Bytes of each parameter group's weights on one GPU under the shards, all layers
    (`llmpar.inference.weights`): computed once, read by every operation."""
    layer_counts: tuple[tuple[Any, int], ...] = attrs.field(default=(), eq=False)
    """How many layers of each kind (`llmpar.inference.operations.LayerKind`)."""
    strategies: Mapping[str, Any] = attrs.field(factory=dict, eq=False)
    """The session's strategies (for their serving collectives)."""
    draft: Serving | None = attrs.field(default=None, eq=False)
    """The draft head of speculative decoding as a model of its own layers, on the same
    tensor and expert ranks (`llmpar.inference.speculative`); None without one."""
    fixed: tuple[Any, ...] = attrs.field(default=(), eq=False)
    """Each stage's weights, runtime allowance and cache windows
    (`llmpar.inference.memory.StageFixed`): computed once."""
    constants: Any = attrs.field(default=None, eq=False)
    """What every operation of a step reads whatever the step
    (`llmpar.inference.operations.OperationConstants`): computed once; None: computed
    where needed."""

    inference: Inference = attrs.field(init=False, eq=False, repr=False)
    """The spec's `[inference]` table (set from `spec`: every formula reads it)."""

    def __attrs_post_init__(self) -> None:
        assert self.spec.inference is not None
        object.__setattr__(self, "inference", self.spec.inference)

    def degree(self, strategy: str) -> int:
        return self.layout.degrees.get(strategy, 1)

    def with_batch(self, batch: int) -> Serving:
        """The same serving setup with `batch_size` sequences per replica."""
        inference = attrs.evolve(self.inference, batch_size=batch)
        return attrs.evolve(self, spec=attrs.evolve(self.spec, inference=inference))
