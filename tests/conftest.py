"""Hypothesis profiles: `ci` is deterministic (derandomized, no deadline) and is the
default; `dev` explores more. Choose with HYPOTHESIS_PROFILE=dev."""

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
    """A session with llmpar's built-ins and whatever plugins are installed."""
    import llmpar

    return llmpar.Session()
