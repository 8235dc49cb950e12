"""`llmpar search` on a serving spec: every split of its GPUs into tensor, pipeline, expert
and data (replica) degrees, each evaluated exactly (`llmpar.evaluate`; serving has no fast
form yet, and its spaces are small: the divisors of the GPU count), kept when it fits and
meets `[search] ttft_seconds_max` and `tpot_seconds_max`, and ranked by the objective.

Times are the steady state's under continuous batching (`[inference] concurrency` or
`request_rate_per_s`; TTFT at `[search] percentile`), else the static batch's. Objectives:
tokens_per_second_per_gpu (higher is better), step_time (the time per output token), cost
(dollars per million output tokens at `[hardware] gpu_hour_cost`) and memory (bytes on the
busiest GPU). Expert parallelism spans the replicas (attention data-parallel with the experts
split over the same GPUs, as the DeepSeek-V3 example), never beyond them. A spec with
`[inference.disaggregated]` keeps its pools' GPU counts and searches every pair of a
prefill pool's and a decode pool's layout (TTFT with the KV transfer, TPOT of the decode
pool, throughput over both pools' GPUs).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import TYPE_CHECKING, Any

import attrs

from llmpar.errors import Problem, SpecError
from llmpar.loading.dump import spec_to_dict
from llmpar.plan import Plan
from llmpar.spec import Spec
from llmpar.spec.search import Search

if TYPE_CHECKING:
    from llmpar.session import Session

SEARCHED = ("tensor", "pipeline", "expert", "data")
"""The strategies whose degrees a serving search varies; the others keep the spec's."""
HIGHER_IS_BETTER = ("tokens_per_second_per_gpu",)


@attrs.frozen(kw_only=True)
class ServingCandidate:
    """One layout that fits and meets the limits."""

    layout: dict[str, int] = attrs.field(hash=False)
    score: float
    ttft_seconds: float
    tpot_seconds: float
    tokens_per_second_per_gpu: float
    total_bytes: int
    table: dict[str, Any] = attrs.field(hash=False, repr=False)
    """The spec of this layout, as a table."""
    num_gpus: int = 0
    """GPUs of the layout (both pools' under `[inference.disaggregated]`)."""
    replicas: int = 1
    """Copies of the model serving requests side by side (the data degree; the decode
    pool's when disaggregated)."""
    request_rate_per_s: float | None = None
    """Requests per second the layout serves: the rate given, or what the concurrency
    sustains (continuous batching only)."""
    max_request_rate_per_s: float | None = None
    """Requests per second the layout sustains at its batch limit, over all replicas:
    replicas x each replica's rate (continuous batching only)."""

    def to_toml(self) -> str:
        """The layout's spec as TOML: presets by name, with only the keys that differ
        from them (`Session.emit_spec`)."""
        import llmpar

        session = llmpar.default_session()
        return session.emit_spec(session.load_spec(self.table))

    def to_dict(self) -> dict[str, Any]:
        return {"layout": dict(self.layout), "score": self.score,
                "ttft_seconds": self.ttft_seconds, "tpot_seconds": self.tpot_seconds,
                "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
                "total_bytes": self.total_bytes, "num_gpus": self.num_gpus,
                "replicas": self.replicas, "request_rate_per_s": self.request_rate_per_s,
                "max_request_rate_per_s": self.max_request_rate_per_s}


@attrs.frozen(kw_only=True)
class ServingSearchResult:
    objective: str
    results: tuple[ServingCandidate, ...]
    """The best layouts, best first (at most `[search] top`)."""
    tried: int
    rejected: dict[str, int] = attrs.field(hash=False)
    """Layouts set aside, by reason."""
    limits: dict[str, float] = attrs.field(hash=False)
    gpu_counts: tuple[ServingCount, ...] = ()
    """With `[search] num_gpus`: each count tried, fewest first (else empty)."""
    gpus_pareto: tuple[ServingCandidate, ...] = ()
    """With `[search] num_gpus`: the best layout of each count that beats every layout on
    fewer GPUs on TPOT (on cost for the cost and tokens_per_second_per_gpu objectives),
    fewest GPUs first."""

    @property
    def best(self) -> ServingCandidate:
        return self.results[0]

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, "tried": self.tried,
                "rejected": dict(self.rejected), "limits": dict(self.limits),
                "results": [c.to_dict() for c in self.results],
                "gpu_counts": [c.to_dict() for c in self.gpu_counts],
                "gpus_pareto": [c.to_dict() for c in self.gpus_pareto]}


