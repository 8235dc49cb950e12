"""TensorRT-LLM launch target: every trtllm-serve option written is one serve.py defines,
every YAML key a field of the LLM-API class it lands in (validation/data/launch/
trt-llm.json), the layout follows TensorRT-LLM's mapping, and spec -> launch -> import ->
the same plan for every shipped serving example."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest
from validation_scripts import load_script

from llmpar.cli.main import main
from llmpar.errors import SpecError
from llmpar.launch.hf_trainer import load_mapping
from llmpar.launch.importing import imported_spec, spec_table
from llmpar.launch.serving import server_words
from llmpar.session import Session
from llmpar.strategy import Layout

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "specs" / "examples").glob("*.toml"))
DATA = json.loads((ROOT / "validation/data/launch/trt-llm.json").read_text())
DEEPSEEK = ROOT / "specs/examples/inference-deepseek-v3-h200.toml"
LLAMA = ROOT / "specs/examples/inference-llama-2-70b-h100.toml"
MTP = ROOT / "specs/examples/serve-deepseek-v3-mtp-h200.toml"


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(load_entry_points=False, environ={})


def serving_examples(session: Session) -> list[Path]:
    return [path for path in EXAMPLES if session.load_spec(path).inference is not None]


def check_value(key: str, annotation: str, value: object) -> None:
    """A value of the field's annotated type: bool, int, float, a Literal's member, null
    only where Optional."""
    if value is None:
        assert "Optional" in annotation, (key, annotation)
    elif annotation in ("bool",):
        assert isinstance(value, bool), (key, value)
    elif annotation in ("int", "Optional[int]", "PositiveInt", "NonNegativeInt"):
        assert isinstance(value, int) and not isinstance(value, bool), (key, value)
    elif annotation in ("float", "Optional[float]"):
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    elif annotation.startswith("Literal["):
        assert value in ast.literal_eval(annotation.removeprefix("Literal")), (key, value)


def check_launch(files: dict[str, str], command: str) -> dict[str, object]:
    """Every serve option and every YAML key against the committed source data."""
    serve = DATA["serve"]
    for flag, values in server_words(command, "<launch>").items():
        assert flag in serve, f"{flag} is not a trtllm-serve option"
        if serve[flag]["switch"]:
            assert values == [], flag
        else:
            assert len(values) == 1, flag
            if serve[flag]["type"] == "int":
                int(values[0])
            elif serve[flag]["type"] == "float":
                float(values[0])
    table = load_mapping(files["extra-llm-api-config.yml"], "yaml")
    fields = DATA["llm_args"]["TorchLlmArgs"]
    for key, value in table.items():
        assert key in fields, f"{key} is not a TorchLlmArgs field"
        if key == "kv_cache_config":
            assert isinstance(value, dict)
            for inner, setting in value.items():
                assert inner in DATA["llm_args"]["KvCacheConfig"], inner
                check_value(inner, DATA["llm_args"]["KvCacheConfig"][inner], setting)
        elif key == "speculative_config":
            assert isinstance(value, dict)
            kind = {"MTP": "MTPDecodingConfig", "Eagle3": "Eagle3DecodingConfig"}[
                value["decoding_type"]]
            assert set(value) <= set(DATA["llm_args"][kind]), value
        else:
            check_value(key, fields[key], value)
    return table


def test_every_serving_example_gives_options_and_keys_of_the_source(session: Session) -> None:
    for path in serving_examples(session):
        launch = session.launch(path, "trt-llm")
        files = {f.name: f.text for f in launch.files}
        table = check_launch(files, launch.command)
        spec = session.load_spec(path)
        assert table["max_seq_len"] == spec.inference.context_tokens  # type: ignore[union-attr]


def test_deepseek_v3_runs_attention_data_parallel_with_experts_over_the_engine(
        session: Session) -> None:
    """16 GPUs, attention data-parallel over 16, experts over 16: tensor_parallel_size is
    the engine's 16 GPUs, enable_attention_dp, moe_expert_parallel_size x
    moe_tensor_parallel_size = 16 (llm_args.py _ParallelConfig)."""
    launch = session.launch(DEEPSEEK, "trt-llm")
    table = load_mapping(launch.files[0].text, "yaml")
    assert (table["tensor_parallel_size"], table["enable_attention_dp"],
            table["moe_expert_parallel_size"], table["moe_tensor_parallel_size"]) == (
        16, True, 16, 1)
    assert table["max_batch_size"] == 32  # per attention-DP rank, as the spec's per replica
    table = load_mapping(session.launch(MTP, "trt-llm").files[0].text, "yaml")
    assert table["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 1}


@pytest.mark.parametrize("file", ["extra-llm-api-config.yml", "serve.sh"])
def test_spec_launch_import_gives_the_same_plan(session: Session, file: str) -> None:
    """The YAML carries every setting; the line alone only what its options say, so it
    is checked where the YAML adds nothing the line leaves out (no attention DP)."""
    reader = session.launch_targets.find("trt-llm")
    checked = []
    for path in serving_examples(session):
        base = session.load_spec(path)
        launch = session.launch(base, "trt-llm")
        files = {f.name: f.text for f in launch.files}
        if file == "serve.sh" and "enable_attention_dp" in files["extra-llm-api-config.yml"]:
            continue
        read = reader.read(files[file], file, base)  # type: ignore[attr-defined]
        _, back = imported_spec(read, spec_table(read, base), session.load_spec,
                                session.evaluate)
        assert session.evaluate(back).to_dict() == session.evaluate(base).to_dict(), path
        checked.append(path.name)
    assert len(checked) >= (8 if file != "serve.sh" else 6)


def test_free_gpu_memory_fraction_gives_the_cache_the_plan_leaves(session: Session) -> None:
    """TensorRT-LLM's cache is fraction x (memory - the profiled peak of weights,
    activations and non-PyTorch allocations) (_torch/pyexecutor/_util.py
    `_cal_max_memory`). The fraction written makes it what the plan's memory_utilization
    leaves the cache: with the plan's own numbers, cache + weights + workspace + CUDA
    context + NCCL buffers = memory_utilization x capacity."""
    for path in serving_examples(session):
        spec = session.load_spec(path)
        plan = session.evaluate(spec)
        fraction = load_mapping(session.launch(spec, "trt-llm").files[0].text, "yaml")[
            "kv_cache_config"]["free_gpu_memory_fraction"]
        pool = plan.serving[0]
        assert spec.inference is not None and pool.runtime_overhead_bytes is not None
        headroom = (1 - spec.inference.memory_utilization) * plan.capacity_bytes
        runtime = pool.runtime_overhead_bytes - headroom  # context + NCCL buffers
        besides = plan.weights_bytes + (pool.workspace_bytes or 0) + runtime
        cache = fraction * (plan.capacity_bytes - besides)
        assert cache + besides == pytest.approx(
            spec.inference.memory_utilization * plan.capacity_bytes, abs=1.0), path
        assert 0 < fraction <= spec.inference.memory_utilization, path
        assert cache >= (pool.kv_cache_bytes or 0) or not plan.fits, path


def test_an_imported_fraction_sets_the_memory_utilization_of_that_cache(
        session: Session) -> None:
    """The other way: a fraction read over the base gives the memory_utilization whose
    cache is fraction x the memory the spec's weights and activations leave; a fraction
    the plan itself wrote gives its memory_utilization back."""
    base = session.load_spec(LLAMA)
    reader = session.launch_targets.find("trt-llm")
    written = session.launch(base, "trt-llm").files[0].text
    for fraction in (0.5, 0.8, 1.0):
        text = "\n".join(f"  free_gpu_memory_fraction: {fraction}"
                         if "free_gpu_memory_fraction" in line else line
                         for line in written.splitlines())
        read = reader.read(text, "o.yml", base)  # type: ignore[attr-defined]
        assert "inference.memory_utilization" not in read.settings
        _, spec = imported_spec(read, spec_table(read, base), session.load_spec,
                                session.evaluate)
        plan = session.evaluate(spec)
        assert spec.inference is not None
        utilization = spec.inference.memory_utilization
        pool = plan.serving[0]
        assert pool.runtime_overhead_bytes is not None
        runtime = pool.runtime_overhead_bytes - (1 - utilization) * plan.capacity_bytes
        after = plan.capacity_bytes - plan.weights_bytes - (pool.workspace_bytes or 0) - runtime
        assert utilization * plan.capacity_bytes - (plan.capacity_bytes - after) == \
            pytest.approx(fraction * after, abs=1.0)


def test_without_the_plan_the_fraction_is_the_memory_utilization(session: Session) -> None:
    """A target called directly (no plan at hand) writes memory_utilization itself and
    says the cache is then larger than the plan's."""
    from llmpar.launch.trtllm import TrtLlmTarget, cache_fraction, memory_utilization_of

    spec = session.load_spec(LLAMA)
    pool = session.evaluate(spec).serving[0]
    launch = TrtLlmTarget().launch(spec, Layout(degrees=pool.layout, num_gpus=pool.num_gpus))
    table = load_mapping(launch.files[0].text, "yaml")
    assert spec.inference is not None
    assert table["kv_cache_config"]["free_gpu_memory_fraction"] == \
        spec.inference.memory_utilization
    assert any("larger than the plan's" in note for note in launch.notes)
    for utilization in (0.5, 0.85, 0.9, 0.95, 1.0):
        fraction = cache_fraction(utilization, 85.5e9, 61.2e9)
        assert memory_utilization_of(fraction, 85.5e9, 61.2e9) == utilization


