"""The founding document's tables, as they come out of the shipped examples."""

from __future__ import annotations

import pytest

import llmpar
from llmpar.units import GB, GiB


def example(name: str) -> str:
    """A shipped example, found where the installed package keeps it."""
    return str(llmpar.default_session().presets.path("examples", name))


@pytest.mark.parametrize(
    ("model", "total_gb"),
    [("1b", 16), ("7b", 112), ("70b", 1120)],
)
def test_mixed_precision_adam_is_16_bytes_per_parameter(model, total_gb):
    # Table: 1B -> 16 GB, 7B -> 112 GB, 70B -> 1.12 TB (2 + 2 + 12 bytes/parameter).
    plan = llmpar.evaluate(example("adam-memory-7b"), {"model": model})
    assert plan.weights_bytes == 2 * plan.parameters
    assert plan.gradients_bytes == 2 * plan.parameters
    assert plan.optimizer_bytes == 12 * plan.parameters
    assert plan.total_bytes == total_gb * GB


@pytest.mark.parametrize(
    ("sequence_length", "document_gib"),
    [(1024, 5.27), (2048, 10.54), (4096, 21.08), (8192, 42.16), (16384, 84.32)],
)
def test_qwen3_4b_activations_with_k_30(sequence_length, document_gib):
    plan = llmpar.evaluate(example("qwen3-4b-activations"),
                           {"training.sequence_length": sequence_length})
    exact = 30 * 1 * sequence_length * 36 * 2560 * 2
    assert plan.activations_bytes == exact
    assert plan.activation_k == pytest.approx(30)
    # The document rounds 5.27 GiB and multiplies the rounded value up the table.
    assert plan.activations_bytes / GiB == pytest.approx(document_gib, rel=1e-3)


def test_70b_on_chinchilla_tokens_is_5_88e23_flops():
    plan = llmpar.evaluate(example("train-70b-h100"))
    assert plan.train_tokens == pytest.approx(20 * 70e9)  # D = 20 N
    assert plan.train_flops == pytest.approx(5.88e23)
    assert plan.flops_method == "6nd"


YEAR_SECONDS = 365.25 * 86400


@pytest.mark.parametrize(
    ("num_gpus", "expected_seconds", "tolerance"),
    [
        (1, 41.4 * YEAR_SECONDS, 0.002),
        (8, 5.2 * YEAR_SECONDS, 0.01),
        (64, 7.8 * YEAR_SECONDS / 12, 0.01),
        (512, 4.2 * 7 * 86400, 0.01),
        (1024, 2.1 * 7 * 86400, 0.01),
    ],
)
def test_training_time_at_900_tflops_and_half_mfu(num_gpus, expected_seconds, tolerance):
    # The table rounds to one decimal; each row must round to its printed value.
    plan = llmpar.evaluate(example("train-70b-h100"), {"hardware.num_gpus": num_gpus})
    assert plan.train_seconds == pytest.approx(5.88e23 / (num_gpus * 900e12 * 0.5))
    assert plan.train_seconds == pytest.approx(expected_seconds, rel=tolerance)
