"""`llmpar calibrate RUNS.toml`: fit a GPU's `matmul_efficiency` (and, if asked, a framework
profile's host overhead) to a user's measured training runs.

RUNS.toml lists the runs, each a spec and what was measured:

    fit = ["matmul_efficiency"]            # or add "micro_batch_overhead_seconds"
                                           # or "step_overhead_seconds"
    [[runs]]
    name = "8B, 64 GPUs"                   # optional label
    spec = "llama-8b.toml"                 # relative to RUNS.toml, or an inline table
    set = { "parallel.data.degree" = 8 }   # optional dotted overrides of the spec
    step_seconds = 1.92                    # or tokens_per_second (the whole job's)

The fit minimizes the mean absolute log error, |ln(predicted / measured)| averaged over
the runs: a least-absolute-deviations fit, which one bad run moves less than least
squares, in log so that a run of 1 s and one of 100 s weigh alike. Each run's step time
is evaluated at a grid of matmul efficiencies and interpolated between them (log-log,
piecewise linear); a host overhead adds to the step time as `framework_overhead` adds it
(per micro-batch times the step's micro-batches, or once per step), so it is searched on
those sums. Both are 1-D searches (a scan of the grid, then golden-section search on the
bracket around the best point); with an overhead, each efficiency tried gets its best
overhead. The leave-one-out error refits without each run in turn and predicts it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from llmpar.errors import Problem, SpecError, did_you_mean, printable
from llmpar.loading.dump import plain_converter, toml_text
from llmpar.loading.reader import SpecSource, read_source
from llmpar.session import Session
from llmpar.spec import Spec
from llmpar.spec.framework import Framework
from llmpar.spec.hardware import Gpu
from llmpar.spec.quantities import Seconds

EFFICIENCY = "matmul_efficiency"
OVERHEADS = ("micro_batch_overhead_seconds", "step_overhead_seconds")
FITTABLE = (EFFICIENCY, *OVERHEADS)
EFFICIENCY_RANGE = (0.05, 1.0)
"""Where `matmul_efficiency` is searched: a share of the dense peak."""
GRID_POINTS = 41
"""Efficiencies each run is evaluated at (geometric between EFFICIENCY_RANGE); the
interpolation between neighbours (2.5% apart) is piecewise linear in log-log."""
OVERHEAD_GRID_POINTS = 65
GOLDEN_STEPS = 40
"""Golden-section steps on a bracket: it shrinks by 0.618 each, to 1e-8 of its width."""
RUN_KEYS = ("name", "spec", "set", "step_seconds", "tokens_per_second")


@attrs.frozen(kw_only=True)
class MeasuredRun:
    """One measured run: its spec and its step time."""

    name: str
    spec: Spec
    step_seconds: float


@attrs.frozen(kw_only=True)
class RunFit:
    """One run's predicted step time before the fit, after it, and when left out of it."""

    name: str
    measured_step_seconds: float
    before_step_seconds: float | None
    """As the spec stands (None: its GPU states no matmul_efficiency and no MFU)."""
    after_step_seconds: float
    left_out_step_seconds: float | None
    """Predicted by the fit on every other run (None with a single run)."""

    def error(self, predicted: float | None) -> float | None:
        """predicted / measured - 1."""
        return None if predicted is None else predicted / self.measured_step_seconds - 1


@attrs.frozen(kw_only=True)
class Calibration:
    """What `calibrate` fitted, and how well it predicts the runs."""

    gpu: Gpu
    """The runs' GPU with the fitted `matmul_efficiency` and its source."""
    framework: Framework | None
    """The runs' framework profile with the fitted overhead (None: no overhead fitted)."""
    fitted: tuple[tuple[str, float], ...]
    runs: tuple[RunFit, ...]

    @property
    def left_out_errors(self) -> tuple[float, ...]:
        """Each run's error when fitted on the others."""
        return tuple(e for r in self.runs if (e := r.error(r.left_out_step_seconds)) is not None)

    def gpu_toml(self) -> str:
        """The fitted GPU as a preset file."""
        return _preset_toml(self.gpu)

    def framework_toml(self) -> str | None:
        """The fitted framework profile as a preset file (None: no overhead fitted)."""
        return None if self.framework is None else _preset_toml(self.framework)


def _preset_toml(value: Gpu | Framework) -> str:
    table = plain_converter().unstructure(value)
    return toml_text(table)


