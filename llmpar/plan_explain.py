"""How every field of a plan's JSON came about (`Plan.explain(field)`, `llmpar explain`).

A field is named by its path in `plan.to_dict()`: `mfu`, `training.mfu`,
`stages[0].total_bytes`, `collectives[2].exposed_seconds`, `serving[0].tpot_seconds`. Its
answer is, in this order:

1. the Derivation the evaluation recorded for it (the code that computed the number wrote
   its rule, inputs and source);
2. for a field of a derivation or of a strategy's note, that record;
3. for a field copied from the spec, the spec key it comes from;
4. for a field that sums or compares others (a stage's total, the step's communication,
   `fits`), that relation with the record's own numbers as inputs;
5. otherwise the field's documentation in the record's class (its attribute docstring),
   with the record's neighbouring numbers as inputs and the class as its source.

Explanations are built on demand: evaluation records nothing for them.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.plan_records import Derivation

if TYPE_CHECKING:
    from llmpar.plan import Plan

Path = tuple[str | int, ...]

_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_path(text: str) -> Path:
    """'stages[0].total_bytes' -> ('stages', 0, 'total_bytes'); KeyError when malformed."""
    tokens: list[str | int] = []
    position = 0
    for match in _TOKEN.finditer(text):
        gap = text[position:match.start()]
        if gap not in ("", ".") or (gap == "" and position and match.group(1)):
            raise KeyError(text)
        tokens.append(match.group(1) if match.group(1) else int(match.group(2)))
        position = match.end()
    if not tokens or position != len(text) or isinstance(tokens[0], int):
        raise KeyError(text)
    return tuple(tokens)


def format_path(path: Path) -> str:
    text = ""
    for token in path:
        text += f"[{token}]" if isinstance(token, int) else (f".{token}" if text else token)
    return text


def leaf_paths(data: object, prefix: Path = ()) -> list[Path]:
    """Every leaf (number, string, bool, None, empty list or table) of plain data."""
    if isinstance(data, Mapping) and data:
        return [p for key, value in data.items() for p in leaf_paths(value, (*prefix, key))]
    if isinstance(data, list) and data:
        return [p for i, value in enumerate(data) for p in leaf_paths(value, (*prefix, i))]
    return [prefix]


def _value_at(data: Any, path: Path) -> Any:
    for token in path:
        if isinstance(token, int):
            if not isinstance(data, list) or not 0 <= token < len(data):
                raise KeyError(format_path(path))
        elif not isinstance(data, Mapping) or token not in data:
            raise KeyError(format_path(path))
        data = data[token]
    return data


SPEC_KEYS: Mapping[str, str] = {
    "model": "model (a preset's name, or [model] name)",
    "gpu": "hardware.gpu (a GPU preset's name, or the [hardware] cluster's GPU)",
    "num_gpus": "hardware.num_gpus",
    "sequence_length": "training.sequence_length (serving: inference.prompt_tokens + "
                       "inference.generated_tokens)",
    "micro_batch_size": "training.micro_batch_size (serving: inference.batch_size)",
    "activation_model": "training.activation_model",
    "framework": "training.framework (unset: megatron-core)",
    "train_tokens": "training.tokens, or training.tokens_per_parameter x parameters",
    "workload": "the spec's workload table: [inference] makes an inference plan, else "
                "[training]",
    "context_tokens": "inference.prompt_tokens + inference.generated_tokens",
    "batch_size": "inference.batch_size (sequences per replica)",
    "engine": "inference.engine",
    "method": "finetune.method",
}
"""Plan fields copied from the spec, with the spec key each comes from."""

_SUMS: Mapping[tuple[str, str], tuple[str, tuple[str, ...], str]] = {
    ("StageMemory", "total_bytes"): (
        "weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + "
        "buffers_bytes of this stage's GPUs",
        ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
         "buffers_bytes"), "the sum of the stage's components (llmpar.evaluation.memory)"),
}
"""Fields that are the sum of their record's other fields."""


