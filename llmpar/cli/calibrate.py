"""`llmpar calibrate RUNS.toml`: fit a GPU's matmul efficiency (and a framework profile's
host overhead) to measured runs, print the error per run before and after, and the
leave-one-out error; write the fitted presets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmpar.calibration import FITTABLE, Calibration, calibrate, median
from llmpar.cli.output import add_format_argument, print_tables
from llmpar.report.tables import Table
from llmpar.session import Session


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "calibrate", help="fit a GPU's matmul efficiency to measured runs",
        description="Fit the matmul_efficiency of the runs' GPU (and, with --fit, a "
                    "framework profile's host overhead) to measured step times by least "
                    "absolute log error; print each run's error before and after the fit "
                    "and when left out of it, and write the fitted presets.")
    parser.add_argument("runs", metavar="RUNS", help="a TOML file of [[runs]], each a spec "
                                                     "(file or table) and its measured "
                                                     "step_seconds or tokens_per_second")
    parser.add_argument("--fit", action="append", choices=FITTABLE, metavar="NAME",
                        help="what to fit (repeatable): matmul_efficiency, and at most one "
                             "of micro_batch_overhead_seconds and step_overhead_seconds; "
                             "default: the file's `fit`, else matmul_efficiency")
    parser.add_argument("--output", metavar="GPU.toml",
                        help="write the fitted GPU as a preset file")
    parser.add_argument("--framework-output", metavar="FRAMEWORK.toml",
                        help="write the fitted framework profile (with an overhead fitted)")
    add_format_argument(parser, "; the table of runs")
    parser.set_defaults(run=run)


def run(session: Session, args: argparse.Namespace) -> int:
    fit = None if args.fit is None else ["matmul_efficiency", *args.fit]
    result = calibrate(Path(args.runs), session, list(dict.fromkeys(fit)) if fit else None)
    print_tables([calibration_table(result)], args.format)
    said = sys.stderr if args.format == "json" else sys.stdout  # JSON alone on stdout
    if args.output:
        Path(args.output).write_text(result.gpu_toml())
        print(f"wrote GPU preset {result.gpu.name!r} to {args.output}", file=said)
    framework = result.framework_toml()
    if args.framework_output and framework is not None:
        Path(args.framework_output).write_text(framework)
        assert result.framework is not None
        print(f"wrote framework profile {result.framework.name!r} to {args.framework_output}",
              file=said)
    return 0


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def calibration_table(result: Calibration) -> Table:
    """Each run: measured, and predicted / measured - 1 before, after and left out."""
    rows = tuple((r.name, f"{r.measured_step_seconds:.4g} s",
                  _error(r.error(r.before_step_seconds)), _error(r.error(r.after_step_seconds)),
                  _error(r.error(r.left_out_step_seconds))) for r in result.runs)
    fitted = ", ".join(f"{name} = {value:.4g}" for name, value in result.fitted)
    left_out = [abs(e) for e in result.left_out_errors]
    notes = [f"fitted: {fitted}",
             "error: predicted step / measured step - 1; left out: fitted on the other runs"]
    if left_out:
        notes.append(f"leave-one-out error: median {median(left_out):.1%}, "
                     f"largest {max(left_out):.1%}")
    return Table(title=f"Calibration on {len(result.runs)} runs: {result.gpu.name}",
                 columns=("run", "measured", "before", "after", "left out"), rows=rows,
                 notes=tuple(notes), text_columns=(0,))
