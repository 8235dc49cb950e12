"""Predicted against published training throughput: writes docs/validation.md's table,
and the per-family errors every plan quotes (`llmpar.trust`).

    python validation/published_throughput.py > docs/validation-throughput.md
    python validation/published_throughput.py --families specs/validation/step_time.toml

Reads the published rows in validation/published/*.toml (each with its citation),
evaluates each row's spec with llmpar, and prints predicted against reported
teraFLOP/s per GPU with the error per row, counting FLOPs as the source does
(`flops_counted`). A source that reports tokens per second instead gives
`reported_tokens_per_second` (whole job): its teraFLOP/s per GPU are those tokens at
llmpar's FLOPs per token, so the row's error is the step time's. The same rows are a test
(tests/test_published_throughput.py): within 10%, or, for a row whose data file documents
a discrepancy (`expected_error`, `expected_reason`), within that range.

A row that checks one mechanism names it (`mechanism`, for the whole file or one row:
"zero-3", "zero++", "hybrid-sharding", "dualpipe", "tp-comm-overlap", ...): its family is
the GPU, the model kind and that mechanism, kept apart from the GPU's general family that
plans quote. A row measured against the same run without its mechanism names that row
(`baseline`, its label): the report prints the pair's predicted and measured ratio, which
isolates the mechanism from what the two runs share.
"""

from __future__ import annotations

import importlib.metadata
import statistics
import sys
import tomllib
from pathlib import Path

import attrs

import llmpar
from llmpar.loading.reader import merge
from llmpar.trust import model_kind

PUBLISHED = Path(__file__).resolve().parent / "published"


@attrs.frozen
class Row:
    """One published run: its spec, what it reported, and any documented discrepancy."""

    label: str
    reported_tflops_per_gpu: float | None
    """As the source prints it; None where it reports tokens per second instead."""
    spec: dict
    flops_counted: str
    """"hardware" (recomputation included) or "model", as the source counts."""
    expected_error: tuple[float, float] | None = None
    """A documented discrepancy: the range predicted / reported - 1 is held to."""
    expected_reason: str = ""
    reported_tokens_per_second: float | None = None
    """The whole job's tokens per second, where the source reports those."""
    mechanism: str = ""
    """The mechanism the row checks ("" for none): its own validation family."""
    baseline: str = ""
    """The label of the same run without the mechanism, where the source measured both
    ("" for none)."""

    def reported(self, plan: llmpar.Plan) -> float:
        """Reported teraFLOP/s per GPU: as printed, or the reported tokens per second at
        the plan's FLOPs per token (counted as `flops_counted` says)."""
        if self.reported_tflops_per_gpu is not None:
            return self.reported_tflops_per_gpu
        assert self.reported_tokens_per_second is not None, self.label
        flops = (plan.hardware_flops_per_step if self.flops_counted == "hardware"
                 else plan.flops_per_step)
        per_token = flops / plan.training.tokens_per_step
        return per_token * self.reported_tokens_per_second / plan.num_gpus / 1e12


def rows(path: Path) -> list[Row]:
    """The rows of one published table."""
    data = tomllib.loads(path.read_text())
    counted = data.get("flops_counted", "hardware")
    found = []
    for row in data["rows"]:
        expected = row.get("expected_error")
        found.append(Row(label=row["label"],
                         reported_tflops_per_gpu=row.get("reported_tflops_per_gpu"),
                         reported_tokens_per_second=row.get("reported_tokens_per_second"),
                         spec=merge(data["base"], row["spec"]), flops_counted=counted,
                         expected_error=None if expected is None else tuple(expected),
                         expected_reason=row.get("expected_reason", ""),
                         mechanism=row.get("mechanism", data.get("mechanism", "")),
                         baseline=row.get("baseline", "")))
    return found


def predicted_tflops_per_gpu(plan: llmpar.Plan, flops_counted: str = "hardware") -> float:
    """What the source reports: hardware FLOPs (recomputation included) or model FLOPs
    per GPU-second, over the modelled step time."""
    flops = plan.hardware_flops_per_step if flops_counted == "hardware" else plan.flops_per_step
    return flops / plan.num_gpus / plan.step_seconds / 1e12


def family_of(spec: llmpar.Spec, mechanism: str = "") -> str:
    """The validation family of a run: its GPU and its model's kind, as plans name it,
    and the mechanism it checks, if any."""
    parts = [spec.hardware.gpu.name, model_kind(spec.model)]
    return "/".join(parts + [mechanism] if mechanism else parts)


def family_errors() -> dict[str, list[float]]:
    """Every published row's error (predicted / reported - 1), by family."""
    found: dict[str, list[float]] = {}
    for path in sorted(PUBLISHED.glob("*.toml")):
        for row in rows(path):
            spec = llmpar.load_spec(row.spec)
            plan = llmpar.evaluate(spec)
            error = predicted_tflops_per_gpu(plan, row.flops_counted) / row.reported(plan)
            found.setdefault(family_of(spec, row.mechanism), []).append(error - 1)
    return found


