"""A whole run spec: model, hardware, optimizer, formats, workload and layout."""

from __future__ import annotations

from typing import Any

import attrs

from llmpar.placement import RANK_ORDER
from llmpar.spec.finetune import Finetune
from llmpar.spec.hardware import Hardware
from llmpar.spec.inference import Inference
from llmpar.spec.model import Model
from llmpar.spec.optimizer import Optimizer
from llmpar.spec.search import Search
from llmpar.spec.workload import Precision, Training

SCHEMA_VERSION = 1


@attrs.frozen(kw_only=True)
class Spec:
    """Everything `llmpar.evaluate` needs; load one with `llmpar.load_spec`.

    `parallel` maps each strategy's name to its table, an instance of the attrs
    class that strategy's plugin declares (`[parallel.data]` -> data's config).
    """

    model: Model
    hardware: Hardware
    optimizer: Optimizer
    precision: Precision = attrs.field(factory=Precision)
    training: Training = attrs.field(factory=Training)
    inference: Inference | None = None
    """A serving workload (`[inference]`); when set, `training` is unused."""
    parallel: dict[str, Any] = attrs.field(factory=dict, hash=False)
    rank_order: tuple[str, ...] = RANK_ORDER
    """`[parallel] order`: where ranks sit, innermost first (llmpar.placement)."""
    version: int = SCHEMA_VERSION
    """Spec schema version."""
    search: Search | None = None
    """`[search]`: limits and objective for `llmpar search`; evaluation ignores it."""
    finetune: Finetune | None = None
    """`[finetune]`: which parameters training updates (None: all of them)."""
    workload: dict[str, Any] = attrs.field(factory=dict, hash=False)
    """`[workload.<name>]` tables: what a workload plugin runs beside the trained model
    (`llmpar.workload`), each a `WorkloadTable` (the workload and its config)."""
    source: str | None = attrs.field(default=None, eq=False)
    """The file this spec was read from, for error messages; not part of the spec."""

    @property
    def gradients_dtype(self) -> str:
        """The gradients' format: the optimizer's own (fp32 main gradients), else
        `[precision] gradients`."""
        return self.optimizer.gradients_dtype(self.precision.gradients)

    @property
    def tuning(self) -> Finetune | None:
        """`[finetune]` where it changes training (not absent, not `method = "full"`)."""
        finetune = self.finetune
        return finetune if finetune is not None and finetune.changes_training else None
