"""Serving launch targets (vLLM, SGLang): every flag written is one the engine's own
parser accepts (validation/data/launch/vllm.json and sglang.json, read from the parsers
by validation/launch_arguments.py), the layout follows each engine's rules, and spec ->
launch -> import -> the same plan for every shipped serving example."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from round_trip import decides_unmapped

from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.launch.importing import spec_table
from llmpar.launch.serving import server_words
from llmpar.session import Session

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "specs" / "examples").glob("*.toml"))
ACCEPTED = {name: json.loads((ROOT / f"validation/data/launch/{name}.json").read_text())
            for name in ("vllm", "sglang")}
DEEPSEEK = ROOT / "specs/examples/inference-deepseek-v3-h200.toml"
LLAMA = ROOT / "specs/examples/inference-llama-2-70b-h100.toml"


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(load_entry_points=False, environ={})


def serving_examples(session: Session) -> list[Path]:
    return [path for path in EXAMPLES if session.load_spec(path).inference is not None]


def check_arguments(target: str, command: str) -> dict[str, list[str]]:
    """Every flag is one the engine's parser defines; a switch has no value, a valued flag
    one value of its type, among its choices."""
    accepted = ACCEPTED[target]["arguments"]
    found = server_words(command, "<launch>")
    for flag, values in found.items():
        assert flag in accepted, f"{flag} is not a {target} argument"
        argument = accepted[flag]
        if argument["switch"]:
            assert values == [], flag
            continue
        assert len(values) == 1, flag
        (value,) = values
        if value.startswith("$"):
            continue  # the node's own, expanded by the shell
        if argument["type"] in ("int", "human_readable_int", "human_readable_int_or_auto"):
            int(value)
        elif argument["type"] == "float":
            float(value)
        if argument["choices"] is not None:
            assert value in argument["choices"], (flag, value)
    return found


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_every_serving_example_gives_arguments_the_engines_parser_accepts(
        session: Session, target: str) -> None:
    for path in serving_examples(session):
        launch = session.launch(path, target)
        check_arguments(target, launch.command)
        assert launch.framework_version.endswith(ACCEPTED[target]["version"])


def test_vllm_kv_cache_formats_are_its_cache_dtypes(session: Session) -> None:
    """vLLM's CacheDType (vllm/config/cache.py 0.33.0) includes "auto" and "fp8"; its parser
    records no choices for --kv-cache-dtype, so the values are checked here."""
    for changes in ({}, {"inference.kv_cache": "fp8"}):
        found = server_words(session.launch(LLAMA, "vllm", changes).command, "<launch>")
        assert found["--kv-cache-dtype"] == (["fp8"] if changes else ["auto"])


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_spec_launch_import_gives_the_same_plan(session: Session, target: str) -> None:
    reader = session.launch_targets.find(target)
    checked = []
    for path in serving_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, target)
        read = reader.read(launch.files[0].text, str(path), base)  # type: ignore[attr-defined]
        back = session.load_spec(spec_table(read, base))
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    assert len(checked) == len(serving_examples(session)) >= 8


def test_deepseek_v3_under_attention_dp_and_expert_parallelism(session: Session) -> None:
    """16 GPUs, attention data-parallel over 16, experts over 16: vLLM's EP spans tensor x
    data ranks (vllm/config/parallel.py), SGLang's --attn-dp-size splits --tp-size."""
    vllm = check_arguments("vllm", session.launch(DEEPSEEK, "vllm").command)
    assert vllm["--tensor-parallel-size"] == ["1"] and vllm["--data-parallel-size"] == ["16"]
    assert "--enable-expert-parallel" in vllm
    assert vllm["--max-num-seqs"] == ["32"]  # per replica
    sglang = check_arguments("sglang", session.launch(DEEPSEEK, "sglang").command)
    assert (sglang["--tp-size"], sglang["--attn-dp-size"], sglang["--ep-size"]) == (
        ["16"], ["16"], ["16"])
    assert sglang["--max-running-requests"] == ["512"]  # 32 per attention replica x 16
    assert sglang["--moe-a2a-backend"] == ["deepep"]