@pytest.mark.parametrize(("dtype", "read"), [("fp8_ds_mla", "fp8"), ("float32", "fp32"),
                                             ("bfloat16", "bf16")])
def test_every_cache_dtype_trtllm_takes_that_llmpar_models_is_read(
        session: Session, dtype: str, read: str) -> None:
    """KvCacheConfig.dtype takes "auto", "fp8", "fp8_ds_mla", "nvfp4" or a torch dtype's
    name (llm_args.py `validate_dtype`): each llmpar has a format for reads as it."""
    text = f"kv_cache_config:\n  dtype: {dtype}\n"
    found = session.launch_targets.find("trt-llm").read(  # type: ignore[attr-defined]
        text, "o.yml", session.load_spec(LLAMA))
    assert found.settings["inference.kv_cache"] == read


def test_a_plan_that_leaves_the_cache_nothing_lists_the_fraction(session: Session) -> None:
    """Llama 2 70B on one H100: its weights exceed the GPU, so no fraction gives a cache;
    memory_utilization is listed as not mapped, not turned into a fraction <= 0."""
    spec = session.load_spec(LLAMA, {"parallel.tensor.degree": 1, "hardware.num_gpus": 1})
    launch = session.launch(spec, "trt-llm")
    listed = {u.path: u.reason for u in launch.unmapped}
    assert "leave no memory" in listed["$.inference.memory_utilization"]
    table = load_mapping(launch.files[0].text, "yaml")
    assert 0 < table["kv_cache_config"]["free_gpu_memory_fraction"] <= 1


