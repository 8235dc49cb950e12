"""Reports (text, Markdown, JSON, rich), the JSON field documentation, and the
`presets`, `evaluate --format` and `diff` commands."""

from __future__ import annotations

import io
import json
import re
import typing
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.plan import (
    CollectiveCost,
    Derivation,
    Plan,
    SavedTensorRow,
    ServingPool,
    StageMemory,
    StrategyNote,
    TrainingPart,
)
from llmpar.plan_json import KEYS
from llmpar.report import markdown_report, print_report, render, report_warnings, text_report
from llmpar.report.diff import plan_differences
from llmpar.report.fields import format_size, format_value
from llmpar.report.tables import bar
from llmpar.units import GB, GiB

SESSION = llmpar.Session(load_entry_points=False)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "json-schema.md"


def example(name: str) -> str:
    return str(SESSION.presets.path("examples", name))


@pytest.fixture(scope="module")
def plan() -> Plan:
    """Qwen3-4B, one H100: fits at 70.02 GB of 80 GB."""
    return SESSION.evaluate(example("qwen3-4b-activations"))


def staged(plan: Plan) -> Plan:
    """`plan` with a modelled step time, two collectives and four pipeline stages."""
    stages = tuple(StageMemory(
        stage=i, layers=9, weights_bytes=2 * GiB, gradients_bytes=2 * GiB,
        optimizer_bytes=12 * GiB, activations_bytes=(4 - i) * 5 * GiB, buffers_bytes=0,
        total_bytes=(16 + (4 - i) * 5) * GiB, micro_batches_in_flight=4 - i) for i in range(4))
    collectives = (
        CollectiveCost(strategy="data", operation="all-reduce", buffer_bytes=8 * GB,
                       group_size=8, tier="inter-node", calls_per_step=1, seconds=0.35,
                       exposed_seconds=0.05),
        CollectiveCost(strategy="tensor", operation="all-gather", buffer_bytes=21 * 10**6,
                       group_size=4, tier="intra-node", calls_per_step=144, seconds=0.9,
                       exposed_seconds=0.9))
    return plan.evolve(
        time_model="modelled", compute_seconds=0.8, communication_seconds=1.25,
        exposed_communication_seconds=0.95, bubble_fraction=0.375, bubble_seconds=0.3,
        optimizer_seconds=0.02, step_seconds=2.07, collectives=collectives, stages=stages,
        peak_stage=0, warnings=())


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def rows_named(text: str, name: str) -> list[str]:
    """Table rows whose first cell (after the mark column) is `name`."""
    return [line for line in text.splitlines() if line[2:].split()[:1] == [name]]


def test_memory_rows_give_gb_gib_share_and_bar(plan):
    # weights: 4,022,468,096 parameters x 2 bytes = 8.04 GB = 7.49 GiB, 9.4% of the
    # 81,559 MiB (85.52 GB) an H100 reports
    text = text_report(plan)
    (weights,) = lines_with(text, "weights   ")
    assert "8.04" in weights and "7.49" in weights and "9.4%" in weights
    assert bar(plan.weights_bytes / plan.capacity_bytes) in weights
    (total,) = [line for line in text.splitlines() if line.startswith("* total")]
    assert "70.02" in total and "81.9%" in total
    assert "fits: 81.9% of capacity" in text


def test_bar_fills_by_share_and_flags_overflow():
    assert bar(0.5, width=10) == "#####....."
    assert bar(1.4, width=10) == "##########>"
    assert bar(0.0, width=4) == "...."


def test_sections_absent_when_plan_has_none(plan):
    assumed = SESSION.evaluate(example("qwen3-4b-activations"),
                               overrides={"training.mfu": 0.4})
    assert assumed.time_model == "assumed-mfu"
    assert "Step time" not in text_report(assumed)  # no breakdown to show
    text = text_report(plan)
    assert "Collectives" not in text
    assert "pipeline stage" not in text


