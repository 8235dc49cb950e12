"""Launch targets: the hook, Megatron-LM's arguments checked against the arguments its own
parser accepts (validation/data/launch/, read by validation/launch_arguments.py), settings
never dropped silently, and spec -> launch -> import -> the same plan."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from round_trip import decides_unmapped

from llmpar import hookimpl
from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.launch import Launch, LaunchFile
from llmpar.launch.importing import spec_table
from llmpar.launch.megatron import split_arguments
from llmpar.launch.settings import DESCRIPTIVE, stated_settings
from llmpar.session import Session

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "specs" / "examples").glob("*.toml"))
MEGATRON = json.loads((ROOT / "validation/data/launch/megatron-lm.json").read_text())
GPT3 = str(ROOT / "specs/examples/gpt3-175b-1024-a100.toml")


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(load_entry_points=False, environ={})


def training_examples(session: Session) -> list[Path]:
    return [path for path in EXAMPLES if session.load_spec(path).inference is None]


def check_megatron_arguments(command: str) -> None:
    """Every flag is one Megatron-LM's parser defines; a switch has no value, a valued
    argument has values of its type and among its choices."""
    for flag, values in split_arguments(command, "<launch>").items():
        assert flag in MEGATRON["arguments"], f"{flag} is not a Megatron-LM argument"
        accepted = MEGATRON["arguments"][flag]
        if accepted["switch"]:
            assert values == [], flag
            continue
        assert values, flag
        if accepted["nargs"] is None:
            assert len(values) == 1, flag
        for value in values:
            if accepted["type"] == "int":
                int(value)
            elif accepted["type"] == "float":
                float(value)
            if accepted["choices"] is not None:
                assert value in accepted["choices"], (flag, value)


def test_the_builtin_targets_come_through_the_hook_and_can_be_blocked() -> None:
    session = Session(load_entry_points=False, environ={})
    assert session.launch_targets.owners["megatron-core"] == "launch"
    assert session.launch_targets.find("megatron").name == "megatron-core"
    blocked = Session(load_entry_points=False, environ={}, blocked=["launch"])
    with pytest.raises(SpecError, match="no launch target 'megatron'"):
        blocked.launch(GPT3, "megatron")


@attrs.frozen
class InHouse:
    name: str = "in-house"
    aliases: tuple[str, ...] = ("ours",)
    description: str = "a team's own launcher"

    def launch(self, spec, layout):  # type: ignore[no-untyped-def]
        return Launch(target=self.name, framework_version="1",
                      files=(LaunchFile("run.txt", f"gpus={layout.num_gpus}\n"),))


class InHousePlugin:
    @hookimpl
    def llmpar_launch_targets(self, register):  # type: ignore[no-untyped-def]
        register(InHouse())


class Duplicate:
    @hookimpl
    def llmpar_launch_targets(self, register):  # type: ignore[no-untyped-def]
        register(InHouse(name="x", aliases=("megatron",)))


class NotATarget:
    @hookimpl
    def llmpar_launch_targets(self, register):  # type: ignore[no-untyped-def]
        register("megatron")


def test_a_third_party_target_is_found_by_name_and_alias() -> None:
    session = Session(load_entry_points=False, environ={}, plugins=[InHousePlugin()])
    launch = session.launch(GPT3, "ours")
    assert launch.files[0].text == "gpus=1024\n"
    assert session.launch_targets.owners["in-house"] == "InHousePlugin"


@pytest.mark.parametrize("plugin", [Duplicate(), NotATarget()])
def test_a_plugin_that_takes_a_name_or_hands_over_no_target_is_set_aside(plugin) -> None:  # type: ignore[no-untyped-def]
    session = Session(load_entry_points=False, environ={}, plugins=[plugin])
    assert session.launch_targets.find("megatron").name == "megatron-core"
    broken = {info.name: info for info in session.plugins()}[type(plugin).__name__]
    assert broken.status == "broken"


def test_an_unknown_target_names_the_known_ones(session: Session) -> None:
    with pytest.raises(SpecError, match=r"\$\.--for: no launch target 'megatrom'.*megatron"):
        session.launch(GPT3, "megatrom")


def test_gpt3_175b_flags_are_all_megatron_arguments_with_the_papers_layout(
        session: Session) -> None:
    launch = session.launch(GPT3, "megatron")
    check_megatron_arguments(launch.command)
    found = split_arguments(launch.command, "<launch>")
    # Narayanan et al. 2021: TP8 x PP16 (interleaved, 2 chunks of 3 layers) x DP8
    assert found["--tensor-model-parallel-size"] == ["8"]
    assert found["--pipeline-model-parallel-size"] == ["16"]
    assert found["--num-layers-per-virtual-pipeline-stage"] == ["3"]  # 96 / (16 x 2)
    assert "--sequence-parallel" in found and "--use-distributed-optimizer" in found
    assert found["--recompute-granularity"] == ["selective"]
    # 300e9 tokens / (1536 x 2048 tokens per step), rounded up to whole steps
    assert found["--train-iters"] == ["95368"]
    assert launch.command.startswith("torchrun --nproc-per-node=8 --nnodes=128")


def test_every_training_example_gives_megatron_arguments(session: Session) -> None:
    for path in training_examples(session):
        check_megatron_arguments(session.launch(path, "megatron").command)


def test_what_megatron_cannot_express_is_listed(session: Session) -> None:
    launch = session.launch(GPT3, "megatron", {
        "parallel.pipeline.schedule": "zero-bubble", "parallel.pipeline.virtual_stages": 1,
        "parallel.data.zero": 2,
        "model.final_logit_softcapping": 30.0, "parallel.pipeline.scatter_gather": False})
    listed = {u.path: u for u in launch.unmapped}
    assert {"$.parallel.pipeline.schedule", "$.parallel.data.zero",
            "$.model.final_logit_softcapping", "$.parallel.pipeline.scatter_gather"} <= set(
        listed)
    assert listed["$.model.final_logit_softcapping"].value == "30.0"
    assert "--use-distributed-optimizer" not in launch.command
    assert "Not mapped to megatron-core" in launch.text()


def test_a_setting_no_target_step_handles_is_listed_not_dropped(session: Session) -> None:
    """The ledger's promise: whatever the spec states that no flag came from, and that is
    not a fact about the machine or llmpar's accounting (DESCRIPTIVE), is listed."""
    changes = {"model.scale_embeddings": True, "model.sliding_window": 4096,
               "model.embedding_norm": True}
    spec = session.load_spec(GPT3, changes)
    launch = session.launch(spec, "megatron")
    listed = {u.path.removeprefix("$."): u.reason for u in launch.unmapped}
    assert set(changes) <= set(listed)
    assert all("no setting" in listed[key] for key in changes)
    stated = stated_settings(spec)
    assert set(changes) <= set(stated)
    assert not any(key.startswith(DESCRIPTIVE) for key in listed)