def test_a_changed_flag_changes_the_spec(session: Session) -> None:
    """The reader decides what the flags say: a changed value reaches the spec."""
    base = session.load_spec(LLAMA)
    for target, line, key, expected in [
        ("vllm", "vllm serve m --tensor-parallel-size 4 --max-num-seqs 8 "
                 "--max-num-batched-tokens 4096 --kv-cache-dtype fp8", "tensor", 4),
        ("sglang", "python -m sglang.launch_server --model-path m --tp 4 "
                   "--max-running-requests 8 --chunked-prefill-size 4096 "
                   "--kv-cache-dtype fp8_e4m3", "tensor", 4),
    ]:
        read = session.launch_targets.find(target).read(line, "cmd", base)  # type: ignore[attr-defined]
        spec = session.load_spec(spec_table(read, base), {"hardware.num_gpus": 4})
        assert spec.parallel[key].degree == expected
        inference = spec.inference
        assert inference is not None
        assert (inference.batch_size, inference.prefill_chunk_tokens, inference.kv_cache) == (
            8, 4096, "fp8")


@pytest.mark.parametrize(("target", "line", "path"), [
    ("vllm", "--tensor-parallel-size x", r"\$\.--tensor-parallel-size: expected an integer"),
    ("vllm", "--gpu-memory-utilization 1.5", r"\$\.--gpu-memory-utilization: must be in"),
    ("vllm", "--enforce-eager yes", r"\$\.--enforce-eager: is a switch"),
    ("vllm", "--quantization bitsandbytes", r"\$\.--quantization"),
    ("vllm", "--speculative-config '{\"method\": \"eagle\"}'", r"\$\.--speculative-config"),
    ("sglang", "--tp-size 8 --attn-dp-size 3", r"\$\.--attn-dp-size: must divide"),
    ("sglang", "--chunked-prefill-size 0", r"\$\.--chunked-prefill-size"),
    ("sglang", "--kv-cache-dtype nvfp4", r"\$\.--kv-cache-dtype"),
    ("sglang", "--speculative-algorithm EAGLE --speculative-num-steps 3 "
               "--speculative-eagle-topk 4", r"\$\.--speculative-eagle-topk"),
])
def test_a_bad_argument_is_a_spec_error_naming_it(session: Session, target: str, line: str,
                                                  path: str) -> None:
    with pytest.raises(SpecError, match=path):
        session.launch_targets.find(target).read(line, "cmd")  # type: ignore[attr-defined]


