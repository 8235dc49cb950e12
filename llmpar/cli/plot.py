"""`llmpar plot KIND SPEC... -o FILE`: memory and step-time figures (needs matplotlib,
the `plot` extra)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llmpar.cli.common import overrides, spec_source
from llmpar.errors import Problem, SpecError
from llmpar.session import Session

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from llmpar.plan import Plan
    from llmpar.search.result import ParetoPoint

KINDS = ("memory", "sequence", "batch", "pareto", "timeline", "waterfall")
SUFFIXES = (".png", ".svg")
EXIT_USAGE = 2


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "plot", help="plot memory per GPU, or memory and step time against a sweep",
        description="memory: stacked memory per GPU of each SPEC (several specs, several "
                    "layouts) against capacity. sequence: memory and step time at sequence "
                    "lengths 512, 1024, ... up to max(32768, the spec's). batch: the same at "
                    "micro_batch_size 1, 2, 4, 8, 16 (a serving spec: prompt lengths, and "
                    "batch_size or concurrency 1 to 256, with TTFT and TPOT). pareto: the layout "
                    "search's front of memory per GPU against step time (first SPEC). timeline: "
                    "allocated memory per pipeline stage over one step at its modelled moments, "
                    "the peak marked and labelled (first SPEC). waterfall: the step time of the "
                    "first SPEC as compute, each strategy's exposed communication, the "
                    "bubble and the optimizer step. Needs matplotlib: pip install "
                    "'llmpar[plot]'.")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (TOML)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="where to write the figure: .png or .svg")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of every spec (repeatable; values are TOML)")
    parser.set_defaults(run=run)


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def run(session: Session, args: argparse.Namespace) -> int:
    if not matplotlib_available():
        print("llmpar: plotting needs matplotlib: install llmpar[plot] "
              "(pip install 'llmpar[plot]')", file=sys.stderr)
        return EXIT_USAGE
    output = Path(args.output)
    if output.suffix.lower() not in SUFFIXES:
        print(f"llmpar: -o must end in .png or .svg, got {output.name!r}", file=sys.stderr)
        return EXIT_USAGE
    specs = [_example_path(session, spec) for spec in args.specs]
    figure = build_figure(session, args.kind, specs, overrides(args.set))
    figure.savefig(output, dpi=150)
    print(f"wrote {output}")
    return 0


def _example_path(session: Session, spec: str) -> str:
    """A SPEC argument, with a shipped example's name as its file."""
    found = spec_source(session, spec) if spec != "-" else spec
    return str(found) if isinstance(found, Path) else spec


def build_figure(session: Session, kind: str, specs: list[str],
                 base: dict[str, object]) -> Figure:
    """The figure of `kind` for `specs`, each evaluated with the `base` overrides."""
    from llmpar import plot

    if kind == "pareto":
        from llmpar.search import search

        result = search(specs[0], base, session=session)
        labels = [_choices_label(point) for point in result.pareto]
        return plot.pareto_figure(result.pareto, labels,
                                  f"{Path(specs[0]).stem}: {result.considered:,} layouts "
                                  "considered, Pareto front")
    if kind == "timeline":
        plan = session.evaluate(specs[0], base)
        moments = session.memory_timeline(specs[0], base)
        if not moments:
            raise SpecError([Problem("$.training", "a memory timeline needs a training "
                                     "spec with an activation estimate")], specs[0])
        return plot.timeline_figure(moments, plan, f"{Path(specs[0]).stem}: memory over "
                                    f"one step ({_layout(plan)})")
    if kind == "waterfall":
        plan = session.evaluate(specs[0], base)
        return plot.waterfall_figure(plan, f"{Path(specs[0]).stem}: step time "
                                           f"({_layout(plan)})")
    if kind == "memory":
        plans = [session.evaluate(spec, base) for spec in specs]
        labels = [f"{Path(spec).stem}: {_layout(plan)}" for spec, plan in zip(specs, plans)]
        return plot.memory_figure(plans, labels)
    sweeps = []
    for spec in specs:
        def evaluate(extra: dict[str, object], spec: str = spec) -> Plan:
            return session.evaluate(spec, {**base, **extra})

        key, values, xlabel = plot.sweep_axis(session.load_spec(spec, base), kind)
        sweeps.append(plot.sweep(evaluate, Path(spec).stem, key, values))
        for value, problem in sweeps[-1].skipped:
            print(f"llmpar: {Path(spec).stem}: skipped {key} = {value}: {problem}",
                  file=sys.stderr)
    return plot.sweep_figure(sweeps, xlabel)


def _layout(plan: Plan) -> str:
    return _layout_of(plan.layout)


def _choices_label(point: ParetoPoint) -> str:
    """A front point's degrees, then its other choices (recompute, ZeRO stage...)."""
    others = ", ".join(f"{key.split('.')[-1]} {value}" for key, value in point.choices.items()
                       if not key.endswith(".degree") and value is not None)
    return _layout_of(point.layout) + (f"; {others}" if others else "")


def _layout_of(degrees: dict[str, int]) -> str:
    return " x ".join(f"{name} {degree}" for name, degree in degrees.items()
                      if degree > 1) or "1 GPU"
