"""A Plan as plain data and back: schema 1's flat keys beside the nested parts.

`plan_to_dict` writes every key of schema 1, in its order and with its meaning (read
through the Plan's properties; schema 2 changed what a training plan's `fits` is
decided on), then `training` (or null) and `serving` (a list of pools). `plan_from_dict`
reads that back; a schema-1 dict written before the parts existed is read from its flat
keys, and its `fits` (the steady-state verdict) is kept as `training.steady_state_fits`.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from llmpar.plan import Plan, ServingPool, TrainingPart

V1_KEYS = (
    "schema_version", "model", "gpu", "num_gpus", "layout", "weights_bytes", "gradients_bytes",
    "optimizer_bytes", "activations_bytes", "buffers_bytes", "total_bytes", "capacity_bytes",
    "fits", "host_bytes", "parameters", "active_parameters", "parameters_by_group",
    "sequence_length", "micro_batch_size", "global_batch_size", "micro_batches_per_step",
    "tokens_per_step", "flops_per_step", "flops_per_step_6nd", "flops_method",
    "hardware_flops_per_step", "step_seconds", "tokens_per_second", "mfu", "hfu",
    "train_tokens", "train_steps", "train_flops", "train_seconds", "gpu_hours",
    "activation_model", "activation_k", "activation_tensors", "time_model", "compute_seconds",
    "communication_seconds", "exposed_communication_seconds", "bubble_fraction",
    "bubble_seconds", "optimizer_seconds", "offload_seconds", "exposed_offload_seconds",
    "collectives", "peak_stage", "stages", "workload", "kv_cache_bytes",
    "runtime_overhead_bytes", "max_batch_size", "max_batch_size_limited_by",
    "max_context_tokens", "max_context_tokens_limited_by", "prefill_seconds", "tpot_seconds",
    "latency_seconds", "tokens_per_second_per_gpu", "tokens_per_second_per_user",
    "decode_compute_bound_batch_size", "phases", "warnings", "derivations")
"""Every key of schema 1, in its order."""
KEYS = V1_KEYS + ("training", "serving")
"""Every key `plan_to_dict` writes."""
POOL_FROM_V1 = {"batch_size": "micro_batch_size", "context_tokens": "sequence_length",
                "workspace_bytes": "activations_bytes"}
"""A serving pool's fields that schema 1 spelled otherwise."""


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    for union in (float | int | str, float | int | bool | None):
        converter.register_structure_hook(union, lambda value, _: value)
    converter.register_structure_hook_func(
        lambda kind: kind == dict[str, float | int | str], lambda value, _: dict(value))
    return converter


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    converter = cattrs.Converter()
    found = {key: converter.unstructure(getattr(plan, key)) for key in V1_KEYS}
    found["training"] = None if plan.training is None else converter.unstructure(plan.training)
    found["serving"] = [converter.unstructure(pool) for pool in plan.serving]
    return found


def _part(data: Mapping[str, Any], cls: type, renamed: Mapping[str, str]) -> dict[str, Any]:
    """A part's fields from schema 1's flat keys."""
    return {f.name: data[renamed.get(f.name, f.name)] for f in attrs.fields(cls)
            if renamed.get(f.name, f.name) in data}


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    converter = _converter()
    hints = typing.get_type_hints(Plan)
    fields = {f.name: converter.structure(data[f.name], hints[f.name])
              for f in attrs.fields(Plan)
              if f.name in data and f.name not in ("training", "serving")}
    training, serving = data.get("training"), data.get("serving")
    workload = data.get("workload", "training")
    if "training" not in data and workload == "training":
        training = _part(data, TrainingPart, {})
    if "serving" not in data and workload == "inference":
        serving = [{**_part(data, ServingPool, POOL_FROM_V1),
                    "num_gpus": data["num_gpus"], "layout": data["layout"]}]
    if training is not None and data.get("schema_version", 1) < 2 and "fits" in data:
        # schema 1 decided `fits` on the steady-state sum
        training = {**training, "steady_state_fits": data["fits"]}
    fields["training"] = None if training is None else converter.structure(training,
                                                                           TrainingPart)
    fields["serving"] = tuple(converter.structure(pool, ServingPool) for pool in serving or ())
    return Plan(**fields)