def test_collectives_table(plan):
    text = text_report(staged(plan))
    (data,) = lines_with(text, "all-reduce")
    for cell in ("data", "inter-node", "8.00 GB", " 8 ", "350.00 ms", "50.00 ms"):
        assert cell in data
    (tensor,) = lines_with(text, "all-gather")
    for cell in ("tensor", "intra-node", "21.00 MB", "144", "900.00 ms"):
        assert cell in tensor
    (total,) = [line for line in text.splitlines() if line.startswith("* total ")
                and "ms" in line]
    assert "1.25 s" in total and "950.00 ms" in total  # 0.35 + 0.9; 0.05 + 0.9


def test_time_breakdown_adds_up_to_the_step(plan):
    text = text_report(staged(plan))
    section = text[text.index("Step time"):].split("\n\n")[0]
    assert "800.00 ms" in section and "38.6%" in section  # 0.8 / 2.07
    assert "950.00 ms" in section and "45.9%" in section
    assert "300.00 ms" in section and "20.00 ms" in section
    assert re.search(r"\* = step\s+2.07 s\s+100.0%", section)


def test_stage_table_marks_the_peak(plan):
    text = text_report(staged(plan).evolve(peak_stage=2))
    section = text[text.index("Memory per pipeline stage"):].split("\n\n")[0]
    marked = [line for line in section.splitlines() if line.startswith("* ")]
    assert len(marked) == 1 and marked[0].split()[1] == "2"
    # stage 2: 2 + 2 + 12 + 10 GiB = 26 GiB = 27.92 GB
    assert "26.00" in marked[0] and "27.92" in marked[0]
    assert "* peak: stage 2" in section


def test_single_stage_shows_no_stage_table(plan):
    one = staged(plan).evolve(stages=staged(plan).stages[:1])
    assert "Memory per pipeline stage" not in text_report(one)


def test_warnings_bubble_and_exposed_communication(plan):
    found = report_warnings(staged(plan))
    assert any("bubble is 37.5%" in w for w in found)
    assert any("exposed communication (950.00 ms) exceeds compute (800.00 ms)" in w
               for w in found)
    calm = staged(plan).evolve(bubble_fraction=0.2, exposed_communication_seconds=0.8)
    assert report_warnings(calm) == ()


def test_warning_does_not_fit_once(plan):
    tight = attrs.evolve(plan, fits=False, warnings=())
    assert [w for w in report_warnings(tight) if w.startswith("does not fit")] == [
        f"does not fit: needs {plan.total_bytes / GiB:,.2f} GiB per GPU, has 79.65 GiB"]
    said = attrs.evolve(plan, fits=False, warnings=("does not fit: already said",))
    assert report_warnings(said) == ("does not fit: already said",)
    assert "DOES NOT FIT" in text_report(tight)


def test_markdown_tables_are_well_formed(plan):
    text = markdown_report(staged(plan))
    for title in ("### Memory per GPU", "### Compute", "### Step time", "### Collectives",
                  "### Memory per pipeline stage", "### Warnings"):
        assert title in text
    assert "| **total** | **70.02** | **65.21** | **81.9%** |" in text
    for block in text.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len({line.count("|") for line in rows}) <= 1, block


def test_render_json_is_the_plan_dict(plan):
    assert json.loads(render(plan, "json")) == json.loads(json.dumps(plan.to_dict()))


def test_print_report_is_plain_when_not_a_terminal(plan):
    stream = io.StringIO()
    print_report(plan, "text", stream)
    assert stream.getvalue() == text_report(plan) + "\n"


def test_rich_rendering(plan):
    pytest.importorskip("rich")
    from rich.console import Console

    from llmpar.report.terminal import print_rich

    stream = io.StringIO()
    print_rich(staged(plan), Console(file=stream, force_terminal=True, width=160,
                                     color_system=None))
    out = stream.getvalue()
    assert "Memory per GPU" in out and "70.02" in out and "65.21" in out
    assert "all-gather" in out and "Step time" in out and "█" in out


