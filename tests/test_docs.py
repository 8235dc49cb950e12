"""The documentation cannot drift from the code: the generated reference pages are up to
date, every spec field and CLI option is documented, the mkdocs nav covers every page, the
examples of docs/embedding.md run with the outputs shown, and the tables that
docs/concepts.md quotes from llmpar still come out of it."""

from __future__ import annotations

import argparse
import doctest
import importlib.util
import re
import shlex
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.spec import Spec
from llmpar.units import GB, GiB

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

if not (DOCS / "generate.py").is_file():  # an sdist ships no docs
    pytest.skip("docs/ is not part of this tree", allow_module_level=True)


def _load_generator():
    spec = importlib.util.spec_from_file_location("llmpar_docs_generate", DOCS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(generator.PAGES))
def test_generated_page_is_up_to_date(name):
    expected = generator.PAGES[name]()
    assert page(name) == expected, f"docs/{name} is out of date: run python docs/generate.py"


# --------------------------------------------------------------------------------------
# The spec reference


def spec_classes() -> list[type]:
    """Every attrs class a Spec's fields reach, found from the types themselves."""
    found: list[type] = []

    def inner(tp):
        if attrs.has(tp):
            yield tp
        for arg in typing.get_args(tp):
            yield from inner(arg)

    def visit(cls):
        if cls in found:
            return
        found.append(cls)
        for field in attrs.fields(attrs.resolve_types(cls)):
            for nested in inner(field.type):
                visit(nested)

    visit(Spec)
    return found


def section_of(text: str, cls: type) -> str:
    marker = f"`{cls.__module__}.{cls.__qualname__}`"
    sections = [s for s in re.split(r"\n(?=#{2,3} )", text) if marker in s]
    assert len(sections) == 1, f"{marker}: {len(sections)} sections in docs/reference/spec.md"
    return sections[0]


def strategy_configs() -> list[tuple[str, type]]:
    session = llmpar.Session(load_entry_points=False)
    return [(name, s.config_type) for name, s in session.strategies.items()]


@pytest.mark.parametrize("cls", spec_classes() + [c for _, c in strategy_configs()],
                         ids=lambda cls: cls.__name__)
def test_every_spec_field_has_a_row(cls):
    section = section_of(page("reference/spec.md"), cls)
    missing = [f.name for f in attrs.fields(cls) if f"\n| `{f.name}` |" not in section]
    assert not missing, f"{cls.__name__}: no row for {missing}"


def test_every_builtin_strategy_has_its_table():
    text = page("reference/spec.md")
    for name, _ in strategy_configs():
        assert f"\n### [parallel.{name}]\n" in text


def test_field_docstrings_are_read_from_the_source():
    rows = page("reference/spec.md")
    assert "| `num_kv_heads` |" in rows and "one is MQA. Default: a." in rows
    assert "| `kind` | string; one of `ring`, `all-to-all`, `hybrid` |" in rows


# --------------------------------------------------------------------------------------
# The CLI and formulas references


def test_every_cli_option_is_documented():
    from llmpar.cli.main import build_parser

    text = page("reference/cli.md")
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        heading = f"\n## llmpar {name}\n"
        assert heading in text
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                label = action.option_strings[-1]
            elif action.choices is not None and action.metavar is None:
                label = "{" + ",".join(action.choices) + "}"
            else:
                label = action.metavar or action.dest
            assert str(label) in section, f"llmpar {name}: {label} undocumented"


def test_formulas_page_names_each_strategy_and_its_sources():
    text = page("reference/formulas.md")
    for name, _ in strategy_configs():
        assert f"### `llmpar.strategies.{name}`" in text
    for source in ("arXiv:2205.05198", "arXiv:1910.02054", "arXiv:2104.04473",
                   "arXiv:2001.08361"):
        assert source in text


# --------------------------------------------------------------------------------------
# The site


def test_nav_covers_every_page():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", config, re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert listed == pages
    assert re.search(r"^strict: true$", config, re.M)