def test_import_without_a_base_builds_the_layout(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    line = tmp_path / "serve.sh"
    line.write_text("vllm serve meta-llama/Llama-2-70b-hf --tensor-parallel-size 8 "
                    "--max-num-seqs 16 --gpu-memory-utilization 0.85 --block-size 32 "
                    "--port 8000\n")
    table = Session(load_entry_points=False, environ={}).launch_targets.find("vllm").read(  # type: ignore[attr-defined]
        line.read_text(), str(line))
    assert table.settings["parallel.tensor.degree"] == 8
    assert table.settings["inference.memory_utilization"] == 0.85
    assert any("--port" in note for note in table.notes)


def test_serving_targets_refuse_a_training_spec(session: Session) -> None:
    for target in ("vllm", "sglang"):
        with pytest.raises(SpecError, match=r"\$\.inference: .* serves models"):
            session.launch(ROOT / "specs/examples/gpt3-175b-1024-a100.toml", target)


def test_the_default_target_of_a_serving_spec_is_its_engine(session: Session) -> None:
    assert session.launch(LLAMA).target == "vllm"
    spec = session.load_spec(LLAMA, {"inference.engine": "sglang"})
    assert session.launch(spec).target == "sglang"


def test_what_the_engines_cannot_express_is_listed(session: Session) -> None:
    spec = session.load_spec(ROOT / "specs/examples/serve-llama-3.1-70b-1p1d-h100.toml")
    for target in ("vllm", "sglang"):
        listed = {u.path for u in session.launch(spec, target).unmapped}
        assert "$.inference.disaggregated" in listed
    changes = {"inference.kv_cache": "int8"}
    listed = {u.path: u.value for u in session.launch(LLAMA, "vllm", changes).unmapped}
    assert listed["$.inference.kv_cache"] == "'int8'"


def test_multi_node_lines_expand_the_node_rank(session: Session) -> None:
    command = session.launch(DEEPSEEK, "sglang").command
    first = command.split(" \\\n")[0]
    assert "--node-rank $NODE_RANK" in first and "'$NODE_RANK'" not in command
    assert shlex.split(first)[:3] == ["python", "-m", "sglang.launch_server"]


def test_launch_and_import_through_the_cli(tmp_path: Path) -> None:
    assert main(["launch", str(LLAMA), "--for", "sglang", "-o", str(tmp_path)]) == 0
    out = tmp_path / "spec.toml"
    assert main(["import", str(tmp_path / "serve.sh"), "--from", "sglang", "--base",
                 str(LLAMA), "-o", str(out)]) == 0
    session = Session(load_entry_points=False, environ={})
    assert session.evaluate(out).to_dict() == session.evaluate(LLAMA).to_dict()


HF = json.loads((ROOT / "validation/data/launch/hf-trainer.json").read_text())



def training_examples(session: Session) -> list[Path]:
    return [path for path in EXAMPLES if session.load_spec(path).inference is None]


def test_trainer_and_accelerate_keys_are_the_installed_classes_fields(
        session: Session) -> None:
    """TrainingArguments' fields and FSDPOption values; accelerate's config keys, and
    its fsdp_config / deepspeed_config keys, which are `accelerate launch` options."""
    from llmpar.launch.hf_trainer import load_mapping

    launch_options = set(HF["accelerate_launch_options"])
    for path in training_examples(session):
        launch = session.launch(path, "hf-trainer")
        files = {file.name: file.text for file in launch.files}
        arguments = json.loads(files["training_args.json"])
        assert set(arguments) <= set(HF["training_arguments"]), path
        assert set(arguments.get("fsdp", "").split()) <= set(HF["fsdp_options"])
        assert {f"fsdp_{k}" for k in arguments.get("fsdp_config", {})} <= launch_options
        config = load_mapping(files["accelerate_config.yaml"], "accelerate_config.yaml")
        assert set(config) <= set(HF["accelerate_config_keys"]), path
        for section in ("fsdp_config", "deepspeed_config"):
            assert set(config.get(section, {})) <= launch_options, (path, section)
        assert config["num_processes"] == session.load_spec(path).hardware.num_gpus
        words = shlex.split(launch.command)
        assert words[:2] == ["accelerate", "launch"]
        assert {w.lstrip("-") for w in words if w.startswith("--")} <= launch_options
        if "deepspeed" in arguments:  # the ZeRO stage is the DeepSpeed config's
            assert arguments["deepspeed"] in files


def test_trainer_batch_is_micro_times_accumulation_times_gpus(session: Session) -> None:
    """The Trainer's global batch: per_device_train_batch_size x
    gradient_accumulation_steps x data ranks (transformers' Trainer)."""
    spec = session.load_spec(ROOT / "specs/examples/llama-3-8b-fsdp-8-h100.toml")
    arguments = json.loads(session.launch(spec, "hf-trainer").files[0].text)
    assert arguments["fsdp"] == "full_shard auto_wrap"
    assert (arguments["per_device_train_batch_size"] * arguments["gradient_accumulation_steps"]
            * spec.hardware.num_gpus) == spec.training.global_batch_size


@pytest.mark.parametrize("file", ["training_args.json", "accelerate_config.yaml"])
def test_trainer_spec_launch_import_gives_the_same_plan(session: Session, file: str) -> None:
    """Round trip over every shipped training example the Trainer can express; an example
    is left out when a setting the importer decides was listed as not mapped (selective
    recomputation, which the Trainer lacks)."""
    reader = session.launch_targets.find("hf-trainer")
    checked = []
    for path in training_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, "hf-trainer")
        text = {f.name: f.text for f in launch.files}[file]
        read = reader.read(text, file, base)  # type: ignore[attr-defined]
        if decides_unmapped(launch, read.settings):
            continue
        back = session.load_spec(spec_table(read, base))
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    assert len(checked) >= 11


def test_trainer_import_reads_fsdp_and_deepspeed(session: Session) -> None:
    base = session.load_spec(ROOT / "specs/examples/train-70b-h100.toml")
    reader = session.launch_targets.find("trainer")
    read = reader.read('{"per_device_train_batch_size": 2, "gradient_accumulation_steps": '  # type: ignore[attr-defined]
                       '4, "bf16": true, "gradient_checkpointing": true, '
                       '"fsdp": "full_shard auto_wrap", "fsdp_config": '
                       '{"reshard_after_forward": false}}', "args.json", base)
    assert read.settings["parallel.data.zero"] == 3 and read.settings["parallel.data.fsdp"]
    assert read.settings["parallel.data.reshard_after_forward"] is False
    assert read.settings["training.global_batch_size"] == 2 * 4 * base.hardware.num_gpus
    assert read.settings["training.recompute"] == "full"
    yaml = ("distributed_type: DEEPSPEED\nnum_processes: 16\nmixed_precision: bf16\n"
            "deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: none\n")
    read = reader.read(yaml, "accelerate.yaml", base)  # type: ignore[attr-defined]
    assert (read.settings["parallel.data.zero"], read.settings["hardware.num_gpus"]) == (2, 16)


