"""Speculative decoding with draft heads (`[inference.speculative]`).

Each step the draft head (draft_layers transformer layers of the target's shape, sharing
its embedding and output layer: EAGLE, Li et al. 2024, arXiv:2401.15077; DeepSeek-V3's
multi-token prediction module, arXiv:2412.19437 Sec. 2.2) proposes k tokens, one decode
step of its own layers each, and the target verifies them in one forward step of k + 1
tokens per sequence (queries k + 1, every position's logits). With each proposed token
accepted with probability alpha, independently, a step yields on average

    E = (1 - alpha^(k + 1)) / (1 - alpha)

tokens per sequence (Leviathan, Kalman and Matias 2023, arXiv:2211.17192, Eq. 1), so

    TPOT = (verify step + k x draft step) / E,

each step a roofline of its operations with its collectives (the engine's host time once,
with the verify step). Memory: the head's weights and its layers' KV cache on the last
pipeline stage. Not modelled: MTP's projection of the concatenated embeddings (2h x h a
depth), tree drafts, a separate draft model.
"""

from __future__ import annotations

import attrs

from llmpar.footprint.mtp import mtp_block_model
from llmpar.inference.serving import Serving
from llmpar.spec import Spec
from llmpar.spec.inference import Speculative
from llmpar.spec.quantities import Seconds
from llmpar.strategy import Layout

SHARED_GROUPS = ("embedding", "head")
"""Parameter groups the draft head shares with the target (not held twice)."""


def expected_tokens(speculative: Speculative) -> float:
    """Tokens a verify step yields per sequence on average (Leviathan et al. 2023, Eq. 1)."""
    alpha, k = speculative.acceptance_rate, speculative.draft_tokens
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def draft_spec(spec: Spec, layout: Layout) -> tuple[Spec, Layout]:
    """The draft head as a spec of its own: the target's last layer draft_layers times
    (its kind: experts or a dense MLP, its token mixer, its window; `mtp_block_model`,
    the block of a shipped multi-token-prediction module), on the target's ranks but its
    pipeline (the head runs on the last stage)."""
    inference = spec.inference
    assert inference is not None and inference.speculative is not None
    head = mtp_block_model(spec.model, inference.speculative.draft_layers)
    engine = inference.engine
    if engine is not None:  # the engine's host time is the verify step's, once a step
        engine = attrs.evolve(engine, step_overhead_seconds=Seconds(0.0),
                              step_overhead_per_sequence_seconds=Seconds(0.0))
    stages = layout.degree("pipeline")
    parallel = {name: config for name, config in spec.parallel.items() if name != "pipeline"}
    drafted = attrs.evolve(
        spec, model=head, parallel=parallel,
        hardware=attrs.evolve(spec.hardware, num_gpus=spec.hardware.num_gpus // stages),
        inference=attrs.evolve(inference, speculative=None, engine=engine))
    degrees = {name: d for name, d in layout.degrees.items() if name != "pipeline"}
    active = {name: on for name, on in layout.active.items() if name != "pipeline"}
    return drafted, attrs.evolve(layout, degrees=degrees, num_gpus=layout.num_gpus // stages,
                                 active=active)


def draft_weights_bytes(draft: Serving) -> float:
    """The head's own weights on one GPU (embedding and output layer are the target's)."""
    return sum(value for group, value in draft.weights_by_group.items()
               if group not in SHARED_GROUPS)
