"""Structuring a spec table into a `Spec`: presets, sections, every problem at once."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cattrs

from llmpar.errors import Problem, SpecError, did_you_mean, printable
from llmpar.footprint.activations import ACTIVATION_MODELS
from llmpar.hf.importer import model_table_from_hf
from llmpar.loading.converter import structure
from llmpar.loading.framework import (
    FRAMEWORK_PATH,
    activation_model_problems,
    stated_efficiencies,
    with_framework_defaults,
    with_profile_efficiencies,
    without_stated_entries,
)
from llmpar.loading.limits import read_text
from llmpar.loading.presets import PresetCatalog, PresetNotFound, is_preset_name
from llmpar.loading.reader import (
    SpecSource,
    apply_overrides,
    merge,
    parse_toml,
    read_source,
)
from llmpar.placement import ORDER_KEY, RANK_ORDER, parse_order
from llmpar.spec import (
    SCHEMA_VERSION,
    Hardware,
    Inference,
    Model,
    Optimizer,
    Precision,
    Spec,
    Training,
)
from llmpar.spec.finetune import Finetune
from llmpar.spec.search import Search

if TYPE_CHECKING:
    from llmpar.strategy import Strategy
    from llmpar.workload import Workload

SECTIONS = ("version", "model", "hardware", "optimizer", "precision", "training", "inference",
            "parallel", "search", "finetune", "workload")
DEFAULT_OPTIMIZER = "adam"
"""Mixed-precision Adam, the founding document's optimizer, when a spec names none."""


def resolve_preset(
    value: Any, kind: str, path: str, catalog: PresetCatalog, problems: list[Problem],
    label: str | None = None,
) -> dict[str, Any] | None:
    """A preset name or a table (optionally `preset = "..."` or `file = "x.toml"`, plus
    overrides) as a table. A file is read relative to the folder of the spec `label`."""
    if isinstance(value, str):
        return _read_preset(kind, value, path, catalog, problems)
    if not isinstance(value, Mapping):
        problems.append(Problem(path, f"expected a preset name or a table, got {value!r}"))
        return None
    table = dict(value)
    if "preset" in table and "file" in table:
        problems.append(Problem(path, "give `preset` (a name) or `file` (a TOML file), "
                                      "not both"))
        return None
    if "file" in table:
        base = _read_file(table.pop("file"), f"{path}.file", label, problems)
    elif "preset" in table:
        name = table.pop("preset")
        if not isinstance(name, str):
            problems.append(Problem(f"{path}.preset", f"expected a preset name, got {name!r}"))
            return None
        base = _read_preset(kind, name, f"{path}.preset", catalog, problems)
    else:
        return table
    if base is None:
        return None
    if kind == "gpus" and "memory_bytes" in table and "usable_memory_bytes" not in table:
        # The reported total belongs to the preset's memory, not to the one given here.
        base = {k: v for k, v in base.items() if not k.startswith("usable_memory")}
    return merge(base, table)


def _read_preset(
    kind: str, name: str, path: str, catalog: PresetCatalog, problems: list[Problem]
) -> dict[str, Any] | None:
    if not is_preset_name(name) or name.endswith(".toml"):
        problems.append(Problem(path, _not_a_name(kind, name)))
        return None
    try:
        return catalog.read(kind, name)
    except PresetNotFound as missing:
        problems.append(Problem(path, missing.message()))
    except SpecError as error:
        problems += [Problem(path, f"preset {name!r} cannot be read: {problem}")
                     for problem in error.problems]
    return None


def _not_a_name(kind: str, name: str) -> str:
    """Why `name` is not a preset name; the value is not echoed, as it may be a path."""
    message = (f"a {kind[:-1]} preset is named by a file stem of letters, digits, '.', '_', "
               "'+' and '-' (`llmpar presets` lists them), not a path")
    if name.endswith(".toml"):
        message += "; to read a TOML file, write { file = \"...\" } (relative to the spec)"
    return message


