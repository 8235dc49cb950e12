"""Modelled step time against published training throughput (docs/validation-throughput.md).

Each row of validation/published/*.toml is a real run with its citation; llmpar must
predict its teraFLOP/s per GPU (FLOPs counted as the source counts them) within 10%.
A row whose data file documents a discrepancy (`expected_error = [low, high]` with its
`expected_reason`) is held to that range instead, so that the gap stays visible and a
change to the model that moves it fails here until the data file says why.
"""

from __future__ import annotations

import attrs
import pytest
from validation_scripts import load_script

import llmpar

TOLERANCE = 0.10

report = load_script("published_throughput")
ROWS = [(path.stem, row) for path in sorted(report.PUBLISHED.glob("*.toml"))
        for row in report.rows(path)]


@pytest.mark.parametrize(("table", "row"), ROWS, ids=[f"{t}-{r.label}" for t, r in ROWS])
def test_predicted_throughput(table, row):
    plan = llmpar.evaluate(row.spec)
    assert plan.time_model == "modelled"
    error = report.predicted_tflops_per_gpu(plan, row.flops_counted) / row.reported(plan) - 1
    if row.expected_error is None:
        assert abs(error) <= TOLERANCE, f"{error:+.1%}"
    else:
        low, high = row.expected_error
        assert low <= error <= high, (
            f"{error:+.1%} left the documented range [{low:+.0%}, {high:+.0%}] "
            f"({row.expected_reason}): update the data file if the model changed")


def test_documented_discrepancies_are_discrepancies():
    """A documented range must lie at least partly outside the tolerance, and few rows
    of the general families (those plans quote) may carry one: the rest is what the model
    is held to. Rows that check one mechanism are counted apart: their gaps are what the
    mechanism's family reports."""
    marked = [row for _, row in ROWS if row.expected_error is not None]
    for row in marked:
        low, high = row.expected_error
        assert row.expected_reason and (low < -TOLERANCE or high > TOLERANCE), row.label
    general = [row for _, row in ROWS if not row.mechanism]
    assert len([row for row in general if row.expected_error is not None]) <= len(general) // 3


def test_mechanism_rows_form_their_own_families_and_plans_quote_the_general_one():
    """A row naming a mechanism lands in a family of its GPU, kind and mechanism, which
    the shipped file lists with the mechanism; a plan's trust line quotes the general
    family of its GPU and kind, not a mechanism's."""
    from llmpar.trust import load_families, step_time_trust

    families = load_families()
    mechanisms = {f.mechanism for f in families if f.mechanism}
    assert {"zero-3", "zero++", "hybrid-sharding", "dualpipe", "tp-comm-overlap",
            "activation-offload"} <= mechanisms
    counted = sum(f.runs for f in families)
    assert counted == len(ROWS)
    h100_moe = [f for f in families if (f.gpu, f.kind) == ("h100-sxm", "moe")]
    general = next(f for f in h100_moe if not f.mechanism)
    spec = llmpar.load_spec(next(r for _, r in ROWS if r.mechanism == "hybrid-sharding").spec)
    line = step_time_trust(spec, "modelled", families)
    assert line.startswith(f"within {general.worst_abs_error:.0%} (median "
                           f"{general.median_abs_error:.0%}) of {general.runs} published moe")
    # V100 has mechanism rows only: its plans still say no general run checks them
    v100 = llmpar.load_spec(next(r for t, r in ROWS
                                 if r.mechanism == "zero-3" and t.startswith("zeropp")).spec)
    assert step_time_trust(v100, "modelled", families).startswith("no published run on v100")


def test_a_rows_mechanism_is_one_its_plans_transforms_state():
    """The names rows give their mechanism are the ones strategies state
    (`Transform.mechanisms`), so a plan that runs one finds the rows that check it; and
    its trust line quotes that family beside the general one."""
    from llmpar.trust import load_families

    families = {(f.gpu, f.kind, f.mechanism): f for f in load_families()}
    for _, row in ROWS:
        if not row.mechanism:
            continue
        spec = llmpar.load_spec(row.spec)
        plan = llmpar.evaluate(spec)
        f = families[(spec.hardware.gpu.name, report.model_kind(spec.model), row.mechanism)]
        assert (f"{row.mechanism}: within {f.worst_abs_error:.0%} (median "
                f"{f.median_abs_error:.0%}) of its {f.runs} published") in (
            plan.training.step_time_trust), row.label


TRAINING_MECHANISMS = {"activation-offload": "activation_offload_layers"}
"""Mechanisms that are a `[training]` setting rather than a layout's: the key a pair's
training may differ in."""