def read_runs(source: SpecSource, session: Session) -> tuple[tuple[MeasuredRun, ...],
                                                             tuple[str, ...]]:
    """The runs of a RUNS.toml (a path, TOML text or a table) and the names to fit;
    SpecError naming every problem."""
    raw, label = read_source(source)
    problems: list[Problem] = []
    for key in raw:
        if key not in ("fit", "runs"):
            problems.append(Problem(f"$.{key}", "unknown key; a runs file has `fit` and "
                                                "[[runs]]"))
    fit = _fit_names(raw.get("fit", [EFFICIENCY]), problems)
    given = raw.get("runs")
    if not isinstance(given, list) or not given:
        problems.append(Problem("$.runs", "required: one [[runs]] table per measured run"))
        given = []
    folder = Path(label).parent if label is not None else Path.cwd()
    runs = []
    for index, table in enumerate(given):
        run = _run(table, f"$.runs[{index}]", folder, session, problems)
        if run is not None:
            runs.append(run)
    if not problems:
        problems += _common_problems(runs, fit)
    if problems:
        raise SpecError(problems, label)
    return tuple(runs), fit


def _fit_names(value: Any, problems: list[Problem]) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(Problem("$.fit", f"expected a list of names, got {value!r}"))
        return (EFFICIENCY,)
    for name in names:
        if name not in FITTABLE:
            problems.append(Problem("$.fit", f"cannot fit {name!r}{did_you_mean(name, FITTABLE)}"
                                             f"; fits {', '.join(FITTABLE)}"))
    if EFFICIENCY not in names:
        problems.append(Problem("$.fit", f"must include {EFFICIENCY!r}"))
    if sum(n in OVERHEADS for n in names) > 1:
        problems.append(Problem("$.fit", f"at most one of {', '.join(OVERHEADS)}"))
    return tuple(dict.fromkeys(names))


def _run(table: Any, path: str, folder: Path, session: Session,
         problems: list[Problem]) -> MeasuredRun | None:
    if not isinstance(table, Mapping):
        problems.append(Problem(path, f"expected a table, got {table!r}"))
        return None
    for key in table:
        if key not in RUN_KEYS:
            problems.append(Problem(f"{path}.{key}", f"unknown key; a run has "
                                                     f"{', '.join(RUN_KEYS)}"))
    measured = [k for k in ("step_seconds", "tokens_per_second") if k in table]
    if len(measured) != 1:
        problems.append(Problem(path, "give step_seconds or tokens_per_second (one of them)"))
        return None
    value = table[measured[0]]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        problems.append(Problem(f"{path}.{measured[0]}",
                                f"must be a finite number > 0, got {value!r}"))
        return None
    spec = _spec(table.get("spec"), table.get("set", {}), f"{path}.spec", folder, session,
                 problems)
    if spec is None:
        return None
    if spec.inference is not None or spec.training.mfu is not None:
        problems.append(Problem(f"{path}.spec", "a training spec whose step time is modelled "
                                "(no [training] mfu, no [inference]) is needed to fit"))
        return None
    plan = session.evaluate(spec)
    seconds = (float(value) if measured[0] == "step_seconds"
               else plan.tokens_per_step / float(value))
    name = table.get("name", f"run {path.removeprefix('$.runs')}")
    if not isinstance(name, str):
        problems.append(Problem(f"{path}.name", f"expected a label (a string), got {name!r}"))
        return None
    return MeasuredRun(name=name, spec=spec, step_seconds=seconds)


def _spec(given: Any, overrides: Any, path: str, folder: Path, session: Session,
          problems: list[Problem]) -> Spec | None:
    if not isinstance(overrides, Mapping):
        problems.append(Problem(path.replace(".spec", ".set"),
                                f"expected a table of dotted keys, got {overrides!r}"))
        return None
    source: Any
    if isinstance(given, str):
        source = folder / given  # read as a spec file, so its own `file = ...` keys work
        label: str | None = str(source)
    elif isinstance(given, Mapping):
        source, label = dict(given), None
    else:
        problems.append(Problem(path, "required: a spec file (relative to the runs file) "
                                      f"or an inline table, got {given!r}"))
        return None
    try:
        return session.load_spec(source, dict(overrides))
    except SpecError as error:
        where = error.source or label
        prefix = f"{printable(where)}: " if where else ""
        problems += [Problem(path, f"{prefix}{p}") for p in error.problems]
        return None