def _read_file(name: Any, path: str, label: str | None,
               problems: list[Problem]) -> dict[str, Any] | None:
    """`file = "x.toml"`: a TOML table from a file beside the spec (or the working
    folder when the spec is not a file)."""
    if not isinstance(name, str) or not name.endswith(".toml"):
        problems.append(Problem(path, f"expected the path of a .toml file, got {name!r}"))
        return None
    folder = Path(label).parent if label is not None else Path.cwd()
    where = str(folder / name)
    try:
        return parse_toml(read_text(folder / name, where), where)
    except SpecError as error:
        problems += [Problem(path, f"{printable(where)}: {problem}")
                     for problem in error.problems]
        return None


def _with_cluster(table: dict[str, Any], catalog: PresetCatalog,
                  problems: list[Problem]) -> dict[str, Any] | None:
    """`[hardware] cluster = "dgx-h100"` fills the hardware table; its own keys win."""
    name = table.get("cluster")
    if name is None:
        return table
    if not isinstance(name, str):
        problems.append(Problem("$.hardware.cluster", f"expected a preset name, got {name!r}"))
        return None
    preset = _read_preset("clusters", name, "$.hardware.cluster", catalog, problems)
    if preset is None:
        return None
    preset.pop("name", None)
    gpu, given = preset.get("gpu"), table.get("gpu")
    if isinstance(gpu, str) and isinstance(given, Mapping) and not (
            {"preset", "file"} & set(given)):
        # `--set hardware.gpu.matmul_efficiency=0.6` on a cluster spec changes a field of
        # the cluster's GPU, not a GPU of that one field.
        table = {**table, "gpu": {"preset": gpu, **given}}
    return merge(preset, table)


def _structure_hardware(raw: dict[str, Any], catalog: PresetCatalog,
                        converter: cattrs.Converter, problems: list[Problem],
                        label: str | None) -> Hardware | None:
    """`[hardware]` with its cluster and GPU presets, structured; None on a problem."""
    table = _with_cluster(_section(raw, "hardware", problems), catalog, problems)
    if not isinstance(raw["hardware"], Mapping) or table is None:
        return None
    if "gpu" not in table:
        problems.append(Problem("$.hardware.gpu", "required: a GPU preset name or table"))
        return None
    gpu = resolve_preset(table["gpu"], "gpus", "$.hardware.gpu", catalog, problems, label)
    if gpu is None:
        return None
    hardware, found = structure(converter, {**table, "gpu": gpu}, Hardware, "$.hardware")
    problems += found
    return None if found else hardware


def without_cluster_fields(raw: dict[str, Any], cluster: Any, catalog: PresetCatalog,
                           converter: cattrs.Converter, label: str | None = None
                           ) -> dict[str, Any]:
    """`raw` before its `[hardware] cluster` is set to `cluster`: the `[hardware]` keys (and
    `[hardware.gpu]` keys) that hold what the old cluster preset and its GPU give are left
    out, so that the new cluster's numbers come in and only the spec's own keys stay on top
    of them. A fully resolved spec (`llmpar.dump_spec`) spells out every preset field; a
    new cluster name would otherwise keep the old GPU's numbers."""
    given = raw.get("hardware")
    old = given.get("cluster") if isinstance(given, Mapping) else None
    if not isinstance(given, Mapping) or not isinstance(old, str) or old == cluster:
        return raw
    problems: list[Problem] = []
    base_table = {"cluster": old, **({"num_gpus": given["num_gpus"]}
                                     if "num_gpus" in given else {"num_gpus": 1})}
    stated = _structure_hardware(raw, catalog, converter, problems, label)
    base = _structure_hardware({"hardware": base_table}, catalog, converter, problems, label)
    if stated is None or base is None or problems:
        return raw  # the load reports what is wrong
    ours, theirs = converter.unstructure(stated), converter.unstructure(base)
    hardware = {key: value for key, value in given.items()
                if key in ("cluster", "num_gpus", "gpu") or ours.get(key) != theirs.get(key)}
    gpu = given.get("gpu")
    if isinstance(gpu, Mapping) and ours["gpu"]["name"] == theirs["gpu"]["name"]:
        kept = {key: value for key, value in gpu.items() if key != "name"
                and ours["gpu"].get(key) != theirs["gpu"].get(key)}
        hardware["gpu"] = kept  # the spec's own changes, on the new cluster's GPU
        if not kept:
            del hardware["gpu"]
    elif (isinstance(gpu, Mapping) and not {"preset", "file"} & set(gpu)
          and ours["gpu"]["name"] in catalog.names("gpus")):
        # a GPU of its own, on its own preset (not the new cluster's GPU)
        hardware["gpu"] = {"preset": ours["gpu"]["name"], **gpu}
    elif gpu == theirs["gpu"]["name"]:
        del hardware["gpu"]
    return {**raw, "hardware": hardware}


