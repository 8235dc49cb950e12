"""What every inference formula looks at: the spec, its layout, the unsplit footprint,
the strategies' transforms and the pipeline stages."""

from __future__ import annotations

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

    @property
    def inference(self) -> Inference:
        assert self.spec.inference is not None
        return self.spec.inference

    def degree(self, strategy: str) -> int:
        return self.layout.degree(strategy)

    def with_batch(self, batch: int) -> Serving:
        """The same serving setup with `batch_size` sequences per replica."""
        inference = attrs.evolve(self.inference, batch_size=batch)
        return attrs.evolve(self, spec=attrs.evolve(self.spec, inference=inference))