@attrs.frozen(kw_only=True)
class ServingCount:
    """What the search found on one of `[search] num_gpus`'s counts."""

    num_gpus: int
    tried: int
    kept: int
    """Layouts on this many GPUs that fit and meet the limits."""

    def to_dict(self) -> dict[str, Any]:
        return {"num_gpus": self.num_gpus, "tried": self.tried, "kept": self.kept}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(spec: Spec, settings: Search) -> list[dict[str, int]]:
    """Every split of the GPU count into tensor x pipeline x data, with expert degrees
    dividing both the replicas and the experts, under `[search] max_degrees` and
    `tensor_within_node`."""
    gpus, limits = spec.hardware.num_gpus, settings.max_degrees
    layers, moe = spec.model.num_layers or 1, spec.model.moe
    found = []
    for t in _divisors(gpus):
        if t > limits.get("tensor", gpus) or (settings.tensor_within_node
                                               and spec.hardware.gpus_per_node % t):
            continue
        for p in _divisors(gpus // t):
            d = gpus // t // p
            if p > min(layers, limits.get("pipeline", gpus)) or d > limits.get("data", gpus):
                continue
            experts = [1] if moe is None else [
                e for e in _divisors(d) if moe.num_experts % e == 0
                and e <= limits.get("expert", gpus)]
            found += [{"tensor": t, "pipeline": p, "expert": e, "data": d} for e in experts]
    return found


def _table(base: dict[str, Any], layout: dict[str, int]) -> dict[str, Any]:
    table = copy.deepcopy(base)
    parallel = {name: config for name, config in table.get("parallel", {}).items()
                if name not in SEARCHED}
    for name in SEARCHED:
        if layout[name] > 1:
            kept = base.get("parallel", {}).get(name, {})
            parallel[name] = {**(kept if isinstance(kept, dict) else {}),
                              "degree": layout[name]}
    table["parallel"] = parallel
    table.pop("search", None)
    return table


def disaggregated_layouts(spec: Spec, settings: Search) -> list[dict[str, int]]:
    """Under `[inference.disaggregated]`: every pair of a prefill pool's and a decode pool's
    layout (`layouts` of each pool's GPUs), keyed `prefill.<strategy>` and
    `decode.<strategy>`."""
    inference = spec.inference
    assert inference is not None and inference.disaggregated is not None
    plan = inference.disaggregated
    pools = {role: layouts(attrs.evolve(spec, hardware=attrs.evolve(spec.hardware,
                                                                    num_gpus=gpus)), settings)
             for role, gpus in (("prefill", plan.prefill_gpus), ("decode", plan.decode_gpus))}
    return [{**{f"prefill.{k}": v for k, v in prefill.items()},
             **{f"decode.{k}": v for k, v in decode.items()}}
            for prefill in pools["prefill"] for decode in pools["decode"]]


def _pools_table(base: dict[str, Any], layout: dict[str, int]) -> dict[str, Any]:
    """The spec of one pair of pool layouts: each pool's degrees in its layout table (every
    searched strategy the spec's `[parallel.*]` names, data, and the others above 1)."""
    table = copy.deepcopy(base)
    table.pop("search", None)
    named = set(base.get("parallel", {})) | {"data"}
    pools = table["inference"]["disaggregated"]
    for role in ("prefill", "decode"):
        pools[f"{role}_layout"] = {name: layout[f"{role}.{name}"] for name in SEARCHED
                                   if name in named or layout[f"{role}.{name}"] > 1}
    return table


def _times(plan: Plan, percentile: str) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, output tokens/s per GPU): the steady state's, else the static batch's."""
    pool = plan.serving[0]
    state = pool.continuous
    if state is None:
        return plan.prefill_seconds, plan.tpot_seconds, plan.tokens_per_second_per_gpu
    ttft = {"mean": state.ttft_seconds, "p90": state.ttft_p90_seconds,
            "p99": state.ttft_p99_seconds}[percentile]
    return ttft, state.tpot_seconds, state.tokens_per_second_per_gpu


def _rates(plan: Plan) -> tuple[float | None, float | None]:
    """(requests/s served, requests/s sustained at the batch limit) of the pool that
    serves the requests' tokens (the decode pool when disaggregated)."""
    state = plan.serving[-1].continuous
    if state is None:
        return None, None
    return state.request_rate_per_s, state.max_request_rate_per_s