def _common_problems(runs: Sequence[MeasuredRun], fit: Sequence[str]) -> list[Problem]:
    """One GPU (and, to fit an overhead, one profile) across the runs."""
    problems = []
    first = runs[0]
    for index, run in enumerate(runs):
        gpu = run.spec.hardware.gpu
        if gpu.name != first.spec.hardware.gpu.name:
            problems.append(Problem(f"$.runs[{index}].spec", f"every run must be on one GPU "
                                    f"to fit its {EFFICIENCY}: the first is on "
                                    f"{first.spec.hardware.gpu.name!r}, this on {gpu.name!r}"))
        if not (gpu.memory_efficiency and gpu.hbm_bandwidth_bytes_per_s):
            problems.append(Problem(f"$.runs[{index}].spec", f"GPU {gpu.name!r} states no "
                                    "memory_efficiency or HBM bandwidth: no modelled step"))
        profile = run.spec.training.profile
        if any(n in OVERHEADS for n in fit) and profile.name != first.spec.training.profile.name:
            problems.append(Problem(f"$.runs[{index}].spec", "every run must name one "
                                    "framework profile to fit its overhead: the first runs "
                                    f"{first.spec.training.profile.name!r}, this "
                                    f"{profile.name!r}"))
    return problems


def _with(spec: Spec, efficiency: float, overhead: str | None) -> Spec:
    """`spec` at `efficiency`, with the overhead being fitted set to 0 (it is added)."""
    gpu = attrs.evolve(spec.hardware.gpu, matmul_efficiency=efficiency)
    training = spec.training
    if gpu.name in training.profile.matmul_efficiency:  # the fit replaces the profile's
        table = {k: e for k, e in training.profile.matmul_efficiency.items() if k != gpu.name}
        training = attrs.evolve(training, framework=attrs.evolve(training.profile,
                                                                 matmul_efficiency=table))
    if overhead is not None:
        training = attrs.evolve(training, framework=_with_overhead(training.profile,
                                                                   overhead, 0.0))
    return attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu=gpu), training=training)


def _with_overhead(profile: Framework, overhead: str, seconds: float) -> Framework:
    """`profile` with its `overhead` field (one of OVERHEADS) set to `seconds`."""
    if overhead == "micro_batch_overhead_seconds":
        return attrs.evolve(profile, micro_batch_overhead_seconds=Seconds(seconds))
    return attrs.evolve(profile, step_overhead_seconds=Seconds(seconds))


@attrs.frozen
class _Curve:
    """One run's step time over the efficiency grid (log-log), and its overhead count."""

    log_steps: tuple[float, ...]
    count: float
    """What the fitted overhead is multiplied by: micro-batches per step, or 1."""
    log_measured: float

    def step(self, log_efficiency: float, grid: Sequence[float]) -> float:
        low = grid[0]
        width = (grid[-1] - low) / (len(grid) - 1)
        position = min(max((log_efficiency - low) / width, 0.0), len(grid) - 1.0)
        index = min(int(position), len(grid) - 2)
        share = position - index
        return math.exp(self.log_steps[index] * (1 - share)
                        + self.log_steps[index + 1] * share)


def _golden(loss: Callable[[float], float], low: float, high: float) -> float:
    """The minimum of `loss` on [low, high] by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return (a + b) / 2


def _minimize(loss: Callable[[float], float], points: Sequence[float]) -> float:
    """Scan `points`, then golden-section search between the best one's neighbours."""
    values = [loss(p) for p in points]
    best = min(range(len(points)), key=values.__getitem__)
    low, high = points[max(best - 1, 0)], points[min(best + 1, len(points) - 1)]
    found = _golden(loss, low, high)
    return found if loss(found) <= values[best] else points[best]


def _fit(curves: Sequence[_Curve], grid: Sequence[float], overhead: bool
         ) -> tuple[float, float]:
    """(log efficiency, overhead seconds) of least mean absolute log error."""

    def loss(log_efficiency: float, extra: float) -> float:
        return sum(abs(math.log(c.step(log_efficiency, grid) + c.count * extra)
                       - c.log_measured) for c in curves) / len(curves)

    def best_overhead(log_efficiency: float) -> float:
        if not overhead:
            return 0.0
        ceiling = max(math.exp(c.log_measured) / c.count for c in curves)
        points = [ceiling * i / (OVERHEAD_GRID_POINTS - 1) for i in range(OVERHEAD_GRID_POINTS)]
        return max(0.0, _minimize(lambda o: loss(log_efficiency, o), points))

    log_efficiency = _minimize(lambda e: loss(e, best_overhead(e)), grid)
    return log_efficiency, best_overhead(log_efficiency)


