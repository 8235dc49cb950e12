"""Predicted against published serving runs: writes docs/validation-serving.md.

    python validation/published_serving.py > docs/validation-serving.md

Reads the run-level serving rows in validation/published/serving/*.toml (each file with
its citation and the assumptions its rows make), evaluates each row's spec with llmpar and
prints predicted against measured output (decode) or input (prefill) tokens per second per
GPU, with the error per row. These rows are validation only: no constant of llmpar is
fitted to them (tests/test_published_serving.py checks the page is current).

- prefill: the prompts of a step over its time, `batch x prompt / prefill_seconds` per
  replica, over the replica's GPUs;
- decode: `batch / tpot_seconds` per replica, over the replica's GPUs.

A second table splits each row's predicted step (the prefill, or one decode step) into
what its parts cost on the critical path, beside the step the measurement implies (the
same relation read backwards: `batch x prompt / measured` or `batch / measured`, per GPU
of a replica): the products that read the weights (projections, MLPs, experts, router,
output layer), the attention kernel, the elementwise passes (norms, the engine's
activation, quantization and permutation kernels, MLA decode's latent norms and rotary
embedding, DeepEP's low-latency send and receive kernels, the embedding lookup), the slowdown
two-batch overlap adds (the SMs the communication kernels take, the lockstep schedule's
waits), the exposed collectives, and the engine's host time.
"""

from __future__ import annotations

import importlib.metadata
import statistics
import tomllib
from pathlib import Path

import attrs

import llmpar
from llmpar.inference.evaluate import serving_of, timing_of
from llmpar.loading.checks import resolve_layout
from llmpar.loading.reader import merge
from llmpar.roofline import seconds

PUBLISHED = Path(__file__).resolve().parent / "published" / "serving"


@attrs.frozen
class Row:
    """One published serving measurement: its spec and what it measured."""

    source: str
    label: str
    phase: str
    """"prefill" (input tokens per second) or "decode" (output tokens per second)."""
    measured_tokens_per_second_per_gpu: float
    spec: dict


def rows(path: Path) -> list[Row]:
    """The rows of one published file (its `source` names the publication)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [Row(source=data["source"], label=row["label"], phase=row["phase"],
                measured_tokens_per_second_per_gpu=row["measured_tokens_per_second_per_gpu"],
                spec=merge(data["base"], row["spec"])) for row in data["rows"]]


def all_rows() -> list[tuple[str, Row]]:
    return [(path.name, row) for path in sorted(PUBLISHED.glob("*.toml")) for row in rows(path)]


def predicted_tokens_per_second_per_gpu(plan: llmpar.Plan, phase: str,
                                        prompt_tokens: int) -> float | None:
    """Input (prefill) or output (decode) tokens per second per GPU of the plan's pool."""
    pool = plan.serving[0]
    gpus_per_replica = pool.num_gpus / pool.layout.get("data", 1)
    if phase == "prefill":
        if pool.prefill_seconds is None:
            return None
        return pool.batch_size * prompt_tokens / pool.prefill_seconds / gpus_per_replica
    if pool.tpot_seconds is None:
        return None
    return pool.batch_size / pool.tpot_seconds / gpus_per_replica


ELEMENTWISE = ("norms and residuals", "embedding")
ELEMENTWISE_WORDS = ("activation", "quantization", "permutation", "rotary", "exchange")
PARTS = ("products", "attention", "elementwise", "overlap", "collectives", "host")


def part_of(name: str) -> str:
    """Which part of the step an operation's time belongs to."""
    if name in ELEMENTWISE or any(word in name for word in ELEMENTWISE_WORDS):
        return "elementwise"
    if (name.startswith("attention") and name != "attention projections") or name in (
            "indexer",) or name.endswith(" scan"):
        return "attention"
    return "products"


def step_parts(spec: llmpar.Spec, phase: str) -> dict[str, float]:
    """Seconds of each part of the row's predicted step (`PARTS`)."""
    session = llmpar.Session(load_entry_points=False)
    layout, _ = resolve_layout(spec, session.strategies)
    serving = serving_of(spec, layout, session.strategies)
    timing = timing_of(serving)
    result = timing.prefill if phase == "prefill" else timing.decode
    parts = dict.fromkeys(PARTS, 0.0)
    for op in result.operations:
        parts[part_of(op.name)] += seconds(op, timing.rates)
    shown = result.phase
    ops = sum(parts.values())
    parts["overlap"] = shown.compute_seconds + shown.memory_seconds - ops
    parts["collectives"] = shown.communication_seconds
    parts["host"] = shown.overhead_seconds
    return parts


