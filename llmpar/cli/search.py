"""`llmpar search SPEC`: the best parallel layouts of the spec's model on its GPUs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmpar.cli.common import add_question_arguments, print_spec, question
from llmpar.cli.output import add_format_argument, print_text
from llmpar.loading.reader import SpecSource, apply_overrides, read_source
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.spec.search import OBJECTIVES

if TYPE_CHECKING:
    from llmpar.search.result import Ranked
    from llmpar.search.serving import ServingCandidate


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "search", help="the best parallel layouts of a model on its GPUs",
        description="Enumerate every layout (degrees, ZeRO stage, sequence parallelism, "
                    "pipeline schedule, micro-batch size, recomputation), reject those that "
                    "break a rule or do not fit, and rank the rest. The spec's [parallel] "
                    "tables pin choices; [search] narrows the space (docs/search.md). A "
                    "serving spec ([inference]) searches its tensor, pipeline, expert and "
                    "replica degrees under [search] ttft_seconds_max and tpot_seconds_max "
                    "(docs/inference.md).")
    add_question_arguments(parser)
    parser.add_argument("--top", type=int, help="how many layouts to list (default 10)")
    parser.add_argument("--objective", choices=OBJECTIVES,
                        help="rank by (default step_time)")
    add_format_argument(parser, "; the result's to_dict()")
    parser.add_argument("--emit", metavar="FILE",
                        help="write the best layout as a spec: presets by name, with only "
                             "the keys that differ from them")
    parser.add_argument("--emit-launch", metavar="NAME",
                        help="also print what framework NAME needs to run the best layout "
                             "(as `llmpar launch --for NAME`; on stderr with --json)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="processes to search in (default 1); 0: every core when the "
                             "space is large enough to repay starting them")
    parser.add_argument("--exact", action="store_true",
                        help="evaluate every valid layout, without the fast bounds (slow)")
    parser.add_argument("--hardware", metavar="NAMES",
                        help="compare machines: cluster or GPU presets, comma-separated, "
                             "e.g. dgx-h100,dgx-h200,dgx-b200 ([search] hardware; prices "
                             "in [search] gpu_hour_costs)")
    parser.add_argument("--explain", metavar="FIELD",
                        help="instead of the report, explain one field of the result's JSON "
                             "by its path: results[0].objective, results[0].plan.training.mfu "
                             "(that plan's derivation), pareto[1].step_seconds, ...")
    parser.add_argument("--dimensions", action="store_true",
                        help="list the keys [search] values takes and the values each takes "
                             "in this spec's space, instead of searching")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    source, changes = question(session, args)
    if args.hardware is not None:
        changes["search.hardware"] = [name.strip() for name in args.hardware.split(",")
                                      if name.strip()]
    if args.print_spec:
        print_spec(session, source, changes)
        return 0
    if args.dimensions:
        return _list_dimensions(session, source, changes, args.format)
    from llmpar.search.hardware import hardware_list

    if hardware_list(session, source, changes):
        return _search_hardware(session, source, changes, args)
    spec = _serving_spec(session, source, changes)
    if spec is not None:
        return _search_serving(session, spec, args)
    from llmpar.search import search
    from llmpar.search.progress import clear, terminal_progress
    from llmpar.search.report import text_report

    progress = None if args.format == "json" else terminal_progress()
    try:
        # Processes load the default session, the same plugins as this one.
        result = search(source, changes, objective=args.objective,
                        top=args.top, session=session if args.jobs == 1 else None,
                        jobs=args.jobs, exact=args.exact, progress=progress)
    finally:
        if progress is not None:
            clear()
    if args.emit and result.results:
        Path(args.emit).write_text(_emitted(session, result.best), encoding="utf-8")
    if args.explain:
        return _explained(result, args)
    print_text(text_report(result), args.format, result.to_dict())
    if args.format != "json" and args.emit:
        print(f"best layout written to {args.emit}" if result.results
              else "no layout fits: nothing written")
    if args.emit_launch and result.results:
        _print_launch(session, result.best.spec, args)
    return 0 if result.results else 1


def _list_dimensions(session: Session, source: SpecSource, changes: dict[str, Any],
                     fmt: str) -> int:
    from llmpar.search.listing import list_dimensions
    from llmpar.search.report import dimensions_report

    listing = list_dimensions(session, source, changes)
    print_text(dimensions_report(listing), fmt, listing.to_dict())
    return 0


def _serving_spec(session: Session, source: SpecSource,
                  changes: dict[str, Any]) -> Spec | None:
    """The spec when it describes serving (`[inference]`), else None (a training search)."""
    raw, _label = read_source(source)
    if "inference" not in apply_overrides(raw, changes):
        return None
    return session.load_spec(source, changes)


def _search_serving(session: Session, spec: Spec, args: argparse.Namespace) -> int:
    from llmpar.search.serving import search_serving, text_report

    result = search_serving(session, spec, objective=args.objective, top=args.top)
    if args.emit and result.results:
        Path(args.emit).write_text(_emitted(session, result.best), encoding="utf-8")
    if args.explain:
        return _explained(result, args)
    print_text(text_report(result), args.format, result.to_dict())
    if args.emit and args.format != "json":
        print(f"best layout written to {args.emit}" if result.results
              else "no layout fits: nothing written")
    if args.emit_launch and result.results:
        _print_launch(session, session.load_spec(result.best.table), args)
    return 0 if result.results else 1


def _print_launch(session: Session, spec: Spec, args: argparse.Namespace) -> None:
    """`--emit-launch NAME`: the launch of the best layout, after the report (on stderr
    under --json)."""
    launch = session.launch(spec, args.emit_launch)
    print(f"# launch of the best layout for {launch.target}\n{launch.text()}", end="",
          file=sys.stderr if args.format == "json" else sys.stdout)


def _search_hardware(session: Session, source: SpecSource, changes: dict[str, Any],
                     args: argparse.Namespace) -> int:
    """`[search] hardware`: the search on each machine, compared."""
    from llmpar.search.hardware import search_hardware, text_report

    result = search_hardware(source, changes, objective=args.objective, top=args.top,
                             session=session if args.jobs == 1 else None, jobs=args.jobs,
                             exact=args.exact)
    fits = bool(result.entries) and result.entries[0].best is not None
    if args.emit and fits:
        Path(args.emit).write_text(_emitted(session, result.best.result.best),
                                   encoding="utf-8")
    if args.explain:
        return _explained(result, args)
    print_text(text_report(result), args.format, result.to_dict())
    if args.format != "json" and args.emit:
        print(f"best layout written to {args.emit}" if fits else "no layout fits: nothing "
                                                                 "written")
    return 0 if fits else 1


def _emitted(session: Session, best: Ranked | ServingCandidate) -> str:
    """What --emit writes: the best layout's spec with its presets by name."""
    from llmpar.search.result import Ranked

    spec = best.spec if isinstance(best, Ranked) else session.load_spec(best.table)
    return session.emit_spec(spec)


def _explained(result: Any, args: argparse.Namespace) -> int:
    """`--explain FIELD`: one field of the result's JSON explained
    (`llmpar.search.explain.explain_search`); 2 with the fields it has when it has no
    such field."""
    from llmpar.errors import did_you_mean
    from llmpar.plan_explain import format_path, leaf_paths
    from llmpar.search.explain import explain_search

    data = result.to_dict()
    try:
        text = explain_search(result, args.explain, data=data)
    except KeyError:
        fields = [format_path(p) for p in leaf_paths(data)]
        print(f"llmpar: the search result has no field {args.explain!r}"
              f"{did_you_mean(args.explain, fields)}; a field is a path in its JSON, e.g. "
              "results[0].objective", file=sys.stderr)
        return 2
    print_text(text, args.format, {"field": args.explain, "explanation": text})
    return 0