def test_the_data_lists_every_field_of_the_classes_read() -> None:
    """The committed data comes whole from the sources (no class read in part): the
    inherited BaseLlmArgs fields and TorchLlmArgs' last ones, KvCacheConfig's byte cap
    and DecodingBaseConfig's fields in both decoding configs."""
    assert "partial" not in DATA
    fields = DATA["llm_args"]
    assert {"model", "kv_cache_config", "layer_wise_benchmarks_config",
            "use_cute_dsl_bf16_gemm"} <= set(fields["TorchLlmArgs"])
    assert {"free_gpu_memory_fraction", "max_gpu_total_bytes", "tokens_per_block",
            "block_reuse_config"} <= set(fields["KvCacheConfig"])
    for kind in ("MTPDecodingConfig", "Eagle3DecodingConfig"):
        assert {"max_draft_len", "speculative_model", "max_total_draft_tokens"} <= set(
            fields[kind]), kind
        assert fields[kind]["max_draft_len"] == "Optional[NonNegativeInt]"


def test_a_changed_key_changes_the_spec(session: Session) -> None:
    base = session.load_spec(LLAMA)
    text = ("tensor_parallel_size: 4\nmax_batch_size: 8\nenable_chunked_prefill: true\n"
            "max_num_tokens: 4096\nkv_cache_config:\n  dtype: fp8\n  tokens_per_block: 64\n"
            "cuda_graph_config: null\n")
    read = session.launch_targets.find("trtllm").read(text, "o.yml", base)  # type: ignore[attr-defined]
    spec = session.load_spec(spec_table(read, base), {"hardware.num_gpus": 4})
    inference = spec.inference
    assert inference is not None and spec.parallel["tensor"].degree == 4
    assert (inference.batch_size, inference.prefill_chunk_tokens, inference.kv_cache,
            inference.kv_block_tokens, inference.cuda_graphs) == (8, 4096, "fp8", 64, False)