def test_a_pair_differs_from_its_baseline_in_its_mechanism_alone():
    """A row measured against the same run without its mechanism (`baseline`) names a row
    of its own file on the same model, GPUs and batch (its training the same but for the
    mechanism's own setting, where that is a training one); its plan runs the mechanism
    and the baseline's does not; and the pair's predicted ratio moves the step the way the
    measured one does (report.pair_ratios)."""
    paired = [(table, row) for table, row in ROWS if row.baseline]
    assert paired
    for table, row in paired:
        (base,) = [r for t, r in ROWS if t == table and r.label == row.baseline]
        spec, base_spec = llmpar.load_spec(row.spec), llmpar.load_spec(base.spec)
        assert spec.model == base_spec.model and spec.hardware == base_spec.hardware
        key = TRAINING_MECHANISMS.get(row.mechanism)
        training = base_spec.training if key is None else attrs.evolve(
            base_spec.training, **{key: getattr(spec.training, key)})
        assert spec.training == training
        plan, base_plan = llmpar.evaluate(spec), llmpar.evaluate(base_spec)
        assert row.mechanism in plan.training.step_time_trust
        assert f"{row.mechanism}: within" not in base_plan.training.step_time_trust
    for row, predicted, measured in report.pair_ratios([r for _, r in paired] + [
            r for t, r in ROWS if any(r.label == p.baseline for _, p in paired)]):
        assert (predicted - 1) * (measured - 1) > 0, row.label


def test_a_mechanism_checked_elsewhere_says_where():
    example = report.PUBLISHED.parent.parent / "specs" / "examples"
    plan = llmpar.evaluate(example / "llama-3-70b-zeropp-512-h100.toml")
    line = plan.training.step_time_trust
    assert "zero++: checked only on other runs: 4 dense on v100-sxm2-32gb" in line
    # ZeRO-3 on H100: torchtitan's FSDP2 x TP8 runs without AsyncTP (bf16 and Float8)
    # check it there
    assert "zero-3: within" in line and "of its 2 published dense runs on h100-sxm" in line
    # ZeRO-3 on A100: torchtitan's FSDP2 runs over 64 A100 check it there; ZeRO++ still
    # rests on V100 alone
    a100 = llmpar.evaluate(example / "llama-3-70b-zeropp-512-h100.toml",
                           {"hardware.cluster": "dgx-a100"}).training.step_time_trust
    assert "zero-3: within" in a100 and "published dense runs on a100-sxm-80gb" in a100
    assert "zero++: checked only on other runs: 4 dense on v100-sxm2-32gb" in a100
    dense = llmpar.evaluate(example / "gpt3-175b-1024-a100.toml").training.step_time_trust
    assert ";" not in dense  # no mechanism that rows check on their own


def test_the_shipped_validation_families_match_the_rows():
    """specs/validation/step_time.toml, which every plan's step_time_trust quotes, is what
    the rows give today (regenerate it with the script's --families when this fails)."""
    from llmpar.loading.presets import builtin_specs_dir
    from llmpar.trust import FAMILIES_FILE

    shipped = (builtin_specs_dir() / FAMILIES_FILE).read_text(encoding="utf-8")
    assert shipped == report.families_toml()


def test_a_plan_quotes_its_familys_error_or_what_its_gpu_rests_on():
    from llmpar.trust import load_families

    h100 = next(f for f in load_families() if (f.gpu, f.kind) == ("h100-sxm", "dense"))
    example = report.PUBLISHED.parent.parent / "specs" / "examples"
    plan = llmpar.evaluate(example / "llama-3-8b-fsdp-8-h100.toml")
    assert plan.training.step_time_trust.startswith(
        f"within {h100.worst_abs_error:.0%} (median {h100.median_abs_error:.0%}) of "
        f"{h100.runs} published dense training runs on h100-sxm")
    b200 = llmpar.evaluate(example / "llama-3-8b-fsdp-8-h100.toml",
                           {"hardware.cluster": "dgx-b200"})
    assert b200.training.step_time_trust.startswith("no published run on b200")
    assert "expect +-15%" in b200.training.step_time_trust
    moe = llmpar.evaluate(example / "mixtral-8x7b-ep8-a100.toml")
    assert moe.training.step_time_trust.startswith("no published moe run on a100-sxm-80gb")
    assumed = llmpar.evaluate(example / "llama-3-8b-fsdp-8-h100.toml", {"training.mfu": 0.4})
    assert assumed.training.step_time_trust.startswith("assumed MFU, not modelled")


def test_the_readme_counts_the_runs_the_families_hold():
    """The README's summary of the validation states the families' own counts: the runs in
    all, the dense runs of the calibrated stacks (no mechanism of their own) and the
    mixture-of-experts runs."""
    import re
    import tomllib
    from pathlib import Path

    from llmpar.loading.presets import builtin_specs_dir
    from llmpar.trust import FAMILIES_FILE

    families = tomllib.loads((builtin_specs_dir() / FAMILIES_FILE).read_text(encoding="utf-8"))
    runs = [(f["kind"], f.get("mechanism"), f["runs"]) for f in families["family"]]
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    stated = re.search(r"checked against (\d+) published runs.*?the (\d+) dense runs.*?of "
                       r"(\d+) mixture-of-experts runs", readme)
    assert stated, "the README's validation sentence changed its form"
    assert int(stated[1]) == sum(n for _, _, n in runs)
    assert int(stated[2]) == sum(n for kind, mech, n in runs if kind == "dense" and not mech)
    assert int(stated[3]) == sum(n for kind, mech, n in runs if kind == "moe" and not mech)