def explain_field(plan: Plan, text: str, data: Mapping[str, Any] | None = None
                  ) -> Derivation:
    """How the field at `text` (a path in `plan.to_dict()`, which `data` may hold already)
    came about; KeyError when the plan has no such field."""
    path = parse_path(text)
    if path[:1] == ("derivations",) and len(path) >= 3 and isinstance(path[1], int):
        return _part_of_derivation(plan, path)
    data = plan.to_dict() if data is None else data
    value = _value_at(data, path)
    recorded = _recorded(plan, path)
    if recorded is not None:
        return recorded
    record_path, field = path[:-1], path[-1]
    record = _value_at(data, record_path)
    cls = _record_class(plan, record_path)
    if cls is _plan_class() and field not in _plan_fields():
        cls = _part_class(plan)  # a schema-1 flat name reads the plan's part
    quantity = format_path(path)
    shown = _plain(value)
    if path[0] == "warnings":
        return Derivation(quantity=quantity, value=shown, unit="",
                          rule="a warning the evaluation raised about this spec",
                          source="the evaluation's checks (llmpar.evaluation)")
    if isinstance(field, int) or cls is dict:
        return _dict_entry(plan, path, shown)
    name = cls.__name__ if isinstance(cls, type) else "Plan"
    inputs = _neighbours(record, field) if len(record) <= 16 else {}
    if (name, field) in _SUMS:
        rule, parts, source = _SUMS[name, field]
        return Derivation(quantity=quantity, value=shown, unit=_unit(field), rule=rule,
                          source=source, inputs={p: _plain(record.get(p)) for p in parts})
    relation = _relation(plan, path, record)
    if relation is not None:
        rule, source, related = relation
        return Derivation(quantity=quantity, value=shown, unit=_unit(field), rule=rule,
                          source=source, inputs=related)
    doc = field_docs(cls).get(field, "") if isinstance(cls, type) else ""
    placeholder = _placeholder(plan, path) or (path == ("training",) and value is None)
    spelled = _spelling(plan, str(field)) if len(path) == 1 else None
    if spelled is not None and spelled != field:
        doc = field_docs(cls).get(spelled, doc)
    if placeholder:
        rule = (f"no value in {'an' if plan.workload == 'inference' else 'a'} "
                f"{plan.workload} plan: a schema-1 field of the other "
                f"workload, kept so every plan has the same keys")
    elif spelled is not None and spelled != field:
        rule = (f"schema 1's name of the first pool's {spelled}" + (f": {doc}" if doc else "")
                + f" (llmpar explain SPEC serving[0].{spelled})")
    elif value in ([], {}) and not doc:
        rule = f"empty: this plan has no {field}" + (
            f" ({_FALLBACK[field]})" if field in _FALLBACK else "")
    elif field in SPEC_KEYS:
        rule = f"from the spec: {SPEC_KEYS[field]}" + (f". {doc}" if doc else "")
    elif doc:
        rule = doc
    else:
        rule = _FALLBACK.get(field, "")
    if not rule:
        rule = f"{field} of the {name} record"
    return Derivation(quantity=quantity, value=shown, unit=_unit(field), rule=rule,
                      source=f"{cls.__module__}.{name}.{field}" if isinstance(cls, type)
                      else "llmpar.plan.Plan", inputs={} if placeholder else inputs)


def _spelling(plan: Plan, name: str) -> str | None:
    """The part's field a schema-1 flat name reads (`step_seconds` of a serving plan:
    `latency_seconds`); None for a Plan field, or a placeholder of the other workload."""
    from llmpar.plan import _V1

    try:
        return _V1.spelling(type(plan), name, training=plan.training is not None)
    except AttributeError:
        return None


def _placeholder(plan: Plan, path: Path) -> bool:
    """A schema-1 flat field that only the other workload fills."""
    from llmpar.plan import _V1

    if len(path) != 1 or not isinstance(type(plan).__dict__.get(str(path[0])), _V1):
        return False
    return _spelling(plan, str(path[0])) is None


def _part_of_derivation(plan: Plan, path: Path) -> Derivation:
    """A field of a recorded derivation (`derivations[3].rule`, `derivations[3].inputs.N`):
    that derivation. An input's name may hold dots; it is the rest of the path."""
    index = path[1]
    assert isinstance(index, int)
    if index >= len(plan.derivations):
        raise KeyError(format_path(path))
    item = plan.derivations[index]
    field = path[2]
    if field == "inputs" and len(path) == 3:
        value: Any = "{}" if not item.inputs else "a table"
    elif field == "inputs":
        name = ".".join(str(t) for t in path[3:])
        if name not in item.inputs:
            raise KeyError(format_path(path))
        value = item.inputs[name]
    elif len(path) == 3 and field in ("quantity", "value", "unit", "rule", "source"):
        value = getattr(item, str(field))
    else:
        raise KeyError(format_path(path))
    return Derivation(quantity=format_path(path), value=_plain(value), unit="",
                      rule=f"part of the recorded derivation of {item.quantity}: {item.rule}",
                      source=item.source, inputs=dict(item.inputs))