@pytest.mark.parametrize(("target", "least"), [("megatron", 13), ("torchtitan", 6),
                                                ("deepspeed", 13), ("pytorch-fsdp2", 10)])
def test_spec_launch_import_gives_the_same_plan(session: Session, target: str,
                                                least: int) -> None:
    """Round trip over every shipped training example the format can express: spec ->
    launch -> import with the spec as the base -> the same plan. An example is left out
    when a setting the importer decides was listed as not mapped (torchtitan's ZeRO-1)."""
    reader = session.launch_targets.find(target)
    checked = []
    for path in training_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, target)
        read = reader.read(launch.files[0].text, str(path), base)  # type: ignore[attr-defined]
        if decides_unmapped(launch, {*read.owned, *read.settings}):
            continue
        back = session.load_spec(spec_table(read, base))
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    # torchtitan's ZeRO-1 and the FSDP2 snippet's data parallelism alone leave GPT-3 out
    assert len(checked) >= least and (target in ("torchtitan", "pytorch-fsdp2")
                                      or "gpt3-175b-1024-a100.toml" in checked), checked


def test_import_without_a_base_takes_the_model_and_layout_from_the_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = tmp_path / "run.sh"
    args.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 "
                    "--hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                    "--group-query-attention --num-query-groups 8 --swiglu "
                    "--normalization RMSNorm --position-embedding-type rope "
                    "--untie-embeddings-and-output-weights --disable-bias-linear "
                    "--vocab-size 128256 --max-position-embeddings 8192 "
                    "--tensor-model-parallel-size 8 --sequence-parallel --seq-length 8192 "
                    "--micro-batch-size 1 --global-batch-size 64 --bf16 --lr 3e-4\n")
    out = tmp_path / "spec.toml"
    assert main(["import", str(args), "--from", "megatron", "--cluster", "dgx-h100",
                 "--num-gpus", "64", "-o", str(out)]) == 0
    assert "ignored: --lr" in capsys.readouterr().err
    spec = Session(load_entry_points=False, environ={}).load_spec(out)
    model = spec.model
    assert (model.num_layers, model.num_kv_heads, model.ffn_activation, model.norm) == (
        32, 8, "swiglu", "rmsnorm")
    assert not model.tie_embeddings and not model.linear_bias
    assert spec.parallel["tensor"].degree == 8 and "sequence" in spec.parallel