def test_format_value_units():
    assert format_value("total_bytes", 80 * GB) == "80.00 GB / 74.51 GiB"
    assert format_value("step_seconds", 90.0) == "1.50 minutes"
    assert format_value("mfu", 0.4) == "40.0%"
    assert format_value("flops_per_step", 1.5e18) == "1.5e+18 FLOP"
    assert format_value("parameters", 7e9) == "7.00B"
    assert format_value("num_gpus", 64) == "64"
    assert format_value("activations_bytes", None) == "-"
    assert format_size(21 * 10**6) == "21.00 MB"


# --- the JSON documentation cannot drift from the code ---------------------------------

def _documented(section: str) -> set[str]:
    text = DOCS.read_text()
    match = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/json-schema.md has no '## {section}' section"
    return set(re.findall(r"^\| `(\w+)` \|", match.group(1), re.M))


def record_classes() -> list[type]:
    """Plan and every attrs class its fields hold (its parts, collectives, stages, ...)."""
    found: list[type] = [Plan]
    for cls in found:
        for hint in typing.get_type_hints(cls).values():
            found += [arg for arg in (hint, *typing.get_args(hint))
                      if isinstance(arg, type) and attrs.has(arg) and arg not in found]
    return found


def test_record_classes_are_found():
    assert {SavedTensorRow, CollectiveCost, StageMemory, Derivation, TrainingPart, ServingPool,
            StrategyNote} <= set(record_classes())


def _keys(cls: type) -> set[str]:
    """The JSON keys of a record: a Plan's are schema 1's and its parts'."""
    return set(KEYS) if cls is Plan else {field.name for field in attrs.fields(cls)}


@pytest.mark.parametrize("cls", record_classes(), ids=lambda cls: cls.__name__)
def test_every_field_is_documented(cls):
    fields = _keys(cls)
    documented = _documented(cls.__name__)
    assert fields - documented == set(), f"undocumented {cls.__name__} fields"
    assert documented - fields == set(), f"documented fields {cls.__name__} lacks"


def test_documented_schema_version_matches(plan):
    assert f"(now {plan.schema_version})" in DOCS.read_text()


# --- commands -------------------------------------------------------------------------