def _recorded(plan: Plan, path: Path) -> Derivation | None:
    """The Derivation the evaluation recorded for the field, if any: flat schema-1 names,
    the training part's and the first serving pool's fields (which the flat names read),
    and the records of the parts (`training.goodput.checkpoint_bytes`)."""
    candidates = []
    rest = path
    if path[:1] == ("training",):
        rest = path[1:]
    elif path[:2] == ("serving", 0):
        rest = path[2:]
    elif path[:1] == ("serving",):
        return None
    if rest and all(isinstance(t, str) for t in rest):
        candidates.append(".".join(str(t) for t in rest))
        if len(path) == 1:
            spelled = _spelling(plan, str(path[0]))
            if spelled is not None:
                candidates.append(spelled)
        if len(rest) == 2 and rest[0] in ("goodput", "finetune"):
            candidates.append(str(rest[1]))
    for quantity in candidates:
        for item in plan.derivations:
            if item.quantity == quantity:
                return item
    return None


_FALLBACK: Mapping[str, str] = {
    "name": "the record's name, as the code that made it calls it",
    "strategy": "the strategy (a [parallel] table's name) the record belongs to",
    "text": "what the strategy says it did (its Transform.notes)",
    "reason": "why the strategy asks for it, in its own words",
    "stage": "the pipeline stage's index, from 0 (the first layers)",
    "layers": "how many transformer layers the record covers (a stage's share of the "
              "model's layers under [parallel.pipeline]; a tensor's layers that keep one)",
    "micro_batches_in_flight": "micro-batches whose activations the stage holds at once "
                               "under the pipeline schedule (1 without a pipeline)",
    "weights_bytes": "the weights on one GPU of the stage, after shards",
    "gradients_bytes": "the gradients on one GPU of the stage, after shards",
    "optimizer_bytes": "the optimizer states (and master weights) on one GPU of the "
                       "stage, after shards",
    "activations_bytes": "the activations one GPU of the stage keeps for backward, over "
                         "its micro-batches in flight",
    "buffers_bytes": "communication and other buffers the strategies ask for "
                     "(Transform buffers) on one GPU of the stage",
    "group_size": "GPUs in the group the collective runs over: the degree of its "
                  "strategy's axis (or the product of the axes it spans)",
    "calls_per_step": "how many times the collective runs in one step, on one GPU",
    "shape": "the tensor's shape on one GPU after splits, in the model's symbols",
    "bytes_per_element": "bytes per element of the tensor's format ([precision])",
    "layer_kind": "the kind of layer that keeps it (\"dense\", \"moe\", ...), or empty "
                  "outside the layers",
    "time_model": "how the times were obtained: \"assumed-mfu\", \"modelled\" (training) "
                  "or \"roofline\" (serving)",
    "flops_method": "how FLOPs were counted: \"exact\" (per operation), \"6nd\" (a model "
                    "given only by its size) or \"roofline-operations\" (serving)",
    "max_batch_size_limited_by": "what stops a larger batch: the memory, or a spec limit",
    "max_context_tokens_limited_by": "what stops a longer context: the memory, or the "
                                     "model's maximum position",
    "max_prompt_tokens_limited_by": "what stops a longer prompt: the memory, or the "
                                    "model's maximum position",
    "optimizer_seconds": "the optimizer step of one step on one GPU (memory-bound: the "
                         "bytes of its states over the HBM bandwidth), or 0 without a "
                         "modelled step time",
    "exposed_offload_seconds": "the part of offload_seconds not hidden behind compute",
    "step_time_trust": "how far to trust step_seconds (llmpar.trust)",
    "mfu": "model FLOPs per second over the dense peak of all the pool's GPUs "
           "(flops_per_step over the step's time; llmpar.inference)",
    "hfu": "executed FLOPs per second over the dense peak of all the pool's GPUs "
           "(llmpar.inference)",
    "flops_per_step_6nd": "6 x N_active x tokens_per_step (Kaplan et al. 2020, "
                          "arXiv:2001.08361, Sec. 2.1), beside the exact count",
    "bubble_seconds": "pipeline idle time of one step on one GPU: the schedule's bubble, "
                      "bubble_fraction of the compute (llmpar.strategies.pipeline)",
    "capacity_bytes": "the GPU's memory ([hardware.gpu] memory_bytes, or its reported "
                      "usable memory) less [hardware] memory_headroom_bytes",
    "stages": "pipeline stages' memory records (a serving plan keeps its memory in its "
              "pools)",
    "activation_tensors": "activation tensors (a serving plan has a workspace instead)",
    "collectives": "collectives (no communication)",
    "notes": "notes from the strategies",
    "phases": "serving phases (a training plan has none)",
    "warnings": "warnings",
    "schema_version": "the version of the plan's field names and meanings "
                      "(llmpar.plan.PLAN_SCHEMA_VERSION)",
}
"""What a field means where its class does not say (a field without a docstring)."""