def _score(objective: str, plan: Plan, tpot: float, per_gpu: float, spec: Spec) -> float:
    if objective == "gpus":
        return float(spec.hardware.num_gpus)
    if objective == "tokens_per_second_per_gpu":
        return per_gpu
    if objective == "step_time":
        return tpot
    if objective == "memory":
        return float(plan.total_bytes)
    cost = spec.hardware.gpu_hour_cost
    assert cost is not None
    return cost_per_million_tokens(cost, per_gpu)


def cost_per_million_tokens(gpu_hour_cost: float, tokens_per_second_per_gpu: float) -> float:
    """Dollars per million output tokens: a GPU-hour's price over the tokens one GPU
    serves in that hour."""
    return gpu_hour_cost / 3600 / tokens_per_second_per_gpu * 1e6


def search_serving(session: Session, spec: Spec, objective: str | None = None,
                   top: int | None = None) -> ServingSearchResult:
    """The best layouts of a serving spec (see the module's docstring)."""
    settings = spec.search or Search()
    objective = objective or settings.objective
    if settings.hardware:
        raise SpecError([Problem("$.search.hardware", "compares several machines: search "
                                 "them with llmpar.search.search_hardware (as `llmpar "
                                 "search` does)")], spec.source)
    if objective == "cost" and spec.hardware.gpu_hour_cost is None:
        raise SpecError([Problem("$.hardware.gpu_hour_cost",
                                 "the cost objective needs dollars per GPU-hour")], spec.source)
    problems = [Problem(f"$.search.{key}", "limits training layouts; this spec serves "
                                           "([inference])")
                for key in ("train_seconds_max", "tokens_per_second_min")
                if getattr(settings, key) is not None]
    disaggregated = spec.inference is not None and spec.inference.disaggregated is not None
    if disaggregated and settings.num_gpus is not None:
        problems.append(Problem("$.search.num_gpus", "[inference.disaggregated] states each "
                                                     "pool's GPUs (prefill_gpus, "
                                                     "decode_gpus); give the counts there"))
    if problems:
        raise SpecError(problems, spec.source)
    counts = settings.num_gpus or (spec.hardware.num_gpus,)
    rejected: Counter[str] = Counter()
    found: list[ServingCandidate] = []
    summaries: list[ServingCount] = []
    tried = 0
    for num_gpus in counts:
        sized = spec if num_gpus == spec.hardware.num_gpus else attrs.evolve(
            spec, hardware=attrs.evolve(spec.hardware, num_gpus=num_gpus))
        kept = _search_count(session, sized, settings, objective, disaggregated, rejected)
        summaries.append(ServingCount(num_gpus=num_gpus, tried=kept[0], kept=len(kept[1])))
        tried += kept[0]
        found += kept[1]
    # Ties (every layout serves a request rate at the same throughput) go to the faster
    # token, then the shorter first token.
    sign = -1 if objective in HIGHER_IS_BETTER else 1
    found.sort(key=lambda c: (sign * c.score, c.tpot_seconds, c.ttft_seconds, c.num_gpus))
    stated = (("ttft_seconds_max", settings.ttft_seconds_max),
              ("tpot_seconds_max", settings.tpot_seconds_max))
    limits = {name: float(value) for name, value in stated if value is not None}
    counted = settings.num_gpus is not None
    return ServingSearchResult(objective=objective,
                               results=tuple(found[:top or settings.top]), tried=tried,
                               rejected=dict(rejected), limits=limits,
                               gpu_counts=tuple(summaries) if counted else (),
                               gpus_pareto=tuple(gpus_front(found, objective)) if counted
                               else ())