def test_evaluate_formats(capsys):
    assert main(["evaluate", example("adam-memory-7b"), "--format", "json"]) == 0
    as_json = capsys.readouterr().out
    assert main(["evaluate", example("adam-memory-7b"), "--json"]) == 0
    assert capsys.readouterr().out == as_json
    assert json.loads(as_json)["total_bytes"] == 16 * 7 * 10**9
    assert main(["evaluate", example("adam-memory-7b"), "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "| **total** | **112.00** | **104.31** |" in markdown  # 7B x 16 B; / 2^30


def test_presets_table_has_key_numbers(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    (adam_8bit,) = rows_named(out, "adam-8bit")
    assert "6.004 B/param" in adam_8bit and "Dettmers" in adam_8bit
    (h100,) = rows_named(out, "h100-sxm")
    assert "80.00 GB / 74.51 GiB" in h100 and "989 TFLOP/s bf16" in h100
    (llama,) = rows_named(out, "llama-2-7b")
    assert "6.74B" in llama  # counted from the architecture
    (fp32_grads,) = rows_named(out, "adam-fp32-grads")
    assert "fp32 gradients" in fp32_grads
    (dgx,) = rows_named(out, "dgx-h100")
    assert "8 x h100-sxm per node; 450 GB/s in, 50 GB/s across" in dgx  # 400 Gb/s = 50 GB/s


def test_presets_show_prints_the_toml(capsys):
    assert main(["presets", "show", "lion"]) == 0
    out = capsys.readouterr().out
    assert "optimizer preset 'lion'" in out and "[[states]]" in out and "2302.06675" in out


def test_presets_show_unknown_name_suggests(capsys):
    assert main(["presets", "show", "adamm"]) == 2
    assert "did you mean 'adam'" in capsys.readouterr().err


def test_presets_show_labels_each_kind(tmp_path, capsys):
    folder = tmp_path / "specs"
    for kind in ("models", "optimizers"):
        (folder / kind).mkdir(parents=True)
        (folder / kind / "twin.toml").write_text(f'source = "a {kind} twin"\n')

    class Presets:
        @staticmethod
        @llmpar.hookimpl
        def llmpar_register_presets(register):
            register(folder)

    from llmpar.cli.presets import show

    session = llmpar.Session(load_entry_points=False, plugins=[Presets()])
    assert show(session, "twin", ("models", "optimizers")) == 0
    out = capsys.readouterr().out
    assert "# model preset 'twin'" in out and "# optimizer preset 'twin'" in out
    assert "a models twin" in out and "a optimizers twin" in out


def test_diff_lists_changed_fields_with_ratio(capsys):
    spec = example("train-70b-h100")
    assert main(["diff", spec, spec, "--set-b", "hardware.num_gpus=64"]) == 0
    out = capsys.readouterr().out
    assert "B: " + spec + " with hardware.num_gpus=64" in out
    (gpus,) = rows_named(out, "num_gpus")
    assert gpus.split()[1:] == ["1", "64", "64x"]
    (time,) = rows_named(out, "train_seconds")
    assert "41.41 years" in time and "7.76 months" in time and "0.0156x" in time  # 1/64
    assert "parameters" not in out  # unchanged fields are left out


def test_diff_of_optimizers_in_both_units():
    a = SESSION.evaluate(example("adam-memory-7b"))
    b = SESSION.evaluate(example("adam-memory-7b"), {"optimizer": "adam-8bit"})
    changed = {d.field: d for d in plan_differences(a, b)}
    # 12 -> 4 + 2 * (1 + 4/2048) bytes per parameter of optimizer state
    assert changed["optimizer_bytes"].ratio == pytest.approx(6.00390625 / 12)
    assert changed["fits"].ratio is None and changed["fits"].b is True
    assert "weights_bytes" not in changed


def test_diff_compares_the_serving_pool_fields_schema_1_lacks():
    spec = example("inference-qwen3-4b-int4-l40s")
    a = SESSION.evaluate(spec)
    b = SESSION.evaluate(spec, {"inference.batch_size": 16})
    changed = {d.field: d for d in plan_differences(a, b)}
    prompt = changed["serving.max_prompt_tokens"]
    assert prompt.a == a.serving[0].max_prompt_tokens > prompt.b > 0
    assert "serving.role" not in changed  # unchanged fields are left out


def test_diff_json(capsys):
    spec = example("adam-memory-7b")
    assert main(["diff", spec, spec, "--set-b", "model=\"1b\"", "--format", "json"]) == 0
    rows = {row["field"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["parameters"]["a"] == 7 * 10**9 and rows["parameters"]["b"] == 10**9
    assert rows["total_bytes"]["ratio"] == pytest.approx(1 / 7)


def test_serving_memory_says_what_memory_utilization_holds_back():
    spec = Path(__file__).resolve().parent.parent / "specs/examples/inference-llama-2-70b-h100.toml"
    plan = llmpar.evaluate(spec)
    held = 0.1 * plan.capacity_bytes  # memory_utilization = 0.9 (vLLM's default)
    assert f"holds back {held / 1e9:,.2f} GB" in text_report(plan)
    none = llmpar.evaluate(spec, {"inference.memory_utilization": 1.0})
    assert "holds back" not in text_report(none)


def test_serving_times_say_they_are_not_yet_validated():
    spec = Path(__file__).resolve().parent.parent / "specs/examples/inference-llama-2-70b-h100.toml"
    plan = llmpar.evaluate(spec)
    assert plan.serving[0].time_trust.startswith("not yet checked against published serving")
    assert f"times: {plan.serving[0].time_trust}" in text_report(plan)
