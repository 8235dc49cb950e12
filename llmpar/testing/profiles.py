"""Hypothesis profiles for llmpar's tests and its plugins' tests, in one place.

`ci` (the default) is deterministic: derandomized, no deadline, so a run on a loaded
machine gives the same examples and never fails on time. `dev` explores more.
Choose with the HYPOTHESIS_PROFILE environment variable.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def load_hypothesis_profiles() -> str:
    """Register `ci` and `dev`, load the one HYPOTHESIS_PROFILE names, return its name."""
    settings.register_profile(
        "ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", deadline=None, max_examples=300)
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    settings.load_profile(name)
    return name