def _with_hf_config(table: dict[str, Any], label: str | None,
                    problems: list[Problem]) -> dict[str, Any] | None:
    """`[model] hf_config = "config.json"` (relative to the spec's folder) fills the model
    table through `llmpar.model_from_hf`'s reader; the table's own keys win."""
    if "hf_config" not in table:
        return table
    name = table.pop("hf_config")
    if not isinstance(name, str):
        problems.append(Problem("$.model.hf_config",
                                f"expected the path of a config.json, got {name!r}"))
        return None
    folder = Path(label).parent if label is not None else Path.cwd()
    try:
        base = model_table_from_hf(folder / name)
    except SpecError as error:
        problems += [Problem("$.model.hf_config", f"{error.source or name}: {problem}")
                     for problem in error.problems]
        return None
    return merge(base, table)


def _with_framework(table: dict[str, Any], catalog: PresetCatalog, problems: list[Problem],
                    label: str | None) -> dict[str, Any]:
    """`[training] framework = "torchtitan"` (or a table) as the profile's table."""
    if "framework" not in table:
        return table
    profile = resolve_preset(table["framework"], "frameworks", FRAMEWORK_PATH, catalog,
                             problems, label)
    if profile is None:  # reported; the rest of [training] is still checked
        return {k: v for k, v in table.items() if k != "framework"}
    return {**table, "framework": profile}


def _section(raw: dict[str, Any], key: str, problems: list[Problem]) -> dict[str, Any]:
    value = raw.get(key, {})
    if isinstance(value, Mapping):
        return dict(value)
    problems.append(Problem(f"$.{key}", f"expected a table, got {value!r}"))
    return {}


def _structure_parallel(
    raw: Any,
    strategies: Mapping[str, Strategy[Any]],
    converter: cattrs.Converter,
    problems: list[Problem],
) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        problems.append(Problem("$.parallel", f"expected a table of strategies, got {raw!r}"))
        return {}
    configs: dict[str, Any] = {}
    for name, table in raw.items():
        if name == ORDER_KEY:
            continue  # not a strategy: `_structure_order`
        strategy = strategies.get(name)
        if strategy is None:
            known = ", ".join(sorted(strategies))
            hint = did_you_mean(name, strategies)
            problems.append(
                Problem(f"$.parallel.{name}", f"unknown strategy{hint}; known: {known}")
            )
            continue
        config, found = structure(converter, table, strategy.config_type, f"$.parallel.{name}")
        problems += found
        if config is not None:
            configs[name] = config
    for name, strategy in strategies.items():
        if strategy.always_active and name not in raw:
            configs[name] = strategy.config_type()
    return configs


def _structure_order(raw: Any, strategies: Mapping[str, Strategy[Any]],
                     problems: list[Problem]) -> tuple[str, ...]:
    """`[parallel] order`: the rank order string, innermost first, in the tokens the
    strategies' axes declare."""
    if not isinstance(raw, Mapping) or ORDER_KEY not in raw:
        return RANK_ORDER
    axes = {name: s.axis for name, s in strategies.items() if s.axis is not None}
    order, found = parse_order(raw[ORDER_KEY], axes, f"$.parallel.{ORDER_KEY}")
    problems += found
    return order


