"""Hypothesis profiles: `ci` is deterministic (derandomized, no deadline) and is the
default; `dev` explores more. Choose with HYPOTHESIS_PROFILE=dev."""

from __future__ import annotations

import pytest

from llmpar.testing.profiles import load_hypothesis_profiles

load_hypothesis_profiles()


@pytest.fixture(scope="session")
def session():
    """A session with llmpar's built-ins and whatever plugins are installed."""
    import llmpar

    return llmpar.Session()
