"""Hypothesis profiles as llmpar's own: `ci` (deterministic, the default) and `dev`,
chosen with HYPOTHESIS_PROFILE; and the session."""

from __future__ import annotations

import pytest
from llmpar.testing.profiles import load_hypothesis_profiles

load_hypothesis_profiles()


@pytest.fixture(scope="session")
def session():
    """llmpar with its built-ins and every installed plugin: this one among them."""
    import llmpar

    return llmpar.Session()