def families_toml() -> str:
    """The per-family summary shipped in the wheel, as TOML."""
    lines = ["# Generated by `python validation/published_throughput.py --families "
             "specs/validation/step_time.toml`; do not edit.",
             "# Step time against published training runs (validation/published/), by GPU and",
             "# model kind (and the mechanism a family of rows checks): the runs' count and",
             "# their median and largest |error|.", ""]
    for family, errors in sorted(family_errors().items()):
        sizes = sorted(abs(e) for e in errors)
        gpu, kind, *mechanism = family.split("/")
        lines += ["[[family]]", f'gpu = "{gpu}"', f'kind = "{kind}"']
        lines += [f'mechanism = "{m}"' for m in mechanism]
        lines += [f"runs = {len(errors)}",
                  f"median_abs_error = {statistics.median(sizes):.3f}",
                  f"worst_abs_error = {sizes[-1]:.3f}", ""]
    return "\n".join(lines)


def pair_ratios(found: list[Row]) -> list[tuple[Row, float, float]]:
    """Each row that names its `baseline`, with its predicted and measured throughput
    over the baseline's (the step-time ratio of the pair, without over with)."""
    by_label = {row.label: row for row in found}
    pairs = []
    for row in found:
        if not row.baseline:
            continue
        base = by_label[row.baseline]
        plans = [llmpar.evaluate(r.spec) for r in (row, base)]
        predicted = (predicted_tflops_per_gpu(plans[0], row.flops_counted)
                     / predicted_tflops_per_gpu(plans[1], base.flops_counted))
        pairs.append((row, predicted, row.reported(plans[0]) / base.reported(plans[1])))
    return pairs


def _print_pairs(found: list[Row]) -> None:
    pairs = pair_ratios(found)
    if not pairs:
        return
    print("With against without the mechanism (the same run measured both ways):\n")
    print("| run | against | predicted ratio | measured ratio |")
    print("|---|---|---:|---:|")
    for row, predicted, measured in pairs:
        print(f"| {row.label} | {row.baseline} | {predicted:.3f} | {measured:.3f} |")
    print()


def main() -> int:
    if sys.argv[1:2] == ["--families"]:
        Path(sys.argv[2]).write_text(families_toml(), encoding="utf-8")
        return 0
    print("# Predicted against published training throughput\n")
    print("Generated by `python validation/published_throughput.py` with llmpar "
          f"{importlib.metadata.version('llmpar')}. Predicted: hardware FLOPs per step "
          "(recomputation included) or model FLOPs per step, as each source counts, / (GPUs "
          "x modelled step time).\n")
    print("Each GPU's one calibrated number, its preset's `matmul_efficiency`, was fitted "
          "once to all the rows of that GPU (A100: the 20 rows of Narayanan et al., "
          "Korthikanti et al. and BLOOM; H100: the 10 dgxc-benchmarking rows), to the "
          "smallest largest error; everything else (bubble, the slowest pipeline stage, "
          "exposed communication, what products lose to their shapes, elementwise traffic, "
          "optimizer step) is modelled, and the product time law is checked on measured "
          "GEMMs (validation/published/gemm/), so the spread of the errors across rows is "
          "what the mechanisms leave unexplained. The A100 rows span three code bases "
          "(Megatron-LM 2021 and 2022, Megatron-DeepSpeed) whose data files state what each "
          "overlapped.\n")
    notes: dict[str, int] = {}
    for path in sorted(PUBLISHED.glob("*.toml")):
        table = tomllib.loads(path.read_text())
        print(f"## {table['source']}\n")
        if table.get("mechanism"):
            print(f"Mechanism checked: `{table['mechanism']}` (its own validation family).\n")
        print("| model | GPUs | layout | reported TFLOP/s/GPU | predicted | error | compute s "
              "| exposed comm s | bubble s | step s |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows(path):
            plan = llmpar.evaluate(row.spec)
            value = predicted_tflops_per_gpu(plan, row.flops_counted)
            reported = row.reported(plan)
            layout = " ".join(f"{k[0].upper()}P{v}" for k, v in plan.layout.items() if v > 1)
            mark = ""
            if row.expected_error is not None:
                number = notes.setdefault(row.expected_reason, len(notes) + 1)
                mark = f" †{number}"
            printed = row.reported_tflops_per_gpu is not None
            shown = f"{reported}" if printed else f"{reported:.1f}*"
            print(f"| {row.label} | {plan.num_gpus} | {layout} | {shown} | {value:.1f} | "
                  f"{value / reported - 1:+.1%}{mark} | {plan.compute_seconds:.2f} | "
                  f"{plan.exposed_communication_seconds:.2f} | {plan.bubble_seconds:.2f} | "
                  f"{plan.step_seconds:.2f} |")
        print()
        _print_pairs(rows(path))
    print("Reported values marked * are the source's tokens per second at llmpar's FLOPs per "
          "token (the source prints no TFLOP/s), so their error is the step time's.\n")
    if notes:
        print("## Documented discrepancies (rows marked †)\n")
        print("These rows are outside 10%; their data files say why, and "
              "tests/test_published_throughput.py holds each to its documented range, so a "
              "change to the model that moves them is seen.\n")
        for reason, number in notes.items():
            print(f"{number}. {reason}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
