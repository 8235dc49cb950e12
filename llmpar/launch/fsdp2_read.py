"""The PyTorch FSDP2 snippet read back into spec settings (`llmpar import --from
pytorch-fsdp2`).

The snippet is Python, read with `ast` and never run: the calls llmpar writes
(`init_device_mesh`, `MixedPrecisionPolicy`, `fully_shard`, `DistributedDataParallel`,
`apply_activation_checkpointing`, `set_requires_gradient_sync`) and the three batch
constants. A script of one's own that makes the same calls reads the same way; an argument
that is not a literal (a variable, an expression) is a Problem naming the call.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from llmpar.errors import Problem, SpecError
from llmpar.launch.target import ReadSettings
from llmpar.spec import Spec

MICRO_BATCH = "MICRO_BATCH_SIZE"
SEQUENCE = "SEQUENCE_LENGTH"
ACCUMULATION = "GRADIENT_ACCUMULATION_STEPS"
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
SHARDED = ("parallel.data.degree", "parallel.data.shard_degree",
           "parallel.data.reshard_after_forward", "parallel.data.gradient_sync",
           "parallel.data.reduce_dtype", "training.recompute")
"""What an FSDP2 snippet decides: left out, the framework's default holds."""
REPLICATED = ("parallel.data.degree", "training.recompute")
"""What a DDP snippet decides (its gradient format is DDP's own, not written)."""


