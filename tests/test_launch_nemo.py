"""NeMo 2 and Megatron-Bridge recipe overrides: every key is a field of the config object
it lands in (validation/data/launch/nemo.json and megatron-bridge.json, read from the
sources by validation/launch_arguments.py), every value has the field's type, and spec ->
launch -> import -> the same plan for every shipped training example the frameworks can
express."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest
from round_trip import decides_unmapped

from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.launch.importing import spec_table
from llmpar.launch.nemo import split_overrides
from llmpar.session import Session

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "specs" / "examples").glob("*.toml"))
DATA = {name: json.loads((ROOT / f"validation/data/launch/{name}.json").read_text())
        for name in ("nemo", "megatron-bridge")}
GPT3 = ROOT / "specs/examples/gpt3-175b-1024-a100.toml"
FSDP = ROOT / "specs/examples/llama-3-8b-fsdp-8-h100.toml"
FSDP2 = json.loads((ROOT / "validation/data/launch/pytorch-fsdp2.json").read_text())


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(load_entry_points=False, environ={})


def training_examples(session: Session) -> list[Path]:
    return [path for path in EXAMPLES if session.load_spec(path).inference is None]


def field_of(target: str, key: str) -> str:
    """The annotation of the field `key` sets: NeMo 2's by its object's path
    (trainer.strategy.ddp.overlap_grad_reduce), Bridge's by its ConfigContainer section."""
    data = DATA[target]
    if target == "nemo":
        section, _, name = key.rpartition(".")
        assert section in data["sections"], f"{key}: no such recipe object"
    else:
        section, _, name = key.partition(".")
        assert section in data["container"], f"{key}: not a ConfigContainer field"
        if not name:
            return "mixed_precision"
    fields = data["sections"][section]
    assert name in fields, f"{key}: {name} is not a field of {section}"
    return str(fields[name])


def check_overrides(target: str, text: str) -> dict[str, str]:
    """Every key is a field; a bool field gets true/false, an int field an integer, a
    Literal field one of its values, null only an Optional field, and mixed_precision a
    recipe name Bridge registers."""
    found = split_overrides(text, "<launch>")
    true, false, null = (("True", "False", "None") if target == "nemo"
                         else ("true", "false", "null"))
    for key, value in found.items():
        annotation = field_of(target, key)
        if annotation == "mixed_precision":
            assert value in [*DATA[target]["mixed_precision"], null], (key, value)
        elif value == null:
            assert "Optional" in annotation or "None" in annotation, (key, annotation)
        elif "Literal[" in annotation:
            literal = annotation[annotation.index("Literal["):].removeprefix("Literal")
            assert value in ast.literal_eval(literal.rstrip("]") + "]"), (key, value)
        elif annotation == "bool":
            assert value in (true, false), (key, value)
        elif annotation == "int":
            int(value)
    return found


@pytest.mark.parametrize("target", ["nemo", "megatron-bridge"])
def test_every_training_example_gives_overrides_of_real_fields(session: Session,
                                                               target: str) -> None:
    for path in training_examples(session):
        launch = session.launch(path, target)
        found = check_overrides(target, launch.files[0].text)
        spec = session.load_spec(path)
        if spec.model.has_architecture:
            layers = "model.config.num_layers" if target == "nemo" else "model.num_layers"
            assert found[layers] == str(spec.model.num_layers)
        assert launch.framework_version.startswith(DATA[target]["framework"])
        assert DATA[target]["version"] in launch.framework_version