def _structure_inference(raw: dict[str, Any], converter: cattrs.Converter,
                          problems: list[Problem], catalog: PresetCatalog,
                          label: str | None) -> tuple[Inference | None, list[Problem]]:
    """`[inference]`, a serving workload in place of `[training]` (never beside it)."""
    if "inference" not in raw:
        return None, []
    if "training" in raw:
        return None, [Problem("$.inference", "a spec is either [training] or [inference]; "
                              "this one has both")]
    table = _section(raw, "inference", problems)
    if table.get("batch_size", 1) != 1 and ({"concurrency", "request_rate_per_s"} & set(table)):
        return None, [Problem("$.inference.batch_size", "batch_size is the static batch; "
                              "under continuous batching (concurrency or request_rate_per_s) "
                              "the batch follows from the workload: leave batch_size out")]
    if "engine" in table:  # a preset name under specs/engines/, or a table
        found: list[Problem] = []
        engine = resolve_preset(table["engine"], "engines", "$.inference.engine", catalog,
                                found, label)
        if engine is None:
            return None, found
        table["engine"] = engine
    return structure(converter, table, Inference, "$.inference")


def _structure_search(raw: dict[str, Any], converter: cattrs.Converter,
                      problems: list[Problem]) -> tuple[Search | None, list[Problem]]:
    """`[search]`, read only by `llmpar search`."""
    if "search" not in raw:
        return None, []
    return structure(converter, _section(raw, "search", problems), Search, "$.search")


def _structure_finetune(raw: dict[str, Any], converter: cattrs.Converter,
                        problems: list[Problem]) -> tuple[Finetune | None, list[Problem]]:
    """`[finetune]`, which parameters a training run updates (never with `[inference]`)."""
    if "finetune" not in raw:
        return None, []
    if "inference" in raw:
        return None, [Problem("$.finetune", "[finetune] belongs to a training spec; this one "
                              "has [inference]")]
    return structure(converter, _section(raw, "finetune", problems), Finetune, "$.finetune")


def _structure_workload(raw: dict[str, Any], workloads: Mapping[str, Workload[Any]],
                        converter: cattrs.Converter,
                        problems: list[Problem]) -> dict[str, Any]:
    """`[workload.<name>]` tables, each in its workload's schema (training specs only)."""
    from llmpar.workload import WorkloadTable

    if "workload" not in raw:
        return {}
    if "inference" in raw:
        problems.append(Problem("$.workload", "[workload] belongs to a training spec; this "
                                              "one has [inference]"))
        return {}
    tables = raw["workload"]
    if not isinstance(tables, Mapping):
        problems.append(Problem("$.workload", f"expected a table of workloads, got {tables!r}"))
        return {}
    found: dict[str, Any] = {}
    for name, table in tables.items():
        workload = workloads.get(name)
        if workload is None:
            known = ", ".join(sorted(workloads)) or "none (no plugin registered one)"
            problems.append(Problem(f"$.workload.{name}", "unknown workload"
                                    f"{did_you_mean(name, workloads)}; known: {known}"))
            continue
        config, errors = structure(converter, table, workload.config_type, f"$.workload.{name}")
        problems += errors
        if config is not None:
            found[name] = WorkloadTable(name=name, config=config, workload=workload)
    return found