def _relation(plan: Plan, path: Path, record: Mapping[str, Any]
              ) -> tuple[str, str, dict[str, float | int | str]] | None:
    """Relations between a record's fields that are not formulas of their own."""
    field = path[-1]
    if field == "fits" and len(path) == 1:
        peak = plan.training.memory_peak if plan.training is not None else None
        if peak is not None and plan.schema_version >= 2:
            return ("training.memory_peak.device_bytes <= capacity_bytes (plan schema 2)",
                    "the device memory at the step's peak against the GPU's "
                    "(llmpar.evaluation.peak)",
                    {"device_bytes": peak.device_bytes, "capacity_bytes": plan.capacity_bytes})
        return ("total_bytes <= capacity_bytes", "the plan's memory against the GPU's",
                {"total_bytes": plan.total_bytes, "capacity_bytes": plan.capacity_bytes})
    if field == "parameters" and len(path) == 1:
        return ("the sum of parameters_by_group", "the model's parameter counts "
                "(llmpar.footprint)", {f"parameters_by_group.{k}": v
                                       for k, v in plan.parameters_by_group.items()})
    if field == "peak_stage" and len(path) == 1:
        return ("the stage whose total_bytes is the largest (its memory fields are the "
                "plan's)", "llmpar.evaluation.memory",
                {f"stages[{s.stage}].total_bytes": s.total_bytes for s in plan.stages})
    if field in ("buffers_bytes", "host_bytes") and len(path) == 1:
        return (f"stages[peak_stage].{field}", "the peak stage's record",
                {"peak_stage": plan.peak_stage})
    collectives = record.get("collectives")
    if field in ("communication_seconds", "exposed_communication_seconds") and isinstance(
            collectives, list):
        part = "seconds" if field == "communication_seconds" else "exposed_seconds"
        return (f"the sum of collectives[].{part}" if field == "communication_seconds"
                else f"the exposed part of the step's communication (collectives[].{part}"
                     " on the critical path)",
                "the collectives' costs (llmpar.communication)",
                {f"collectives[{i}].{part}": c[part] for i, c in enumerate(collectives)})
    if path[-2:-1] and isinstance(path[-2], int) and path[-3:-2] == ("collectives",):
        if field == "seconds":
            return ("calls_per_step calls of `operation` on buffer_bytes per GPU over "
                    "group_size GPUs on the `tier` link, by the collective cost model",
                    "llmpar.communication (the collective cost model, with its sources)",
                    _inputs(record, ("operation", "buffer_bytes", "group_size", "tier",
                                     "calls_per_step", "pieces")))
        if field == "exposed_seconds":
            return ("the part of seconds not hidden behind window_seconds of "
                    "`hides_behind` (one piece of pieces never hides)",
                    "llmpar.evaluation.step_time (overlap windows)",
                    _inputs(record, ("seconds", "window_seconds", "hides_behind",
                                     "pieces")))
    if field == "tokens_per_step" and "global_batch_size" in record and "sequence_length" \
            in record:
        return ("global_batch_size x sequence_length", "the batch of one step",
                _inputs(record, ("global_batch_size", "sequence_length")))
    if field == "micro_batches_per_step" and "global_batch_size" in record:
        return ("global_batch_size / (micro_batch_size x data-parallel replicas)",
                "the batch of one step over its replicas",
                {**_inputs(record, ("global_batch_size", "micro_batch_size")),
                 "layout.data": plan.layout.get("data", 1)})
    if field == "global_batch_size" and len(path) <= 2:
        source = ("training.global_batch_size" if plan.workload == "training"
                  else "inference.batch_size x the replicas (layout.data)")
        return (f"from the spec: {source}", "the spec", {})
    return None


