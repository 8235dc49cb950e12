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


@pytest.fixture(scope="session", autouse=True)
def outputs_match_their_schemas():
    """Every plan's and search result's `to_dict()` that a test makes is checked against
    its JSON Schema (llmpar.output_schema), as JSON: a key the schema lacks, a missing
    one, or a value of another type fails the test that made it."""
    import json

    from schema_validator import errors, is_valid

    from llmpar import plan_json
    from llmpar.output_schema import output_schema
    from llmpar.search.hardware import HardwareSearchResult
    from llmpar.search.result import SearchResult
    from llmpar.search.serving import ServingSearchResult

    schemas = {name: output_schema(name) for name in ("plan", "search")}
    seen: set[tuple[str, int]] = set()  # outputs already checked, by their JSON's hash

    def checked(name, make):
        def to_dict(*args, **kwargs):
            data = make(*args, **kwargs)
            text = json.dumps(data)
            if (name, hash(text)) not in seen:
                value = json.loads(text)
                if not is_valid(value, schemas[name]):
                    found = list(errors(value, schemas[name]))
                    raise AssertionError(f"{name} JSON breaks its schema: "
                                         + "; ".join(found[:5]))
                seen.add((name, hash(text)))
            return data
        return to_dict

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_json, "plan_to_dict", checked("plan", plan_json.plan_to_dict))
        for cls in (SearchResult, ServingSearchResult, HardwareSearchResult):
            patch.setattr(cls, "to_dict", checked("search", cls.to_dict))
        yield