def _prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_links_between_pages_resolve():
    # mkdocs --strict checks the files; the anchors are checked here (mkdocs 1.5 cannot).
    broken = []
    for path in sorted(DOCS.rglob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.is_file():
                broken.append(f"{path.name}: {target}")
                continue
            if linked.suffix != ".md":
                continue
            headings = re.findall(r"^#+ (.+)$", _prose(linked.read_text(encoding="utf-8")),
                                  re.M)
            if anchor and anchor not in {generator._slug(h) for h in headings}:
                broken.append(f"{path.name}: {target}")
    assert not broken


# --------------------------------------------------------------------------------------
# docs/embedding.md


def test_embedding_examples_run_as_shown():
    text = page("embedding.md")
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(block, "docs/embedding.md", "exec"), namespace)
    examples = "\n".join(re.findall(r"```pycon\n(.*?)```", text, re.S))
    test = doctest.DocTestParser().get_doctest(examples, namespace, "embedding.md",
                                               "docs/embedding.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0 and runner.tries > 10


def test_one_session_evaluates_from_threads():
    # docs/embedding.md: plans computed concurrently equal those computed in turn.
    session = llmpar.Session(load_entry_points=False)
    specs = sorted(str(p) for p in (ROOT / "specs" / "examples").glob("*.toml"))
    alone = [session.evaluate(spec) for spec in specs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(session.evaluate, specs * 3))
    assert together == alone * 3


# --------------------------------------------------------------------------------------
# docs/concepts.md: the numbers it quotes


def example(name: str) -> str:
    return str(ROOT / "specs" / "examples" / f"{name}.toml")


def quoted(row: str) -> None:
    assert row in page("concepts.md"), f"docs/concepts.md no longer shows: {row}"


@pytest.mark.parametrize("model", ["1b", "7b", "70b"])
def test_concepts_model_state_table(model):
    p = llmpar.evaluate(example("adam-memory-7b"), {"model": model})
    cells = [p.weights_bytes, p.gradients_bytes, p.optimizer_bytes, p.total_bytes]
    quoted(" | ".join(f"{b / GB:,.2f}" for b in cells) + " |")


@pytest.mark.parametrize("s", [1024, 2048, 4096, 8192, 16384])
def test_concepts_founding_activation_table(s):
    p = llmpar.evaluate(example("qwen3-4b-activations"), {"training.sequence_length": s})
    quoted(f"| {p.activations_bytes / GiB:.2f} | {p.activations_bytes / GB:.2f} |")


@pytest.mark.parametrize("model", ["coefficient", "korthikanti", "hf-eager", "hf-sdpa", "fused"])
def test_concepts_activation_model_table(model):
    cells = []
    for recompute in ("none", "selective", "full"):
        p = llmpar.evaluate(example("qwen3-4b-activations"),
                            {"training.sequence_length": 4096,
                             "training.activation_model": model,
                             "training.recompute": recompute})
        cells.append(f"{p.activations_bytes / GiB:.2f}")
    quoted(f"| `{model}` | {p.activation_k:.1f} | " + " | ".join(cells) + " |")


RUNNING_EXAMPLE = {"hardware.cluster": "dgx-a100", "parallel.data.fsdp": False}
LAYOUTS = {
    "DP8": {},
    "DP8, ZeRO-1": {"parallel.data.zero": 1},
    "DP8, ZeRO-2": {"parallel.data.zero": 2},
    "DP8, ZeRO-3": {"parallel.data.zero": 3},
    "TP8": {"parallel.tensor.degree": 8},
    "TP8 + SP": {"parallel.tensor.degree": 8, "parallel.sequence": {}},
    "PP8, 1F1B": {"parallel.pipeline.degree": 8},
    "PP8, GPipe": {"parallel.pipeline.degree": 8, "parallel.pipeline.schedule": "gpipe"},
    "CP8, ring": {"parallel.context.degree": 8},
    "CP8, all-to-all": {"parallel.context.degree": 8, "parallel.context.kind": "all-to-all"},
    "CP8, ring, ZeRO-1": {"parallel.context.degree": 8, "parallel.data.zero": 1},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_concepts_strategy_table(layout):
    p = llmpar.evaluate(example("llama-3-8b-fsdp-8-h100"),
                        {**RUNNING_EXAMPLE, **LAYOUTS[layout]})
    memory = [p.weights_bytes, p.gradients_bytes, p.optimizer_bytes, p.activations_bytes,
              p.buffers_bytes, p.total_bytes]
    times = [p.communication_seconds, p.exposed_communication_seconds, p.bubble_seconds,
             p.step_seconds]
    quoted(f"| {layout} | " + " | ".join(f"{b / GB:.2f}" for b in memory)
           + f" | {'yes' if p.fits else 'no'} | " + " | ".join(f"{t:.2f}" for t in times) + " |")


@pytest.mark.parametrize("degree", [1, 2, 4, 8])
def test_concepts_expert_table(degree):
    p = llmpar.evaluate(example("mixtral-8x7b-ep8-tp2"), {"parallel.expert.degree": degree})
    memory = [p.weights_bytes, p.gradients_bytes, p.optimizer_bytes, p.activations_bytes,
              p.total_bytes]
    a2a = [c for c in p.collectives if c.strategy == "expert"]
    cost = f"{a2a[0].tier}, {a2a[0].seconds:.2f} s" if a2a else "-"
    quoted(f"| {degree} | " + " | ".join(f"{b / GB:.2f}" for b in memory)
           + f" | {'yes' if p.fits else 'no'} | {cost} |")


# --------------------------------------------------------------------------------------
# Console sessions in the docs show what the commands print

CONSOLE = re.compile(r"```console\n\$ llmpar (evaluate|diff|explain) ([^\n]+)\n(.*?)```", re.S)
SESSIONS = [(name, m.group(1), m.group(2), m.group(3))
            for name in ("quickstart.md", "concepts.md", "inference.md")
            for m in CONSOLE.finditer(page(name))]


@pytest.mark.parametrize(("name", "command", "arguments", "shown"), SESSIONS,
                         ids=[f"{s[0]}-{s[1]}-{i}" for i, s in enumerate(SESSIONS)])
def test_console_sessions_show_current_output(name, command, arguments, shown, capsys,
                                              monkeypatch):
    """Every line a console block shows (but elisions, "...") is a line the command prints
    today, run from the repository root."""
    monkeypatch.chdir(ROOT)
    assert main([command, *shlex.split(arguments)]) == 0
    printed = {line.rstrip() for line in capsys.readouterr().out.splitlines()}
    shown_lines = [line.rstrip() for line in shown.splitlines()
                   if line.strip() and "..." not in line]
    assert [line for line in shown_lines if line not in printed] == []


# --- docs/plugins.md: the worked example is a strategy that keeps the contract ----------

def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


@pytest.fixture(scope="module")
def worked_example(tmp_path_factory):
    """The plugin module docs/plugins.md writes, importable as `compression`."""
    import importlib
    import sys

    (source,) = [b for b in _python_blocks("plugins.md") if b.startswith("# compression.py")]
    folder = tmp_path_factory.mktemp("worked-example")
    (folder / "compression.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("compression")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("compression", None)


def test_the_worked_example_keeps_the_whole_contract(worked_example):
    from llmpar.testing import check_strategy_contract

    session = llmpar.Session(load_entry_points=False, plugins=[worked_example], strict=True)
    counts = check_strategy_contract("compression", session=session)
    assert counts["fast-form-agrees"] > 0 and counts["neutral-is-identity"] > 0


def test_the_worked_example_runs_as_the_page_says(worked_example):
    (trial,) = [b for b in _python_blocks("plugins.md") if "import compression" in b]
    scope: dict[str, object] = {}
    exec(trial, scope)  # the page's own lines
    plan, found = scope["plan"], scope["found"]
    (reduce,) = [c for c in plan.collectives if c.name == "compression.grad-reduce-scatter"]
    assert not any(c.name == "data.dense-grad-reduce-scatter" for c in plan.collectives)
    plain = llmpar.Session(load_entry_points=False).evaluate(
        {**scope["spec"], "parallel": {"data": {"zero": 1, "overlap_grad_reduce": False}}})
    (full,) = [c for c in plain.collectives if c.name == "data.dense-grad-reduce-scatter"]
    assert reduce.buffer_bytes == pytest.approx(full.buffer_bytes / 4, rel=1e-9)  # 4 of 16 bits
    assert plan.step_seconds < plain.step_seconds
    assert {r.choices["compression.gradient_bits"] for r in found.results} <= {4, 8}
    searched = {**scope["spec"], "parallel": {"compression": {}}}
    exact = llmpar.search(searched, session=scope["session"], exact=True)
    assert [r.choices for r in exact.results] == [r.choices for r in found.results]


def test_the_license_ships_with_the_package():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_changelog_says_whether_numbers_moved():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "Numbers of existing plans:" in text


# --------------------------------------------------------------------------------------
# The how-to guides: every command they show is one llmpar takes, and those that need no
# file of the reader's own run

HOW_TO = sorted((DOCS / "how-to").glob("*.md"))


def _shown_commands(path: Path) -> list[list[str]]:
    found = []
    for block in re.findall(r"```console\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
        for line in block.splitlines():
            if not line.startswith("$ llmpar "):
                continue
            for part in line[2:].split(" && "):
                words = shlex.split(part)
                found.append(words[1:words.index(">")] if ">" in words else words[1:])
    return found


@pytest.mark.parametrize("path", HOW_TO, ids=lambda p: p.stem)
def test_how_to_commands_run(path, capsys, monkeypatch):
    from llmpar.cli.main import build_parser

    monkeypatch.chdir(ROOT)
    commands = _shown_commands(path)
    assert commands, f"{path.name} shows no command"
    for words in commands:
        build_parser().parse_args(words)  # an unknown command or option exits here
        own_files = [w for w in words if w.endswith(".toml") and not w.startswith("specs/")]
        if words[0] in ("evaluate", "diff", "explain") and not own_files:
            expected = (0, 1) if "--check" in words else (0,)
            assert main(words) in expected, words
            capsys.readouterr()