def _dict_entry(plan: Plan, path: Path, value: Any) -> Derivation:
    quantity = format_path(path)
    parent, key = path[-2] if len(path) >= 2 else "", path[-1]
    if parent == "layout":
        return Derivation(quantity=quantity, value=value, unit="GPUs",
                          rule=f"the degree of the {key} strategy: parallel.{key}.degree, "
                               "or for data what the other degrees leave of num_gpus",
                          source="the spec's [parallel] tables (llmpar.placement)",
                          inputs={"num_gpus": plan.num_gpus})
    if parent == "parameters_by_group":
        return Derivation(quantity=quantity, value=value, unit="parameters",
                          rule=f"parameters of the model's {key} weights, from its "
                               "architecture ([model] or the preset)",
                          source="llmpar.footprint (parameter counts per group)")
    return Derivation(quantity=quantity, value=value, unit="",
                      rule=f"entry {key!r} of {format_path(path[:-1])}",
                      source="llmpar.plan.Plan")


def _plan_class() -> type:
    from llmpar.plan import Plan

    return Plan


@functools.cache
def _plan_fields() -> frozenset[str]:
    return frozenset(f.name for f in attrs.fields(_plan_class()))


def _part_class(plan: Plan) -> type:
    from llmpar.plan import ServingPool, TrainingPart

    return TrainingPart if plan.workload == "training" else ServingPool


def _record_class(plan: Plan, path: Path) -> Any:
    """The attrs class of the record at `path` of `plan.to_dict()` (dict for a table)."""
    from llmpar.plan import Plan, ServingPool, TrainingPart

    cls: Any = Plan
    for token in path:
        if isinstance(token, int):
            continue
        if cls is Plan and token not in {f.name for f in attrs.fields(Plan)}:
            cls = TrainingPart if plan.workload == "training" else ServingPool
        if not (isinstance(cls, type) and attrs.has(cls)):
            return dict
        hints = _hints(cls)
        if token not in hints:
            return dict
        cls = _record_of(hints[token])
    return cls


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    import llmpar.plan as plan_module

    return typing.get_type_hints(cls, vars(plan_module))


def _record_of(hint: Any) -> Any:
    """The attrs class inside `X | None` or `tuple[X, ...]`, or dict for a table."""
    if isinstance(hint, type) and attrs.has(hint):
        return hint
    origin = typing.get_origin(hint)
    if origin in (dict, Mapping):
        return dict
    for argument in typing.get_args(hint):
        found = _record_of(argument)
        if found is not None and found is not dict:
            return found
    if origin in (tuple, types.UnionType, typing.Union):
        return dict
    return None


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of `cls`, written under its fields (attrs keeps none at
    run time, so they are read from the source), joined into one line each."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found[node.target.id] = " ".join(after.value.value.split())
    return found


def _neighbours(record: Any, field: str | int) -> dict[str, float | int | str]:
    """The record's other plain numbers and names, the inputs a field is read beside."""
    if not isinstance(record, Mapping):
        return {}
    return {k: v for k, v in record.items() if k != field and isinstance(v, (int, float, str))
            and not isinstance(v, bool) and len(str(v)) <= 60}


def _inputs(record: Mapping[str, Any], names: Sequence[str]) -> dict[str, float | int | str]:
    return {n: _plain(record[n]) for n in names if record.get(n) is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


def _unit(field: str | int) -> str:
    name = str(field)
    if name in ("bytes", "seconds", "flops"):
        name = "_" + name
    for suffix, unit in (("_bytes", "bytes"), ("_seconds", "s"), ("_flops", "FLOP")):
        if name.endswith(suffix):
            return unit
    return ""

