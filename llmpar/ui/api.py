"""The page's JSON API as pure functions of a session and a request body: no HTTP here
(`llmpar.ui.server` carries them). Every number comes from `Session.evaluate`, the
session's memory timeline or `llmpar.search`; a spec that does not load answers with its
`SpecError` problems, each with its key path.

The page reads no file: a spec arrives as TOML text, presets are read from the session's
catalog by name, and `{ file = "..." }` tables and `[model] hf_config` (which read files
beside a spec) are refused with a problem at their key path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.loading.dump import toml_text
from llmpar.loading.presets import PRESET_KINDS, PresetNotFound, is_preset_name
from llmpar.loading.reader import apply_overrides, parse_toml
from llmpar.report.fields import format_gb_gib
from llmpar.session import Session
from llmpar.spec.search import OBJECTIVES
from llmpar.spec.workload import RECOMPUTE
from llmpar.ui.view import plan_view
from llmpar.units import format_duration

PAGE_LABEL = "<page>"
"""The spec's name in problems: the page's editor."""
FILE_KEYS = ("file", "hf_config")
"""Keys whose value is a path the loader would read: the page refuses them."""
MAX_TOP = 50
"""The most layouts a search from the page lists."""
DEFAULT_TOP = 10


@attrs.frozen(kw_only=True)
class Field:
    """A form field of the page: one dotted spec key."""

    key: str
    label: str
    kind: str
    """"int", "float", a preset kind ("models", "gpus", ...) or "choice"."""
    workload: str = "both"
    """"training", "inference" or "both": which specs show it."""
    choices: tuple[str, ...] = ()


FIELDS = (
    Field(key="model", label="model", kind="models"),
    Field(key="hardware.cluster", label="cluster", kind="clusters"),
    Field(key="hardware.gpu", label="GPU", kind="gpus"),
    Field(key="hardware.num_gpus", label="GPUs", kind="int"),
    Field(key="optimizer", label="optimizer", kind="optimizers", workload="training"),
    Field(key="training.sequence_length", label="sequence length", kind="int",
          workload="training"),
    Field(key="training.micro_batch_size", label="micro-batch", kind="int",
          workload="training"),
    Field(key="training.global_batch_size", label="global batch", kind="int",
          workload="training"),
    Field(key="training.recompute", label="recompute", kind="choice", workload="training",
          choices=RECOMPUTE),
    Field(key="training.tokens", label="run tokens", kind="float", workload="training"),
    Field(key="inference.batch_size", label="batch", kind="int", workload="inference"),
    Field(key="inference.prompt_tokens", label="prompt tokens", kind="int",
          workload="inference"),
    Field(key="inference.generated_tokens", label="generated tokens", kind="int",
          workload="inference"),
    Field(key="parallel.tensor.degree", label="TP", kind="int"),
    Field(key="parallel.pipeline.degree", label="PP", kind="int"),
    Field(key="parallel.context.degree", label="CP", kind="int", workload="training"),
    Field(key="parallel.expert.degree", label="EP", kind="int"),
    Field(key="parallel.data.degree", label="DP", kind="int"),
    Field(key="parallel.data.zero", label="ZeRO", kind="int", workload="training",
          choices=("0", "1", "2", "3")),
)
"""The common choices, as form fields; the TOML editor holds every other key."""


def field_help(session: Session, key: str) -> str:
    """The docstring of the spec field behind a form field (the spec reference's text)."""
    from llmpar.plan_explain import field_docs
    from llmpar.spec import Hardware, Inference, Spec, Training

    *parents, name = key.split(".")
    tables: dict[str, type] = {"": Spec, "hardware": Hardware, "training": Training,
                               "inference": Inference}
    if parents[:1] == ["parallel"] and len(parents) == 2:
        strategy = session.strategies.get(parents[1])
        owner = getattr(strategy, "config_type", None)
    else:
        owner = tables.get(".".join(parents))
    return field_docs(owner).get(name, "") if isinstance(owner, type) else ""


def presets(session: Session) -> dict[str, Any]:
    """Preset names by kind, the form's fields (with their spec fields' docstrings) and
    the search objectives."""
    return {"presets": {kind: session.presets.names(kind) for kind in PRESET_KINDS},
            "fields": [{**attrs.asdict(f), "help": field_help(session, f.key)}
                       for f in FIELDS], "objectives": list(OBJECTIVES)}


def example(session: Session, name: object) -> dict[str, Any]:
    """A shipped example's TOML, by name."""
    if not isinstance(name, str) or not is_preset_name(name):
        return _refused("$", "expected the name of a shipped example (llmpar presets "
                             "examples)")
    try:
        path = session.presets.path("examples", name)
    except PresetNotFound as error:
        return _refused("$", error.message())
    return {"ok": True, "toml": path.read_text(encoding="utf-8")}


def _refused(path: str, message: str) -> dict[str, Any]:
    return {"ok": False, "problems": [{"path": path, "message": message}]}


def _problems(error: SpecError) -> dict[str, Any]:
    return {"ok": False, "source": error.source,
            "problems": [{"path": p.path, "message": p.message} for p in error.problems]}


def _file_references(value: Any, path: str = "$") -> Iterator[Problem]:
    """A problem at every key, at any depth (arrays of tables too), that names a file."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _file_references(item, f"{path}[{index}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}"
            if key in FILE_KEYS:
                yield Problem(where, "the page reads no files: inline the table (llmpar "
                                     "presets show NAME prints a preset), or run llmpar on "
                                     "the file")
            else:
                yield from _file_references(item, where)


def _without(table: dict[str, Any], dotted: str) -> dict[str, Any]:
    """`table` less the dotted key (a key not there is no change)."""
    *parents, last = dotted.split(".")
    node: Any = table
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)
    return table


def field_values(table: Mapping[str, Any]) -> dict[str, Any]:
    """Each form field's value in the spec's table (None: not given; a preset's name
    when the table names one, `{preset = "x"}` included)."""
    found: dict[str, Any] = {}
    for field in FIELDS:
        node: Any = table
        for key in field.key.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            node = node.get("preset")
        found[field.key] = node if isinstance(node, (str, int, float)) else None
    return found


def edited(text: object, changes: object) -> tuple[dict[str, Any], str]:
    """The spec's table and its TOML text after the form's changes: a value sets its
    key, None removes it; without changes the text stays as typed (comments kept)."""
    if not isinstance(text, str):
        raise SpecError([Problem("$", "expected the spec as TOML text")], PAGE_LABEL)
    table = parse_toml(text, PAGE_LABEL)
    if not changes:
        return table, text
    if not isinstance(changes, Mapping) or not all(isinstance(k, str) for k in changes):
        raise SpecError([Problem("$", "expected changes as {dotted key: value}")], PAGE_LABEL)
    known = {f.key for f in FIELDS}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise SpecError([Problem(f"$.{k}", "not a field of the form") for k in unknown],
                        PAGE_LABEL)
    for key, value in changes.items():
        table = _without(table, key) if value is None else apply_overrides(table, {key: value})
    return table, toml_text(table)


def evaluate(session: Session, body: Mapping[str, Any]) -> dict[str, Any]:
    """{"toml", "changes"?} -> the spec's text and fields, and its plan and view, or
    the problems that stop it (with the text and fields, so the page keeps them)."""
    try:
        table, text = edited(body.get("toml"), body.get("changes"))
    except SpecError as error:
        return _problems(error)
    answer: dict[str, Any] = {"toml": text, "fields": field_values(table),
                              "workload": "inference" if "inference" in table else "training"}
    try:
        refused = list(_file_references(table))
        if refused:
            raise SpecError(refused, PAGE_LABEL)
        spec = session.load_spec(table)
        plan = session.evaluate(spec)
        timeline = session.memory_timeline(spec)
    except SpecError as error:
        return {**_problems(error), **answer}
    return {**answer, "ok": True, "plan": plan.to_dict(),
            "view": plan_view(plan, spec, timeline, session.report_sections(plan))}


Progress = Callable[[str, int, int], None]


def search(session: Session, body: Mapping[str, Any],
           progress: Progress | None = None) -> dict[str, Any]:
    """{"toml", "objective"?, "top"?} -> the ranked layouts, each with its spec's TOML
    (and, for training, the Pareto front of memory against step time)."""
    objective, top = body.get("objective"), body.get("top", DEFAULT_TOP)
    if objective is not None and objective not in OBJECTIVES:
        return _refused("$.search.objective", f"must be one of {', '.join(OBJECTIVES)}")
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= MAX_TOP:
        return _refused("$.search.top", f"expected a whole number from 1 to {MAX_TOP}")
    try:
        table, _text = edited(body.get("toml"), None)
        refused = list(_file_references(table))
        if refused:
            raise SpecError(refused, PAGE_LABEL)
        if "inference" in table:
            return _serving_search(session, table, objective, top)
        from llmpar.search import search as search_layouts

        result = search_layouts(table, objective=objective, top=top, session=session,
                                progress=progress)
    except SpecError as error:
        return _problems(error)
    rows = [{"rank": r.rank, "layout": dict(r.layout), "choices": dict(r.choices),
             "choices_text": _choices_text(r.choices),
             "objective": r.objective, "total_bytes": r.plan.total_bytes,
             "step_seconds": r.plan.step_seconds, "toml": r.to_toml(),
             **_texts(r.objective, r.plan.total_bytes, r.plan.step_seconds)}
            for r in result.results]
    import llmpar

    front = [{"layout": dict(p.layout), "total_bytes": p.total_bytes,
              "step_seconds": p.step_seconds, "toml": llmpar.dump_spec(p.spec),
              **_texts(None, p.total_bytes, p.step_seconds)}
             for p in result.pareto]
    return {"ok": True, "workload": "training", "objective": result.objective,
            "considered": result.considered, "ranked": result.ranked,
            "rejected": dict(result.rejected), "seconds": result.seconds,
            "warnings": list(result.warnings), "results": rows, "pareto": front}


def _texts(objective: float | None, total_bytes: int,
           seconds: float | None) -> dict[str, str]:
    """A search row's numbers as the page writes them."""
    return {"objective_text": "-" if objective is None else f"{objective:.4g}",
            "memory_text": format_gb_gib(total_bytes),
            "seconds_text": "-" if seconds is None else format_duration(seconds)}


def _choices_text(choices: Mapping[str, Any]) -> str:
    """A layout's choices beside its degrees (which the layout shows): `zero 1, ...`."""
    return ", ".join(f"{key.removeprefix('training.')} {value}"
                     for key, value in choices.items()
                     if not key.endswith(".degree") and value is not None)


def _serving_search(session: Session, table: dict[str, Any], objective: str | None,
                    top: int) -> dict[str, Any]:
    from llmpar.search.serving import search_serving

    result = search_serving(session, session.load_spec(table), objective=objective, top=top)
    rows = [{"rank": i, **c.to_dict(), "objective": c.score, "toml": c.to_toml(),
             **_texts(c.score, c.total_bytes, c.tpot_seconds)}
            for i, c in enumerate(result.results, start=1)]
    return {"ok": True, "workload": "inference", "objective": result.objective,
            "considered": result.tried, "ranked": len(result.results),
            "rejected": dict(result.rejected), "results": rows, "pareto": [],
            "warnings": []}