@pytest.mark.parametrize(("text", "path"), [
    ("tensor_parallel_size: x\n", r"\$\.tensor_parallel_size: expected an integer"),
    ("kv_cache_config:\n  free_gpu_memory_fraction: 1.5\n",
     r"\$\.kv_cache_config\.free_gpu_memory_fraction: must be in"),
    ("tensor_parallel_size: 8\nmoe_expert_parallel_size: 3\n",
     r"\$\.moe_expert_parallel_size: must divide"),
    ("enable_attention_dp: maybe\n", r"\$\.enable_attention_dp: expected true or false"),
    ("speculative_config:\n  decoding_type: MTP\n  max_draft_len: 0\n",
     r"\$\.speculative_config\.max_draft_len"),
    ('trtllm-serve m --tp_size x\n', r"\$\.--tp_size: expected an integer"),
    ("kv_cache_config:\n  dtype: int3\n", r"\$\.kv_cache_config\.dtype: must be one of"),
])
def test_a_bad_value_is_a_spec_error_naming_its_key(session: Session, text: str,
                                                    path: str) -> None:
    with pytest.raises(SpecError, match=path):
        session.launch_targets.find("trt-llm").read(text, "options")  # type: ignore[attr-defined]


def test_what_trtllm_cannot_express_is_listed(session: Session) -> None:
    spec = session.load_spec(ROOT / "specs/examples/serve-llama-3.1-70b-1p1d-h100.toml")
    listed = {u.path for u in session.launch(spec, "trt-llm").unmapped}
    assert "$.inference.disaggregated" in listed
    replicas = session.load_spec(ROOT / "specs/examples/serve-llama-3.1-70b-10-rps-h100.toml")
    listed = {u.path: u.reason for u in session.launch(replicas, "trt-llm").unmapped}
    assert "start 8 servers" in listed["$.parallel.data"]


def test_trtllm_refuses_a_training_spec_and_is_the_trt_llm_engines_default(
        session: Session) -> None:
    with pytest.raises(SpecError, match=r"\$\.inference: .* serves models"):
        session.launch(ROOT / "specs/examples/gpt3-175b-1024-a100.toml", "trt-llm")
    spec = session.load_spec(LLAMA, {"inference.engine": "trt-llm"})
    assert session.launch(spec).target == "trt-llm"