def test_gpt3_175b_overrides_say_the_papers_layout(session: Session) -> None:
    """Narayanan et al. 2021 (arXiv:2104.04473) Sec. 5: GPT-3 175B at TP 8 x PP 16,
    interleaved (here 2 chunks of 3 layers per stage: --num-layers-per-virtual-pipeline-
    stage 3 is virtual_pipeline_model_parallel_size 96 / (16 x 3) = 2)."""
    nemo = split_overrides(session.launch(GPT3, "nemo").command, "<launch>")
    assert nemo["trainer.strategy.tensor_model_parallel_size"] == "8"
    assert nemo["trainer.strategy.pipeline_model_parallel_size"] == "16"
    assert nemo["trainer.strategy.virtual_pipeline_model_parallel_size"] == "2"
    assert (nemo["trainer.num_nodes"], nemo["trainer.devices"]) == ("128", "8")
    bridge = split_overrides(session.launch(GPT3, "bridge").command, "<launch>")
    assert bridge["model.virtual_pipeline_model_parallel_size"] == "2"
    assert bridge["dataset.seq_length"] == bridge["model.seq_length"] == "2048"
    assert bridge["mixed_precision"] == "bf16_mixed"



@pytest.mark.parametrize(("target", "file"), [("nemo", "overrides.txt"),
                                              ("nemo", "launch.sh"),
                                              ("megatron-bridge", "overrides.txt"),
                                              ("megatron-bridge", "launch.sh")])
def test_spec_launch_import_gives_the_same_plan(session: Session, target: str,
                                                file: str) -> None:
    """Round trip over every shipped training example: an example is left out only when
    a setting the importer decides was listed as not mapped (as for Megatron-LM)."""
    reader = session.launch_targets.find(target)
    checked = []
    for path in training_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, target)
        text = {f.name: f.text for f in launch.files}[file]
        read = reader.read(text, file, base)  # type: ignore[attr-defined]
        if decides_unmapped(launch, {*read.owned, *read.settings}):
            continue
        back = session.load_spec(spec_table(read, base))
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    assert len(checked) >= 20 and "gpt3-175b-1024-a100.toml" in checked


def test_a_changed_override_changes_the_spec(session: Session) -> None:
    base = session.load_spec(GPT3)
    text = session.launch(base, "nemo").files[0].text.replace(
        "trainer.strategy.tensor_model_parallel_size=8",
        "trainer.strategy.tensor_model_parallel_size=4").replace(
        "data.micro_batch_size=1", "data.micro_batch_size=2")
    read = session.launch_targets.find("nemo").read(text, "o.txt", base)  # type: ignore[attr-defined]
    spec = session.load_spec(spec_table(read, base))
    assert spec.parallel["tensor"].degree == 4 and spec.training.micro_batch_size == 2
    assert spec.hardware.num_gpus == 1024  # trainer.num_nodes x trainer.devices


def test_nemo_lists_what_it_sets_elsewhere(session: Session) -> None:
    """NeMo 2 turns on Transformer Engine's TP overlap through a callback, not a path."""
    spec = session.load_spec(ROOT / "specs/examples/llama-3-8b-tp8-sp-a100.toml",
                             {"parallel.sequence.comm_overlap": "pipelined"})
    listed = {u.path for u in session.launch(spec, "nemo").unmapped}
    assert "$.--tp-comm-overlap" in listed
    found = split_overrides(session.launch(spec, "bridge").command, "<launch>")
    assert found["comm_overlap.tp_comm_overlap"] == "true"


@pytest.mark.parametrize(("target", "text", "path"), [
    ("nemo", "trainer.strategy.tensor_model_parallel_size=x",
     r"\$\.trainer\.strategy\.tensor_model_parallel_size: expected an integer"),
    ("nemo", "trainer.strategy.sequence_parallel=maybe",
     r"\$\.trainer\.strategy\.sequence_parallel: expected true or false"),
    ("nemo", "trainer.plugins.precision=fp8-mixed", r"\$\.trainer\.plugins\.precision: must "
                                                    r"be one of"),
    ("nemo", "trainer.num_nodes=0", r"\$\.trainer\.num_nodes"),
    ("megatron-bridge", "dataset.seq_length=2048 model.seq_length=4096",
     r"\$\.model\.seq_length: must equal dataset\.seq_length"),
    ("megatron-bridge", "model.hierarchical_context_parallel_sizes=2",
     r"\$\.model\.hierarchical_context_parallel_sizes: expected a list"),
    ("megatron-bridge", "model.num_layers=4 model.hidden_size=big",
     r"\$\.model\.hidden_size: expected an integer"),
])
def test_a_bad_override_is_a_spec_error_naming_its_key(session: Session, target: str,
                                                       text: str, path: str) -> None:
    with pytest.raises(SpecError, match=path):
        session.launch_targets.find(target).read(text, "overrides")  # type: ignore[attr-defined]


