"""Problems of an `[inference]` spec that no single field shows."""

from __future__ import annotations

from llmpar.errors import Problem
from llmpar.positions import SERVED_POSITIONS, position_limit_problem
from llmpar.spec import Spec


def inference_problems(spec: Spec) -> list[Problem]:
    """Every problem of the serving workload with the model and the layout."""
    inference, model = spec.inference, spec.model
    if inference is None:
        return []
    problems = []
    if not model.has_architecture:
        missing = [name for name in model.architecture_fields
                   if getattr(model, name) is None]
        problems.append(Problem("$.model", "inference needs the architecture to size the KV "
                                f"cache and the operations; missing: {', '.join(missing)}"))
    if inference.sliding_window and model.sliding_window is None:
        problems.append(Problem("$.inference.sliding_window",
                                "true needs a model with sliding_window; this one has none"))
    positions = position_limit_problem(model, inference.context_tokens,
                                       "$.inference.generated_tokens", SERVED_POSITIONS)
    if positions is not None:
        problems.append(positions)
    if inference.two_batch_overlap and not inference.continuous and inference.batch_size < 2:
        problems.append(Problem("$.inference.two_batch_overlap",
                                "true splits each step's sequences into two micro-batches: "
                                f"needs batch_size >= 2 (it is {inference.batch_size})"))
    data = spec.parallel.get("data")
    if data is not None and bool(getattr(data, "stage", 0)):
        problems.append(Problem("$.parallel.data.zero",
                                "ZeRO/FSDP shard training state; a serving replica keeps whole "
                                "weights: use tensor, pipeline or expert parallelism"))
    return problems