def measured_step_seconds(row: Row, spec: llmpar.Spec, plan: llmpar.Plan) -> float:
    """The step the measured tokens per second per GPU imply (the module's relation)."""
    pool = plan.serving[0]
    inference = spec.inference
    assert inference is not None
    gpus_per_replica = pool.num_gpus / pool.layout.get("data", 1)
    tokens = (pool.batch_size * inference.prompt_tokens if row.phase == "prefill"
              else pool.batch_size)
    return tokens / (row.measured_tokens_per_second_per_gpu * gpus_per_replica)


def print_decomposition(evaluated: list[tuple[Row, llmpar.Spec, llmpar.Plan]]) -> None:
    print("## Where the predicted step goes\n")
    print("Milliseconds of each row's predicted step (the prefill, or one decode step) by "
          "part, on the critical path, against the step its measurement implies; gap = "
          "measured - predicted (positive: llmpar is faster).\n")
    print("| run | phase | products | attention | elementwise | overlap | collectives | "
          "host | predicted | measured | gap |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row, spec, plan in evaluated:
        parts = step_parts(spec, row.phase)
        predicted = sum(parts.values())
        measured = measured_step_seconds(row, spec, plan)
        cells = " | ".join(f"{parts[name] * 1e3:,.1f}" for name in PARTS)
        print(f"| {row.label} | {row.phase} | {cells} | {predicted * 1e3:,.1f} | "
              f"{measured * 1e3:,.1f} | {(measured - predicted) * 1e3:+,.1f} |")
    print()


def main() -> int:
    version = importlib.metadata.version("llmpar")
    print("# Predicted against published serving runs\n")
    print(f"Generated by `python validation/published_serving.py` with llmpar {version}; do "
          "not edit. Each row is a run-level measurement from a source that is not held out "
          "(DEVELOPERS.md), committed under `validation/published/serving/` with its "
          "citation and the assumptions its spec makes. Nothing is fitted to these rows. "
          "Error = predicted / measured - 1 (positive: llmpar is faster).\n")
    errors = []
    evaluated = []
    current = None
    for name, row in all_rows():
        if row.source != current:
            if current is not None:
                print()
            current = row.source
            print(f"## {row.source}\n")
            print(f"`validation/published/serving/{name}` (citation and assumptions)\n")
            print("| run | phase | GPUs | layout | measured tokens/s/GPU | predicted | error | "
                  "fits | bound |")
            print("|---|---|---:|---|---:|---:|---:|---|---|")
        spec = llmpar.load_spec(row.spec)
        assert spec.inference is not None
        plan = llmpar.evaluate(spec)
        evaluated.append((row, spec, plan))
        value = predicted_tokens_per_second_per_gpu(plan, row.phase,
                                                    spec.inference.prompt_tokens)
        pool = plan.serving[0]
        layout = " x ".join(f"{k} {v}" for k, v in pool.layout.items() if v > 1)
        phase = pool.phases[0 if row.phase == "prefill" else 1] if pool.phases else None
        if value is None:
            shown, error_text = "-", "-"
        else:
            error = value / row.measured_tokens_per_second_per_gpu - 1
            errors.append(error)
            shown, error_text = f"{value:,.0f}", f"{error:+.1%}"
        print(f"| {row.label} | {row.phase} | {plan.num_gpus} | {layout} | "
              f"{row.measured_tokens_per_second_per_gpu:,.0f} | {shown} | {error_text} | "
              f"{'yes' if plan.fits else 'no'} | {phase.bound if phase else '-'} |")
    print()
    if errors:
        sizes = sorted(abs(e) for e in errors)
        print(f"{len(errors)} rows: median |error| {statistics.median(sizes):.1%}, worst "
              f"{sizes[-1]:.1%}; {sum(e > 0 for e in errors)} faster than measured.")
        print()
    print_decomposition(evaluated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