def structure_spec(
    raw: dict[str, Any],
    catalog: PresetCatalog,
    strategies: Mapping[str, Strategy[Any]],
    converter: cattrs.Converter,
    label: str | None,
    activation_models: Collection[str] | None = None,
    workloads: Mapping[str, Workload[Any]] | None = None,
) -> tuple[Spec | None, list[Problem]]:
    """Build a Spec from a table; on failure None and every problem found.
    `activation_models` are the names `[training] activation_model` may take (default
    llmpar's own); `workloads` the workloads whose `[workload.<name>]` tables it reads."""
    problems: list[Problem] = []
    for key in raw:
        if key not in SECTIONS:
            problems.append(Problem(f"$.{key}", f"unknown table{did_you_mean(key, SECTIONS)}"))
    version = raw.get("version", SCHEMA_VERSION)
    if isinstance(version, bool) or version != SCHEMA_VERSION:  # True == 1 in Python
        problems.append(Problem("$.version", f"expected {SCHEMA_VERSION}, got {version!r}"))

    model: Any = None  # structure() returns Any
    if "model" not in raw:
        problems.append(Problem("$.model", "required: a preset name or a model table"))
    else:
        given = raw["model"]
        if isinstance(given, Mapping) and "hf_config" in given and (
                "preset" in given or "file" in given):
            # The preset's keys would win over the config's: the config would be ignored.
            base = "preset" if "preset" in given else "file"
            problems.append(Problem("$.model.hf_config", f"give a {base} or hf_config, not both "
                                    f"(model.{base} fills the same keys)"))
        table = resolve_preset(given, "models", "$.model", catalog, problems, label)
        if table is not None:
            table = _with_hf_config(table, label, problems)
        if table is not None:
            model, found = structure(converter, table, Model, "$.model")
            problems += found

    hardware: Any = None  # structure() returns Any
    if "hardware" not in raw:
        problems.append(Problem("$.hardware", "required: a table with at least gpu"))
    else:
        hardware = _structure_hardware(raw, catalog, converter, problems, label)

    optimizer: Any = None  # structure() returns Any
    table = resolve_preset(raw.get("optimizer", DEFAULT_OPTIMIZER), "optimizers",
                           "$.optimizer", catalog, problems, label)
    if table is not None:
        optimizer, found = structure(converter, table, Optimizer, "$.optimizer")
        problems += found

    precision, found = structure(converter, _section(raw, "precision", problems), Precision,
                                 "$.precision")
    problems += found
    training_table = _with_framework(_section(raw, "training", problems), catalog, problems,
                                     label)
    training, found = structure(converter, training_table, Training, "$.training")
    problems += (found + _activation_model_problems(training_table, activation_models)
                 + activation_model_problems(training_table, activation_models))
    inference, found = _structure_inference(raw, converter, problems, catalog, label)
    problems += found
    parallel = _structure_parallel(raw.get("parallel", {}), strategies, converter, problems)
    if training is not None:
        parallel = with_framework_defaults(training.framework, raw.get("parallel", {}),
                                           parallel)
    rank_order = _structure_order(raw.get("parallel", {}), strategies, problems)
    search, found = _structure_search(raw, converter, problems)
    problems += found
    finetune, found = _structure_finetune(raw, converter, problems)
    problems += found
    workload = _structure_workload(raw, workloads or {}, converter, problems)

    if problems:
        return None, problems
    training = without_stated_entries(training, hardware.gpu.name,
                                      stated_efficiencies(raw.get("hardware")))
    spec = Spec(model=model, hardware=hardware, optimizer=optimizer, precision=precision,
                training=training, inference=inference, parallel=parallel,
                rank_order=rank_order, search=search, finetune=finetune, workload=workload,
                source=label)
    return with_profile_efficiencies(spec), []


def _activation_model_problems(table: Mapping[str, Any],
                               names: Collection[str] | None) -> list[Problem]:
    """`[training] activation_model` must name a model the session has."""
    name = table.get("activation_model")
    known = ACTIVATION_MODELS if names is None else names
    if not isinstance(name, str) or name in known:
        return []
    listed = ", ".join(repr(n) for n in known)
    return [Problem("$.training.activation_model",
                    f"must be one of {listed}, got {name!r}{did_you_mean(name, known)}")]


def load(
    source: SpecSource,
    catalog: PresetCatalog,
    strategies: Mapping[str, Strategy[Any]],
    converter: cattrs.Converter,
    overrides: Mapping[str, Any] | None = None,
    activation_models: Collection[str] | None = None,
    workloads: Mapping[str, Workload[Any]] | None = None,
) -> Spec:
    """Read `source`, set `overrides` (dotted keys), structure; raise SpecError
    naming every problem."""
    raw, label = read_source(source)
    if overrides and "hardware.cluster" in overrides:
        raw = without_cluster_fields(raw, overrides["hardware.cluster"], catalog, converter,
                                     label)
    raw = apply_overrides(raw, overrides or {})
    spec, problems = structure_spec(raw, catalog, strategies, converter, label,
                                    activation_models, workloads)
    if spec is None:
        raise SpecError(problems, label)
    return spec