@pytest.mark.parametrize(("arguments", "path"), [
    ("--num-layers x", r"\$\.--num-layers: expected an integer"),
    ("--num-layers 2 --normalization Foo", r"\$\.--normalization: must be one of"),
    ("--num-layers 2 --swiglu yes", r"\$\.--swiglu: is a switch"),
    ("stray --num-layers 2", r"\$: 'stray' is not an argument"),
    ("--num-layers 4 --num-experts 8 --moe-layer-freq [1,0]", r"\$\.--moe-layer-freq"),
    # worked out without eval, and bounded: a mistyped count is an error, not the memory
    ("--num-layers 4 --num-experts 8 --moe-layer-freq [0]*999999999",
     r"\$\.--moe-layer-freq: .*more than 100,000 entries"),
    ("--num-layers 4 --num-experts 8 --moe-layer-freq 0",
     r"\$\.--moe-layer-freq: expected an integer of at least 1"),
    ("--num-layers 4 --num-experts 8 --moe-layer-freq 1.5",
     r"\$\.--moe-layer-freq: expected an integer or a list"),
    ("--num-layers 4 --num-experts 8 --moe-layer-freq __import__('os')",
     r"\$\.--moe-layer-freq: expected an integer or a list"),
    ("--num-layers 999999999 --num-experts 8 --moe-layer-freq 2",
     r"\$\.--moe-layer-freq: read for at most 100,000 layers"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
     r"\$\.--recompute-num-layers"),
])
def test_a_bad_argument_is_a_spec_error_naming_it(session: Session, arguments: str,
                                                  path: str) -> None:
    target = session.launch_targets.find("megatron")
    with pytest.raises(SpecError, match=path):
        target.read(arguments, "args.txt")  # type: ignore[attr-defined]


