"""What a well-formed transform and plan look like: the rules of the contract suite's
"well-formed-transform" check, usable on their own (evaluation checks every transform
with the same `transform_problems`)."""

from __future__ import annotations

from llmpar.evaluation.validity import bad_number, transform_problems
from llmpar.plan import Plan

PLAN_NUMBERS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                "buffers_bytes", "total_bytes", "host_bytes", "flops_per_step",
                "hardware_flops_per_step", "step_seconds", "communication_seconds",
                "exposed_communication_seconds", "bubble_fraction", "bubble_seconds",
                "optimizer_seconds", "offload_seconds", "exposed_offload_seconds")


def plan_problems(plan: Plan) -> list[str]:
    """Plan numbers that are negative or not finite."""
    problems = []
    for label in PLAN_NUMBERS:
        value = getattr(plan, label, None)
        if value is not None and bad_number(value):
            problems.append(f"plan.{label} = {value!r}")
    return problems


__all__ = ["PLAN_NUMBERS", "plan_problems", "transform_problems"]