def calibrate(source: SpecSource, session: Session | None = None,
              fit: Sequence[str] | None = None) -> Calibration:
    """Fit the runs of a RUNS.toml (a path, TOML text or a table): see the module's text.
    `fit` overrides the file's `fit`; `session` defaults to llmpar's default session."""
    if session is None:
        from llmpar import default_session

        session = default_session()
    runs, named = read_runs(source, session)
    if fit is not None:
        problems: list[Problem] = []
        named = _fit_names(list(fit), problems)
        if problems:
            raise SpecError(problems, None)
    overhead = next((n for n in named if n in OVERHEADS), None)
    low, high = (math.log(x) for x in EFFICIENCY_RANGE)
    grid = [low + (high - low) * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]

    def predicted(run: MeasuredRun, efficiency: float) -> tuple[float, float]:
        """(step seconds without the fitted overhead, what the overhead is paid times)."""
        plan = session.evaluate(_with(run.spec, efficiency, overhead))
        assert plan.step_seconds is not None
        return plan.step_seconds, _count(overhead, plan.micro_batches_per_step)

    curves = []
    for run in runs:
        steps = [predicted(run, math.exp(e)) for e in grid]
        curves.append(_Curve(tuple(math.log(s) for s, _ in steps), steps[0][1],
                             math.log(run.step_seconds)))
    log_efficiency, extra = _fit(curves, grid, overhead is not None)
    # As the preset files state them: 4 digits, and whole tenths of a microsecond.
    efficiency, extra = round(math.exp(log_efficiency), 4), round(extra, 7)
    results = []
    for index, run in enumerate(runs):
        before = session.evaluate(run.spec).step_seconds
        after, count = predicted(run, efficiency)
        left_out = None
        if len(runs) > 1:
            e, o = _fit(curves[:index] + curves[index + 1:], grid, overhead is not None)
            seconds, _ = predicted(run, math.exp(e))
            left_out = seconds + count * o
        results.append(RunFit(name=run.name, measured_step_seconds=run.step_seconds,
                              before_step_seconds=before, after_step_seconds=after + count * extra,
                              left_out_step_seconds=left_out))
    return _calibration(runs, tuple(results), efficiency, overhead, extra,
                        str(source) if isinstance(source, (str, Path)) else "a runs table")


def _count(overhead: str | None, micro_batches: int) -> float:
    return float(micro_batches) if overhead == "micro_batch_overhead_seconds" else 1.0


def _calibration(runs: Sequence[MeasuredRun], results: tuple[RunFit, ...], efficiency: float,
                 overhead: str | None, extra: float, label: str) -> Calibration:
    errors = [abs(e) for r in results if (e := r.error(r.left_out_step_seconds)) is not None]
    after = [abs(e) for r in results if (e := r.error(r.after_step_seconds)) is not None]
    where = label if "\n" not in label else "a runs table"
    summary = (f"calibrated: least absolute log error on {len(runs)} measured runs "
               f"({printable(where)}) by llmpar calibrate; after the fit within "
               f"{max(after):.1%} (median {median(after):.1%})")
    if errors:
        summary += (f"; leave-one-out within {max(errors):.1%} (median "
                    f"{median(errors):.1%})")
    first = runs[0].spec
    gpu = first.hardware.gpu
    fitted_gpu = attrs.evolve(
        gpu, name=f"{gpu.name}-calibrated", matmul_efficiency=efficiency,
        efficiency_source=f"{summary}; starting from {gpu.name}: {gpu.efficiency_source}",
        efficiency_uncertainty=round(min(1.0, max(max(errors or after), 0.001)), 4))
    fitted: list[tuple[str, float]] = [(EFFICIENCY, efficiency)]
    framework = None
    if overhead is not None:
        profile = first.training.profile
        framework = attrs.evolve(_with_overhead(profile, overhead, extra),
                                 name=f"{profile.name}-calibrated", overhead_source=summary)
        fitted.append((overhead, extra))
    return Calibration(gpu=fitted_gpu, framework=framework, fitted=tuple(fitted), runs=results)


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return (ordered[middle] if len(ordered) % 2
            else (ordered[middle - 1] + ordered[middle]) / 2)