def test_import_needs_hardware(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 2\n")
    assert main(["import", str(args), "--from", "megatron"]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_launch_writes_the_files_and_what_it_left_out(tmp_path: Path) -> None:
    assert main(["launch", GPT3, "--for", "megatron", "-o", str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"pretrain_gpt.args", "launch.sh", "UNMAPPED.txt"}
    text = (tmp_path / "pretrain_gpt.args").read_text()
    check_megatron_arguments(text)
    assert "$.precision.gradients" in (tmp_path / "UNMAPPED.txt").read_text()


TORCHTITAN = json.loads((ROOT / "validation/data/launch/torchtitan.json").read_text())
DEEPSPEED = json.loads((ROOT / "validation/data/launch/deepspeed.json").read_text())


def test_torchtitan_keys_are_all_job_config_fields(session: Session) -> None:
    import tomllib

    for path in training_examples(session):
        launch = session.launch(path, "torchtitan")
        job = tomllib.loads(launch.files[0].text)
        for section, keys in job.items():
            assert section in TORCHTITAN["sections"], section
            assert set(keys) <= set(TORCHTITAN["sections"][section]), (path, section)
        for key, value in job.get("parallelism", {}).items():
            if TORCHTITAN["sections"]["parallelism"][key] == "int":
                assert isinstance(value, int) and value >= 1, key


def test_torchtitan_degrees_multiply_to_the_gpus_and_fsdp_shards(session: Session) -> None:
    import tomllib

    for path in training_examples(session):
        spec = session.load_spec(path)
        job = tomllib.loads(session.launch(spec, "torchtitan").files[0].text)["parallelism"]
        product = 1
        for key in ("data_parallel_shard_degree", "data_parallel_replicate_degree",
                    "tensor_parallel_degree", "pipeline_parallel_degree",
                    "context_parallel_degree"):
            product *= job[key]
        assert product == spec.hardware.num_gpus, path
    fsdp = tomllib.loads(session.launch(ROOT / "specs/examples/llama-3-70b-hsdp-256-h100.toml",
                                        "torchtitan").files[0].text)["parallelism"]
    hsdp = session.load_spec(ROOT / "specs/examples/llama-3-70b-hsdp-256-h100.toml")
    assert fsdp["data_parallel_shard_degree"] == hsdp.parallel["data"].shard_degree


def test_deepspeed_keys_are_all_config_fields(session: Session) -> None:
    for path in training_examples(session):
        launch = session.launch(path, "deepspeed")
        config = json.loads(launch.files[0].text)
        assert set(config) <= set(DEEPSPEED["top_level_keys"]), path
        zero = config["zero_optimization"]
        assert set(zero) <= set(DEEPSPEED["zero_optimization"]), path
        for section in ("offload_optimizer", "offload_param"):
            assert set(zero.get(section, {})) <= set(DEEPSPEED[section])
        assert set(config.get("activation_checkpointing", {})) <= set(
            DEEPSPEED["activation_checkpointing"])
        # DeepSpeed's own batch rule: train_batch_size = micro x accumulation x data ranks
        spec = session.load_spec(path)
        data = session._checked(spec, None)[1].degree("data")
        assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                              * config["gradient_accumulation_steps"] * data)


def test_deepspeed_lists_model_parallelism_it_cannot_configure(session: Session) -> None:
    launch = session.launch(GPT3, "deepspeed")
    listed = {u.path for u in launch.unmapped}
    assert {"$.parallel.tensor", "$.parallel.pipeline"} <= listed
    assert json.loads(launch.files[0].text)["zero_optimization"]["stage"] == 1


def test_the_default_target_is_the_spec_framework(session: Session) -> None:
    assert session.launch(GPT3).target == "megatron-core"
    spec = session.load_spec(GPT3, {"training.framework": "torchtitan"})
    assert session.launch(spec).target == "torchtitan"


FSDP2 = json.loads((ROOT / "validation/data/launch/pytorch-fsdp2.json").read_text())


def test_the_fsdp2_snippet_is_python_calling_torchs_fsdp2_api_as_it_is(
        session: Session) -> None:
    import ast

    api = {"fully_shard": "fully_shard", "MixedPrecisionPolicy": "MixedPrecisionPolicy",
           "init_device_mesh": "init_device_mesh"}
    for path in training_examples(session):
        for changes in ({}, {"parallel.data.gradient_sync": "last-micro-batch"}):
            spec = session.load_spec(path)
            if changes and (spec.parallel.get("data") is None
                            or spec.parallel["data"].stage != 3):
                continue
            launch = session.launch(spec, "fsdp2", changes)
            tree = ast.parse(launch.files[0].text)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in api:
                    assert {k.arg for k in node.keywords} <= set(FSDP2[api[name]]), path
                elif name and name.startswith("set_"):
                    assert name in FSDP2["FSDPModule"], name
            if changes:
                assert "set_requires_gradient_sync" in launch.files[0].text


def test_the_launch_target_plugin_of_the_docs_works() -> None:
    import re
    import types

    text = (ROOT / "docs" / "plugins.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                if "class SlurmTarget" in b]
    module = types.ModuleType("our_slurm")
    exec(compile(block, "docs/plugins.md", "exec"), module.__dict__)
    session = Session(load_entry_points=False, environ={}, plugins=[module], strict=True)
    launch = session.launch(GPT3, "slurm")
    assert launch.files[0].text == "#SBATCH --nodes=128\nsrun train --tp 8\n"
    listed = {u.path for u in launch.unmapped}
    assert "$.parallel.pipeline" in listed and "$.parallel.tensor" not in listed


def test_the_launch_page_shows_what_llmpar_prints(session: Session) -> None:
    page = (ROOT / "docs" / "launch.md").read_text()
    printed = session.launch(GPT3, "megatron").text().splitlines()
    shown = page.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    for line in shown:
        if line.startswith("$ ") or line.strip() == "...":
            continue
        assert any(p.startswith(line.rstrip(". ").rstrip()) for p in printed), line


def test_search_emits_the_launch_of_its_best_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "llama-3-8b-fsdp-8-h100", "--top", "1", "--emit-launch",
                 "megatron"]) == 0
    out = capsys.readouterr().out
    launch = out.split("# launch of the best layout for megatron-core\n", 1)[1]
    check_megatron_arguments(launch.split("# Not mapped", 1)[0])


@pytest.mark.parametrize(("target", "text", "path"), [
    ("torchtitan", "[parallelism]\ntensor_parallel_degree = 0\n",
     r"\$\.parallelism\.tensor_parallel_degree: expected an integer >= 1"),
    ("torchtitan", "[activation_checkpoint]\nmode = \"memory_budget\"\n",
     r"\$\.activation_checkpoint\.mode"),
    ("torchtitan", "[model]\nname = \"llama3\"\nflavor = \"7B\"\n", r"\$\.model: llama3/7B"),
    ("deepspeed", '{"zero_optimization": {"stage": 5}}', r"\$\.zero_optimization\.stage"),
    ("deepspeed", '{"zero_optimization": 3}', r"\$\.zero_optimization: expected an object"),
    ("deepspeed", '{"train_batch_size": "64"}', r"\$\.train_batch_size: expected an integer"),
    ("deepspeed", "{not json", r"\$: not JSON"),
])
def test_a_bad_config_value_is_a_spec_error_naming_its_key(session: Session, target: str,
                                                           text: str, path: str) -> None:
    with pytest.raises(SpecError, match=path):
        session.launch_targets.find(target).read(text, "config")  # type: ignore[attr-defined]


def test_import_from_torchtitan_over_a_base(tmp_path: Path) -> None:
    base = ROOT / "specs/examples/llama-3-8b-fsdp-8-h100.toml"
    job = tmp_path / "job.toml"
    job.write_text("[parallelism]\ndata_parallel_shard_degree = 4\n"
                   "data_parallel_replicate_degree = 2\n[training]\nlocal_batch_size = 2\n"
                   "global_batch_size = 64\nseq_len = 4096\n")
    out = tmp_path / "spec.toml"
    assert main(["import", str(job), "--from", "torchtitan", "--base", str(base), "-o",
                 str(out)]) == 0
    spec = Session(load_entry_points=False, environ={}).load_spec(out)
    assert spec.parallel["data"].shard_degree == 4 and spec.parallel["data"].stage == 3
    assert (spec.training.micro_batch_size, spec.training.sequence_length) == (2, 4096)
    assert spec.model.name == "llama-3-8b"


def test_launcher_lines_use_only_the_launchers_options(session: Session) -> None:
    """torchrun's options (torch.distributed.run) and the deepspeed launcher's
    (deepspeed.launcher.runner), as the committed data lists them."""
    import shlex

    launchers = {"torchrun": set(FSDP2["torchrun"]), "deepspeed": set(DEEPSPEED["launcher"])}
    for path in training_examples(session):
        for target in ("megatron", "torchtitan", "deepspeed", "fsdp2"):
            words = shlex.split(session.launch(path, target).command.split(" \\\n")[0])
            # the launcher's own options come before the first word that is not one
            script = next(i for i, w in enumerate(words) if i and not w.startswith("-"))
            options = [w.split("=")[0] for w in words[1:script] if w.startswith("--")]
            assert options and set(options) <= launchers[words[0]], (target, options)


def test_hybrid_context_parallel_sizes_are_separate_values(session: Session) -> None:
    changes = {"parallel.context.kind": "hybrid", "parallel.context.all_to_all_degree": 2}
    base = session.load_spec(ROOT / "specs/examples/llama-3-8b-cp8-a100.toml", changes)
    launch = session.launch(base, "megatron")
    check_megatron_arguments(launch.command)
    found = split_arguments(launch.command, "<launch>")
    assert found["--hierarchical-context-parallel-sizes"] == ["2", "4"]  # 2 x 4 = 8 ranks
    read = session.launch_targets.find("megatron").read(  # type: ignore[attr-defined]
        launch.files[0].text, "args", base)
    assert read.settings["parallel.context"] == {"degree": 8, "kind": "hybrid",
                                                 "all_to_all_degree": 2}


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed", "fsdp2"])
def test_a_serving_spec_is_not_launched_as_training(session: Session, target: str) -> None:
    with pytest.raises(SpecError, match=r"\$\.inference: .* launches training runs"):
        session.launch(ROOT / "specs/examples/inference-llama-2-70b-h100.toml", target)