def test_launch_and_import_through_the_cli(tmp_path: Path) -> None:
    assert main(["launch", str(DEEPSEEK), "--for", "trtllm", "-o", str(tmp_path)]) == 0
    assert {"extra-llm-api-config.yml", "serve.sh"} <= {p.name for p in tmp_path.iterdir()}
    out = tmp_path / "spec.toml"
    assert main(["import", str(tmp_path / "extra-llm-api-config.yml"), "--from", "trt-llm",
                 "--base", str(DEEPSEEK), "-o", str(out)]) == 0
    session = Session(load_entry_points=False, environ={})
    assert session.evaluate(out).to_dict() == session.evaluate(DEEPSEEK).to_dict()


def test_a_serving_search_emits_the_launch_of_its_best_layout(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`llmpar search SERVING_SPEC --emit-launch trt-llm`: the best layout's trtllm-serve
    line and YAML after the report, options of the source, its fraction from that
    layout's plan."""
    assert main(["search", str(LLAMA), "--top", "1", "--emit-launch", "trt-llm"]) == 0
    out = capsys.readouterr().out
    launch = out.split("# launch of the best layout for trt-llm\n", 1)[1]
    command, rest = launch.split("# --- extra-llm-api-config.yml", 1)
    yaml_part = rest.split("\n", 1)[1].split("\n# ", 1)[0]
    check_launch({"extra-llm-api-config.yml": yaml_part}, command)
    assert "free_gpu_memory_fraction" in yaml_part


def test_the_source_reader_finds_click_options_and_inherited_fields(tmp_path: Path) -> None:
    """validation/launch_arguments.py's ast reader on a source tree shaped like
    TensorRT-LLM's: click options with their aliases and flags, pydantic fields with their
    bases' first, a ClassVar and a private attribute left out."""
    script = load_script("launch_arguments")
    (tmp_path / "tensorrt_llm/commands").mkdir(parents=True)
    (tmp_path / "tensorrt_llm/llmapi").mkdir(parents=True)
    (tmp_path / "tensorrt_llm/version.py").write_text('__version__ = "9.9"\n')
    (tmp_path / "tensorrt_llm/commands/serve.py").write_text(textwrap.dedent('''
        import click
        @click.command("serve")
        @click.option("--tensor_parallel_size", "--tp_size", type=int, default=1)
        @click.option("--trust_remote_code", is_flag=True, default=False)
        @click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", type=str)
        def serve(tensor_parallel_size, trust_remote_code, extra_llm_api_options):
            pass
        '''))
    classes = "".join(f"class {name}(Base):\n    {name.lower()}_field: int = 1\n"
                      for name in script.TRT_LLM_CLASSES)
    (tmp_path / "tensorrt_llm/llmapi/llm_args.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        from .base import StrictBaseModel
        class Base(StrictBaseModel):
            shared: bool = False
            kind: ClassVar[str] = "x"
            _private: int = 0
        ''') + classes)
    (tmp_path / "tensorrt_llm/llmapi/base.py").write_text(
        "class StrictBaseModel:\n    strict: bool = True\n")
    data = script.trt_llm(tmp_path, "abc")
    assert data["version"] == "9.9"
    assert data["serve"]["--tp_size"] == {"dest": "tensor_parallel_size", "switch": False,
                                          "type": "int"}
    assert data["serve"]["--trust_remote_code"]["switch"] is True
    assert data["serve"]["--config"]["dest"] == "extra_llm_api_options"
    assert list(data["llm_args"]["KvCacheConfig"]) == ["kvcacheconfig_field", "shared",
                                                       "strict"]


def test_the_yaml_reads_the_same_with_pyyaml(session: Session) -> None:
    """trtllm-serve reads the file with yaml.safe_load (serve.py): PyYAML, where it is
    installed, reads every written file as llmpar does."""
    yaml = pytest.importorskip("yaml")
    for path in serving_examples(session):
        text = session.launch(path, "trt-llm").files[0].text
        assert yaml.safe_load(text) == load_mapping(text, "yaml"), path
