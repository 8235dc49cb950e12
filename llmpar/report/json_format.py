"""The JSON report of a Plan: `plan.to_dict()`, documented in docs/json-schema.md."""

from __future__ import annotations

import json

from llmpar.plan import Plan


def json_report(plan: Plan) -> str:
    """The plan as indented JSON; `schema_version` names the field set."""
    return json.dumps(plan.to_dict(), indent=2)
