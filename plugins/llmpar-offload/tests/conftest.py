"""Hypothesis profiles as llmpar's own: `ci` (deterministic, the default) and `dev`,
chosen with HYPOTHESIS_PROFILE; and the session."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def session():
    """llmpar with its built-ins and every installed plugin: this one among them."""
    import llmpar

    return llmpar.Session()