def test_a_nemo_spec_launches_nemo_by_default(session: Session) -> None:
    spec = session.load_spec(GPT3, {"training.framework": "nemo"})
    assert session.launch(spec).target == "nemo"


def test_bridge_launcher_line_uses_torchrun_and_run_recipe_options(session: Session) -> None:
    for path in training_examples(session):
        words = shlex.split(session.launch(path, "bridge").command.replace("\\\n", " "))
        script = words.index("scripts/training/run_recipe.py")
        assert {w.split("=")[0] for w in words[1:script]} <= set(FSDP2["torchrun"])
        options = [w for w in words[script + 1:] if w.startswith("--")]
        assert options == ["--recipe"] and set(options) <= set(DATA["megatron-bridge"]
                                                               ["run_recipe"])


def test_fsdp_is_the_strategy_choice_in_nemo_and_dist_in_bridge(session: Session) -> None:
    nemo = split_overrides(session.launch(FSDP, "nemo").command, "<launch>")
    bridge = split_overrides(session.launch(FSDP, "bridge").command, "<launch>")
    spec = session.load_spec(FSDP)
    if spec.parallel["data"].fsdp:
        assert nemo["trainer.strategy.fsdp"] == "pytorch"
        assert bridge["dist.use_torch_fsdp2"] == "true"
    else:
        assert nemo["trainer.strategy.fsdp"] == "megatron"
        assert bridge["dist.use_megatron_fsdp"] == bridge["ddp.use_megatron_fsdp"] == "true"


def test_launch_and_import_through_the_cli(tmp_path: Path) -> None:
    assert main(["launch", str(GPT3), "--for", "nemo", "-o", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"overrides.txt", "launch.sh",
                                                   "UNMAPPED.txt"}
    out = tmp_path / "spec.toml"
    assert main(["import", str(tmp_path / "launch.sh"), "--from", "nemo", "--base",
                 str(GPT3), "-o", str(out)]) == 0
    session = Session(load_entry_points=False, environ={})
    assert session.evaluate(out).to_dict() == session.evaluate(GPT3).to_dict()


def test_the_source_reader_follows_bases_across_modules(tmp_path: Path) -> None:
    """validation/launch_arguments.py's ast reader: a dataclass's fields with its bases'
    first, the base found through an aliased import from another package (as Bridge's
    configs extend Megatron-Core's) and through a package's re-export; a class's
    __init__ parameters; ClassVar and private names left out."""
    import textwrap

    from validation_scripts import load_script

    script = load_script("launch_arguments")
    core = tmp_path / "core" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("from .config import ParallelConfig\n")
    (core / "config.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        class ParallelConfig:
            tensor_model_parallel_size: int = 1
            kind: ClassVar[str] = "x"
            _private: int = 0
        '''))
    bridge = tmp_path / "bridge" / "megatron" / "bridge"
    bridge.mkdir(parents=True)
    (bridge / "config.py").write_text(textwrap.dedent('''
        from megatron.core import ParallelConfig as MCoreParallelConfig
        class ModelConfig(MCoreParallelConfig):
            num_layers: int = 2
        class Strategy:
            def __init__(self, ddp: str = "megatron", *, fsdp=None):
                pass
        '''))
    code = script._Sources([tmp_path / "bridge", tmp_path / "core"])
    assert code.fields("megatron.bridge.config", "ModelConfig") == {
        "tensor_model_parallel_size": "int", "num_layers": "int"}
    assert code.fields("megatron.bridge.config", "Strategy", init=True) == {
        "ddp": "str", "fsdp": ""}