def _search_count(session: Session, spec: Spec, settings: Search, objective: str,
                  disaggregated: bool, rejected: Counter[str]
                  ) -> tuple[int, list[ServingCandidate]]:
    """(layouts tried, those kept) on the spec's GPU count; the others counted by reason
    in `rejected`."""
    base = spec_to_dict(spec)
    found: list[ServingCandidate] = []
    tried = disaggregated_layouts(spec, settings) if disaggregated else layouts(spec, settings)
    for layout in tried:
        table = _pools_table(base, layout) if disaggregated else _table(base, layout)
        try:
            plan = session.evaluate(table)
        except SpecError as error:
            rejected[f"invalid: {error.problems[0].message}"] += 1
            continue
        ttft, tpot, per_gpu = _times(plan, settings.percentile)
        if not plan.fits:
            rejected["does not fit"] += 1
        elif ttft is None or tpot is None or per_gpu is None:
            rejected["not timed, or overloaded"] += 1
        elif settings.ttft_seconds_max is not None and ttft > settings.ttft_seconds_max:
            rejected["ttft_seconds_max"] += 1
        elif settings.tpot_seconds_max is not None and tpot > settings.tpot_seconds_max:
            rejected["tpot_seconds_max"] += 1
        else:
            served, sustained = _rates(plan)
            replicas = layout.get("decode.data" if disaggregated else "data", 1)
            found.append(ServingCandidate(
                layout={k: v for k, v in layout.items() if v > 1} or {"data": 1},
                score=_score(objective, plan, tpot, per_gpu, spec), ttft_seconds=ttft,
                tpot_seconds=tpot, tokens_per_second_per_gpu=per_gpu,
                total_bytes=plan.total_bytes, table=table,
                num_gpus=_gpus_of(spec), replicas=replicas, request_rate_per_s=served,
                max_request_rate_per_s=sustained))
    return len(tried), found


def _gpus_of(spec: Spec) -> int:
    inference = spec.inference
    if inference is not None and inference.disaggregated is not None:
        return inference.disaggregated.prefill_gpus + inference.disaggregated.decode_gpus
    return spec.hardware.num_gpus


def gpus_front(found: list[ServingCandidate], objective: str) -> list[ServingCandidate]:
    """The best layout of each count (by TPOT, or by cost per token for the cost and
    tokens_per_second_per_gpu objectives: GPUs over tokens per second), kept when it beats
    every layout on fewer GPUs; fewest GPUs first."""
    by_cost = objective in ("cost", "tokens_per_second_per_gpu")

    def value(candidate: ServingCandidate) -> float:
        return (1 / candidate.tokens_per_second_per_gpu if by_cost
                else candidate.tpot_seconds)

    front: list[ServingCandidate] = []
    best = float("inf")
    for candidate in sorted(found, key=lambda c: (c.num_gpus, value(c), c.ttft_seconds)):
        if value(candidate) < best:
            front.append(candidate)
            best = value(candidate)
    return front


def text_report(result: ServingSearchResult) -> str:
    """The ranked layouts as a table."""
    from llmpar.units import format_duration

    lines = [f"Serving layouts by {result.objective} ({len(result.results)} shown, "
             f"{result.tried} tried)"]
    if result.limits:
        lines.append("limits: " + ", ".join(f"{k} = {format_duration(v)}"
                                            for k, v in result.limits.items()))
    counted = bool(result.gpu_counts)
    header = f"  {'rank':>4}  {'layout':<36} {'TTFT':>10} {'TPOT':>10} {'tok/s/GPU':>10} " \
             f"{'GB/GPU':>8}  score"
    lines.append(header + ("  GPUs  replicas  req/s (max)" if counted else ""))
    for rank, c in enumerate(result.results, 1):
        lines.append(_row(f"{rank:>4}", c) + (_capacity(c) if counted else ""))
    if not result.results:
        lines.append("  no layout fits and meets the limits")
    for reason, count in sorted(result.rejected.items()):
        lines.append(f"  set aside: {count} x {reason}")
    if counted:
        lines.append("GPU counts tried ([search] num_gpus): " + ", ".join(
            f"{c.num_gpus} ({c.kept} of {c.tried} kept)" for c in result.gpu_counts))
        by_cost = result.objective in ("cost", "tokens_per_second_per_gpu")
        lines.append("Pareto front: GPUs versus " + ("cost" if by_cost else "TPOT"))
        lines.append(header + "  GPUs  replicas  req/s (max)")
        lines += [_row("", c) + _capacity(c) for c in result.gpus_pareto]
    return "\n".join(lines)


def _row(rank: str, c: ServingCandidate) -> str:
    from llmpar.units import format_duration

    layout = " ".join(f"{k}={v}" for k, v in c.layout.items())
    return (f"  {rank:>4}  {layout:<36} {format_duration(c.ttft_seconds):>10} "
            f"{format_duration(c.tpot_seconds):>10} "
            f"{c.tokens_per_second_per_gpu:>10,.1f} {c.total_bytes / 1e9:>8,.2f}"
            f"  {c.score:,.6g}")


def _capacity(c: ServingCandidate) -> str:
    rate = "-" if c.request_rate_per_s is None else (
        f"{c.request_rate_per_s:,.3g} ({c.max_request_rate_per_s or 0:,.3g})")
    return f"  {c.num_gpus:>4}  {c.replicas:>8}  {rate}"