def read_snippet(text: str, source: str, base: Spec | None = None) -> ReadSettings:
    """Spec settings from an FSDP2 (or DDP) setup snippet: the data-parallel mesh and
    sharding, the compute and reduction formats, full recomputation and the batch."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise SpecError([Problem("$", f"not Python: {exc.msg} (line {exc.lineno})")],
                        source) from None
    except (ValueError, RecursionError) as exc:  # null bytes (Python 3.11), deep nesting
        raise SpecError([Problem("$", f"not Python: {exc}")], source) from None
    problems: list[Problem] = []
    calls = _calls(tree)
    settings = _sharding(calls, base, problems)
    settings.update(_formats(calls, problems))
    settings.update(_batch(_constants(tree), settings.get("parallel.data.degree"), problems))
    if "apply_activation_checkpointing" in calls:
        settings["training.recompute"] = "full"
    if problems:
        raise SpecError(problems, source)
    return ReadSettings(settings=settings,
                        owned=SHARDED if "fully_shard" in calls else REPLICATED)


def _calls(tree: ast.AST) -> dict[str, list[ast.Call]]:
    """The snippet's calls by the name called (`fully_shard`, `x.set_requires_...`)."""
    found: dict[str, list[ast.Call]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            found.setdefault(name, []).append(node)
    return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _sharding(calls: dict[str, list[ast.Call]], base: Spec | None,
              problems: list[Problem]) -> dict[str, Any]:
    """The mesh's data degree (replicate x shard under HSDP) and ZeRO-3 or DDP."""
    settings: dict[str, Any] = {}
    if "fully_shard" in calls:
        base_data = base.parallel.get("data") if base is not None else None
        if base_data is None or base_data.stage != 3:
            settings["parallel.data.fsdp"] = True
        settings.update(_mesh(calls, problems))
        reshard = _reshard(calls["fully_shard"], problems)
        if reshard is not None:
            settings["parallel.data.reshard_after_forward"] = reshard
        if "set_requires_gradient_sync" in calls:
            settings["parallel.data.gradient_sync"] = "last-micro-batch"
    elif "DistributedDataParallel" in calls:
        settings["parallel.data.zero"], settings["parallel.data.fsdp"] = 0, False
    else:
        problems.append(Problem("$", "no fully_shard(...) or DistributedDataParallel(...) "
                                     "call: not an FSDP2 or DDP setup"))
    return settings


def _reshard(calls: list[ast.Call], problems: list[Problem]) -> bool | None:
    """`reshard_after_forward`, the same on every `fully_shard` that states it."""
    path = "$.fully_shard.reshard_after_forward"
    stated = [value for value in (_keyword(call, "reshard_after_forward") for call in calls)
              if value is not None]
    values = {_literal(value, path, problems) for value in stated}
    if len(values) > 1 or values - {True, False}:
        problems.append(Problem(path, "expected the same True or False on every "
                                      f"fully_shard, got {', '.join(map(ast.unparse, stated))}"))
        return None
    return values.pop() if values else None


def _mesh(calls: dict[str, list[ast.Call]], problems: list[Problem]) -> dict[str, Any]:
    """`init_device_mesh("cuda", (d,))`, or `(replicas, shard)` with HSDP's names."""
    meshes = calls.get("init_device_mesh", [])
    if len(meshes) != 1 or len(meshes[0].args) < 2:
        problems.append(Problem("$.init_device_mesh", "expected one init_device_mesh("
                                "'cuda', (sizes...)) call"))
        return {}
    shape = _literal(meshes[0].args[1], "$.init_device_mesh", problems)
    if shape is None:  # not a literal: named already
        return {}
    if not (isinstance(shape, tuple) and shape and len(shape) <= 2
            and all(isinstance(n, int) and n >= 1 for n in shape)):
        problems.append(Problem("$.init_device_mesh", "expected a mesh shape of one or two "
                                f"positive integers, got {shape!r}"))
        return {}
    settings: dict[str, Any] = {"parallel.data.degree": math.prod(shape)}
    if len(shape) == 2:
        settings["parallel.data.shard_degree"] = shape[1]
    return settings


def _formats(calls: dict[str, list[ast.Call]], problems: list[Problem]) -> dict[str, Any]:
    """`MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)`: the compute format and
    the gradients' reduction format (None: the gradients' own)."""
    settings: dict[str, Any] = {}
    for call in calls.get("MixedPrecisionPolicy", [])[:1]:
        for key, setting in (("param_dtype", "precision.compute"),
                             ("reduce_dtype", "parallel.data.reduce_dtype")):
            value = _keyword(call, key)
            if value is None:
                continue
            if isinstance(value, ast.Constant) and value.value is None:
                if key == "reduce_dtype":
                    settings[setting] = "gradients"
                continue
            name = value.attr if isinstance(value, ast.Attribute) else None
            if name not in DTYPES:
                problems.append(Problem(f"$.MixedPrecisionPolicy.{key}", "expected one of "
                                        f"{', '.join('torch.' + d for d in DTYPES)} or None, "
                                        f"got {ast.unparse(value)}"))
                continue
            settings[setting] = DTYPES[name]
    return settings


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """The module's top-level `NAME = value` assignments."""
    return {node.targets[0].id: node.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)}


def _batch(constants: dict[str, ast.expr], data_degree: int | None,
           problems: list[Problem]) -> dict[str, Any]:
    """The micro-batch, the sequence length and, with the mesh's data degree, the
    global batch: micro-batch x accumulation steps x data ranks."""
    values: dict[str, int] = {}
    for name in (MICRO_BATCH, SEQUENCE, ACCUMULATION):
        if name not in constants:
            continue
        value = _literal(constants[name], f"$.{name}", problems)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(f"$.{name}", f"expected an integer >= 1, got {value!r}"))
        else:
            values[name] = value
    settings: dict[str, Any] = {}
    if MICRO_BATCH in values:
        settings["training.micro_batch_size"] = values[MICRO_BATCH]
    if SEQUENCE in values:
        settings["training.sequence_length"] = values[SEQUENCE]
    if MICRO_BATCH in values and ACCUMULATION in values and data_degree is not None:
        settings["training.global_batch_size"] = (values[MICRO_BATCH] * values[ACCUMULATION]
                                                  * data_degree)
    return settings


def _literal(node: ast.expr | None, path: str, problems: list[Problem]) -> Any:
    """A literal's value; a Problem at `path` for anything else."""
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        problems.append(Problem(path, f"expected a literal value, got "
                                      f"{ast.unparse(node) if node is not None else None}"))
        return None
