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

from llmpar.errors import Problem, SpecError
from llmpar.loading.dump import spec_to_dict, toml_text
from llmpar.loading.presets import PRESET_KINDS, PresetNotFound, is_preset_name
from llmpar.loading.reader import apply_overrides, parse_toml
from llmpar.report.fields import format_gb_gib
from llmpar.session import Session
from llmpar.spec.search import OBJECTIVES
from llmpar.ui import form
from llmpar.ui.form import Node
from llmpar.ui.view import plan_view
from llmpar.units import format_duration

PAGE_LABEL = "<page>"
"""The spec's name in problems: the page's editor."""
MAX_TOP = 50
"""The most layouts a search from the page lists."""
DEFAULT_TOP = 10


def spec_form(session: Session) -> tuple[Node, ...]:
    """The page's form: every table and key of the session's spec schema (its plugin
    strategies' tables too), with menus of its presets."""
    from llmpar.loading.json_schema import spec_json_schema

    return form.spec_form(spec_json_schema(session.strategies, session.workloads),
                          {kind: tuple(session.presets.names(kind)) for kind in PRESET_KINDS})


def presets(session: Session, nodes: tuple[Node, ...] | None = None) -> dict[str, Any]:
    """Preset names by kind, the form (`spec_form`) and the search objectives."""
    nodes = spec_form(session) if nodes is None else nodes
    return {"presets": {kind: session.presets.names(kind) for kind in PRESET_KINDS},
            "form": form.form_data(nodes), "objectives": list(OBJECTIVES)}


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
            if key in form.FILE_KEYS:
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


def _set(table: dict[str, Any], field: form.FormField, value: Any) -> dict[str, Any]:
    """`table` with the field's key set to what its value means (None: removed). A
    preset's name given for a table that overrides its preset replaces that preset only
    (`[model] preset`), keeping the overrides."""
    key = field.key
    if field.type == "preset" and isinstance(form.lookup(table, key), Mapping):
        key = f"{key}.preset"
    if value is None or value == "":
        return _without(table, key)
    return apply_overrides(table, {key: form.parse_value(field, value)})


def edited(text: object, changes: object, nodes: tuple[Node, ...] = ()
           ) -> tuple[dict[str, Any], str]:
    """The spec's table and its TOML text after the form's changes (`{dotted key: text
    or None}`, keys of the form `nodes`, `spec_form`): a text sets its key, None removes
    it; without changes the text stays as typed (comments kept)."""
    if not isinstance(text, str):
        raise SpecError([Problem("$", "expected the spec as TOML text")], PAGE_LABEL)
    table = parse_toml(text, PAGE_LABEL)
    if not changes:
        return table, text
    if not isinstance(changes, Mapping) or not all(isinstance(k, str) for k in changes):
        raise SpecError([Problem("$", "expected changes as {dotted key: value}")], PAGE_LABEL)
    fields = form.fields_by_key(nodes)
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise SpecError([Problem(f"$.{k}", "not a field of the form") for k in unknown],
                        PAGE_LABEL)
    for key, value in changes.items():
        table = _set(table, fields[key], value)
    return table, toml_text(table)


def _placed(answer: dict[str, Any], nodes: tuple[Node, ...]) -> dict[str, Any]:
    """The answer with each problem's form key (`form.problem_key`), where one is."""
    keys = {node.key: node for node in form.walk(nodes)}
    for problem in answer.get("problems", []):
        problem["key"] = form.problem_key(problem["path"], keys)
    return answer


def evaluate(session: Session, body: Mapping[str, Any],
             nodes: tuple[Node, ...] | None = None) -> dict[str, Any]:
    """{"toml", "changes"?} -> the spec's text, the form's texts of the keys it gives
    (`fields`) and of every key of the loaded spec (`effective`: presets and defaults
    filled in), and its plan and view; or the problems that stop it, each with the form
    key it belongs to (with the text and fields, so the page keeps them)."""
    nodes = spec_form(session) if nodes is None else nodes
    try:
        table, text = edited(body.get("toml"), body.get("changes"), nodes)
    except SpecError as error:
        return _placed(_problems(error), nodes)
    fields = form.fields_by_key(nodes)
    answer: dict[str, Any] = {"toml": text, "fields": form.field_texts(table, fields),
                              "workload": "inference" if "inference" in table else "training"}
    try:
        refused = list(_file_references(table))
        if refused:
            raise SpecError(refused, PAGE_LABEL)
        spec = session.load_spec(table)
        plan = session.evaluate(spec)
        timeline = session.memory_timeline(spec)
    except SpecError as error:
        return _placed({**_problems(error), **answer}, nodes)
    effective = form.field_texts(spec_to_dict(spec), fields, resolved=True)
    return {**answer, "ok": True, "effective": effective, "plan": plan.to_dict(),
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
