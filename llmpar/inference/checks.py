"""Problems of an `[inference]` spec that no single field shows."""

from __future__ import annotations

from llmpar.errors import Problem
from llmpar.spec import Spec
from llmpar.spec.model import ARCHITECTURE_FIELDS


def inference_problems(spec: Spec) -> list[Problem]:
    """Every problem of the serving workload with the model and the layout."""
    inference, model = spec.inference, spec.model
    if inference is None:
        return []
    problems = []
    if not model.has_architecture:
        missing = [name for name in ARCHITECTURE_FIELDS if getattr(model, name) is None]
        problems.append(Problem("$.model", "inference needs the architecture to size the KV "
                                f"cache and the operations; missing: {', '.join(missing)}"))
    if inference.sliding_window and model.sliding_window is None:
        problems.append(Problem("$.inference.sliding_window",
                                "true needs a model with sliding_window; this one has none"))
    limit = model.max_position_embeddings
    if model.position_embedding == "learned" and limit is not None \
            and inference.context_tokens > limit:
        problems.append(Problem("$.inference.generated_tokens",
                                f"prompt_tokens + generated_tokens ({inference.context_tokens:,}) "
                                f"exceeds the learned position table (max_position_embeddings "
                                f"= {limit:,})"))
    data = spec.parallel.get("data")
    if data is not None and bool(getattr(data, "stage", 0)):
        problems.append(Problem("$.parallel.data.zero",
                                "ZeRO/FSDP shard training state; a serving replica keeps whole "
                                "weights: use tensor, pipeline or expert parallelism"))
    return problems
