"""A workload longer than the model's position limit (`max_position_embeddings`): one
rule for training (`[training] sequence_length`) and serving (prompt + generated).

A learned position table has no row past its size, so a longer sequence is an error.
Other encodings (RoPE, ALiBi, none) run past the limit, as long-context extension does
(RoPE scaling, YaRN), but the model was not trained there: a warning in the plan.
"""

from __future__ import annotations

from llmpar.errors import Problem
from llmpar.spec import Model

TRAINED_POSITIONS = "training.sequence_length"
"""The key whose tokens take a trained sequence's positions, as messages name it."""
SERVED_POSITIONS = "inference.prompt_tokens + generated_tokens"
"""The keys whose tokens take a served sequence's positions."""


def position_limit_problem(model: Model, tokens: int, path: str, what: str) -> Problem | None:
    """An error at `path` when `tokens` positions (`what` describes them) exceed a
    learned position table."""
    limit = model.max_position_embeddings
    if model.position_embedding != "learned" or limit is None or tokens <= limit:
        return None
    return Problem(path, f"{what} ({tokens:,}) exceeds the learned position table "
                         f"(max_position_embeddings = {limit:,})")


def position_limit_warning(model: Model, tokens: int, what: str) -> str | None:
    """A warning when `tokens` positions (`what` names the keys) exceed
    max_position_embeddings under an encoding that runs past it."""
    limit = model.max_position_embeddings
    if limit is None or tokens <= limit:
        return None
    return (f"{what} ({tokens:,}) exceeds model.max_position_embeddings ({limit:,}): "
            "positions the model was not trained on (long-context extension)")