@pytest.mark.parametrize(("text", "path"), [
    ('{"per_device_train_batch_size": 0}', r"\$\.per_device_train_batch_size"),
    ('{"fsdp": "full_shard wrap_everything_twice"}', r"\$\.fsdp: unknown FSDP options"),
    ("distributed_type: XLA\n", r"\$\.distributed_type: llmpar reads"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 4\n",
     r"\$\.deepspeed_config\.zero_stage"),
    ("distributed_type: FSDP\n- a list item\n", r"line 2"),
    ("{not json", r"\$: not JSON"),
])
def test_a_bad_trainer_value_is_a_spec_error_naming_its_key(session: Session, text: str,
                                                            path: str) -> None:
    with pytest.raises(SpecError, match=path):
        session.launch_targets.find("hf-trainer").read(text, "config")  # type: ignore[attr-defined]


MEGATRON = json.loads((ROOT / "validation/data/launch/megatron-lm.json").read_text())


def stored_namespace(command: str) -> dict[str, object]:
    """The `args` Megatron-LM stores for these flags: each under its parser dest
    (validation/data/launch/megatron-lm.json), a switch as its stored bool, a number as
    a number, plus arguments llmpar does not model and the run's world size."""
    from llmpar.launch.megatron import split_arguments

    stored: dict[str, object] = {"lr": 3e-4, "seed": 1234, "params_dtype": "torch.bfloat16",
                                 "data_path": None}
    for flag, values in split_arguments(command, "<launch>").items():
        accepted = MEGATRON["arguments"][flag]
        if accepted["switch"]:
            stored_false = flag in ("--disable-bias-linear", "--no-overlap-p2p-communication")
            stored[accepted["dest"]] = not stored_false
            continue
        typed = [int(v) if accepted["type"] == "int" else float(v)
                 if accepted["type"] == "float" else v for v in values]
        stored[accepted["dest"]] = typed if accepted["nargs"] is not None else typed[0]
    return stored


def test_a_checkpoints_stored_args_import_to_the_same_plan(session: Session) -> None:
    """spec -> Megatron flags -> the namespace a checkpoint stores (as JSON) -> import ->
    the same plan, for every shipped training example Megatron-LM can express."""
    reader = session.launch_targets.find("megatron")
    checked = []
    for path in training_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, "megatron")
        stored = stored_namespace(launch.files[0].text)
        stored["world_size"] = base.hardware.num_gpus
        read = reader.read(json.dumps(stored), "args.json", base)  # type: ignore[attr-defined]
        if decides_unmapped(launch, {*read.owned, *read.settings}):
            continue
        back = session.load_spec(spec_table(read, base))
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    assert len(checked) >= 13 and "gpt3-175b-1024-a100.toml" in checked


def test_stored_args_in_yaml_and_their_errors_name_the_stored_key(session: Session) -> None:
    reader = session.launch_targets.find("megatron")
    yaml = ("num_layers: 32\nhidden_size: 4096\nnum_attention_heads: 32\nswiglu: true\n"
            "add_bias_linear: false\ntensor_model_parallel_size: 4\nworld_size: 32\n"
            "lr: 0.0003\n")
    read = reader.read(yaml, "args.yaml")  # type: ignore[attr-defined]
    assert read.settings["parallel.tensor.degree"] == 4
    assert read.settings["hardware.num_gpus"] == 32
    assert read.settings["model.linear_bias"] is False
    assert any("lr" in note for note in read.notes)
    with pytest.raises(SpecError, match=r"\$\.num_layers: expected an integer"):
        reader.read('{"num_layers": "many"}', "args.json")  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match=r"\$\.world_size"):
        reader.read('{"num_layers": 2, "world_size": 0}', "args.json")  # type: ignore[attr-defined]
