"""Hugging Face config.json import: exact counts against measured data, presets, the CLI,
`[model] hf_config`, and errors that name the key."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import attrs
import pytest

import llmpar
from llmpar.cli.main import main
from llmpar.footprint.parameters import count_parameters
from llmpar.hf import SUPPORTED_MODEL_TYPES, model_table_from_hf

VALIDATION = Path(__file__).resolve().parent.parent / "validation"
CONFIGS = sorted((VALIDATION / "configs").glob("*.json"))
NOT_ARCHITECTURES = {"peft_counts.json": "tests/test_finetune.py",
                     "memory_peak.json": "tests/test_memory_peak.py",
                     "finetune_peak.json": "tests/test_finetune_validation.py",
                     "compiled_loss.json": "tests/test_chunked_cross_entropy.py",
                     "memory_peak_fsdp.json": "tests/test_memory_peak.py",
                     "legacy_profiles.json": "tests/test_legacy_profiles.py"}
"""Measurements in validation/data/ that are not of one architecture, and their tests."""
MEASURED = sorted(path for path in (VALIDATION / "data").glob("*.json")
                  if path.name not in NOT_ARCHITECTURES)
SESSION = llmpar.Session(load_entry_points=False)
GPU = {"gpu": "h100-sxm"}
SHORT = {"sequence_length": 512}  # within GPT-2's and BERT's learned position tables


def measured_parameters(path: Path) -> dict | None:
    data = json.loads(path.read_text())
    return data.get("parameters_full_config")


def config_of(path: Path) -> Path:
    data = json.loads(path.read_text())
    name = data.get("published_config_file")
    return VALIDATION.parent / name if name else VALIDATION / "configs" / path.name


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_counts_equal_measured_transformers_models(path):
    # validation/data/<arch>.json: parameters of the transformers model built on the meta
    # device from the published config (validation/measure_hf.py), total and by group.
    measured = measured_parameters(path)
    if measured is None or "total_params" not in measured:
        pytest.skip(f"{path.name} has no measured parameter count")
    count = count_parameters(llmpar.model_from_hf(config_of(path)))
    assert count.total == measured["total_params"]
    ours = {group: n for group, n in count.by_group.items() if n}
    theirs = {group: n for group, n in measured.get("by_group_params", {}).items() if n}
    if theirs:
        assert ours == theirs


def preset_names() -> set[str]:
    return set(SESSION.presets.names("models"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_presets_are_the_import_of_their_config(path):
    if path.stem not in preset_names():
        pytest.skip(f"no preset {path.stem}")
    spec = SESSION.load_spec({"model": path.stem, "hardware": GPU, "training": SHORT})
    imported = llmpar.model_from_hf(path)
    unlabelled = {"name": "", "source": ""}
    assert attrs.evolve(spec.model, **unlabelled) == attrs.evolve(imported, **unlabelled)
    assert spec.model.source.startswith(model_table_from_hf(path)["source"])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_import_hf_toml_loads_back_to_the_same_count(path, capsys):
    assert main(["import-hf", str(path)]) == 0
    table = tomllib.loads(capsys.readouterr().out)
    spec = llmpar.load_spec({"model": table, "hardware": GPU, "training": SHORT})
    expected = count_parameters(llmpar.model_from_hf(path)).total
    assert count_parameters(spec.model).total == expected


def test_import_hf_writes_a_file(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN15_MOE))
    out = tmp_path / "model.toml"
    assert main(["import-hf", str(config), "-o", str(out)]) == 0
    assert "14,315,784,192 parameters" in capsys.readouterr().err
    assert tomllib.loads(out.read_text())["moe"]["shared_expert_gate"] is True


# Published configs not in validation/configs, values of their config.json.
QWEN15_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B
    "model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "vocab_size": 151936, "tie_word_embeddings": False, "hidden_act": "silu",
    "use_sliding_window": False, "max_position_embeddings": 8192,
}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 1408,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 102400,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "max_position_embeddings": 163840,
}
GEMMA3_1B = {  # google/gemma-3-1b-pt
    "model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
    "sliding_window_pattern": 6, "max_position_embeddings": 32768,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "final_logit_softcapping": None, "attn_logit_softcapping": None,
}
GEMMA3_4B = {  # google/gemma-3-4b-pt: the text_config leaves most keys at their defaults
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                    "intermediate_size": 10240, "num_hidden_layers": 34,
                    "sliding_window": 1024},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}


@pytest.mark.parametrize(
    ("config", "total"),
    [
        # Qwen1.5-MoE-A2.7B: 14.3B; a shared expert of 5632 behind a gate, qkv biases.
        (QWEN15_MOE, 14_315_784_192),
        # DeepSeek-V2-Lite: 15.7B; MLA without a query latent (q_lora_rank null).
        (DEEPSEEK_V2_LITE, 15_706_484_224),
        # Gemma 3 1B: 999,885,952 (1B), tied, per-head q/k norms, four norms per block.
        (GEMMA3_1B, 999_885_952),
        # Gemma 3 4B's language model: its 4,300,079,472 less the SigLIP vision tower
        # (416,866,032) and the projector (2,950,272).
        (GEMMA3_4B, 3_880_263_168),
    ],
    ids=["qwen2_moe", "deepseek_v2", "gemma3_text", "gemma3"],
)
def test_published_totals_of_inline_configs(config, total):
    assert count_parameters(llmpar.model_from_hf(config)).total == total


def test_gemma3_pattern_from_layer_types():
    types = ["sliding_attention"] * 5 + ["full_attention"]
    config = {**GEMMA3_1B, "sliding_window_pattern": None, "layer_types": types * 2}
    model = llmpar.model_from_hf(config)
    assert model.sliding_window_pattern == 6
    assert [model.is_sliding_window_layer(i) for i in range(6)] == [True] * 5 + [False]


def test_deepseek_v2_lite_groups():
    groups = count_parameters(llmpar.model_from_hf(DEEPSEEK_V2_LITE)).by_group
    h, a = 2048, 16
    attention = h * a * 192 + h * 576 + 512 + 512 * a * 256 + a * 128 * h
    assert groups["attention"] == 27 * attention
    assert groups["shared_experts"] == 26 * 2 * 3 * h * 1408
    assert groups["mlp"] == 3 * h * 10944


def test_model_from_hf_names_the_repository(tmp_path):
    model = llmpar.model_from_hf(VALIDATION / "configs" / "llama-3-8b.json") if CONFIGS else None
    if model is not None:
        assert model.name == "meta-llama/Meta-Llama-3-8B"
    assert llmpar.model_from_hf(QWEN15_MOE).name == "custom"


def problems_of(config) -> list[tuple[str, str]]:
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf(config)
    return [(p.path, p.message) for p in caught.value.problems]


def test_unknown_model_type_lists_the_supported_ones():
    [(path, message)] = problems_of({"model_type": "rwkv", "hidden_size": 1})
    assert path == "$.model_type"
    assert "'rwkv'" in message
    assert all(name in message for name in SUPPORTED_MODEL_TYPES)
    assert {"llama", "deepseek_v3", "gemma3", "bert", "gpt2"} <= set(SUPPORTED_MODEL_TYPES)


def test_missing_keys_are_named_with_the_model_type():
    config = {k: v for k, v in QWEN15_MOE.items()
              if k not in ("num_hidden_layers", "num_experts")}
    problems = problems_of(config)
    assert ("$.num_hidden_layers", "required for model_type 'qwen2_moe'") in problems
    assert ("$.num_experts", "required for model_type 'qwen2_moe' (or num_local_experts)"
            ) in problems


def test_missing_gpt2_key_uses_the_gpt2_name():
    assert problems_of({"model_type": "gpt2", "n_embd": 768, "n_head": 12,
                        "vocab_size": 50257, "n_positions": 1024}) == [
        ("$.n_layer", "required for model_type 'gpt2'")]


@pytest.mark.parametrize(
    ("change", "path", "fragment"),
    [
        ({"num_hidden_layers": "24"}, "$.num_hidden_layers", "expected an integer, got '24'"),
        ({"hidden_act": "tanh"}, "$.hidden_act", "got 'tanh'"),
        ({"mlp_only_layers": [3]}, "$.mlp_only_layers", "only [] is supported"),
        ({"use_sliding_window": True}, "$.use_sliding_window", "only false"),
        ({"tie_word_embeddings": "no"}, "$.tie_word_embeddings", "expected true or false"),
    ],
)
def test_bad_values_name_the_key(change, path, fragment):
    [(where, message)] = problems_of({**QWEN15_MOE, **change})
    assert where == path
    assert fragment in message and "qwen2_moe" in message


def test_bert_without_a_language_model_head_is_refused():
    [(path, message)] = problems_of({"model_type": "bert", "architectures": ["BertModel"],
                                     "hidden_size": 8, "num_hidden_layers": 1,
                                     "num_attention_heads": 1, "intermediate_size": 8,
                                     "vocab_size": 8, "max_position_embeddings": 8})
    assert path == "$.architectures" and "BertForMaskedLM" in message


def test_gemma3_without_text_config():
    [(path, _)] = problems_of({"model_type": "gemma3"})
    assert path == "$.text_config"


def test_unreadable_files(tmp_path):
    assert problems_of(tmp_path / "missing.json") == [("$", "file not found")]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    [(path, message)] = problems_of(bad)
    assert path == "$" and "not valid JSON" in message
    assert problems_of({"hidden_size": 8})[0][0] == "$.model_type"


def test_cli_reports_errors_with_exit_2(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    assert main(["import-hf", str(config)]) == 2
    err = capsys.readouterr().err
    assert "$.num_hidden_layers" in err and "'llama'" in err and str(config) in err


def test_spec_with_hf_config_relative_to_the_spec(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(DEEPSEEK_V2_LITE))
    spec = tmp_path / "run.toml"
    spec.write_text('[model]\nhf_config = "models/config.json"\nname = "v2-lite"\n'
                    '[hardware]\ngpu = "h100-sxm"\n')
    model = llmpar.load_spec(spec).model
    assert model.name == "v2-lite"
    assert count_parameters(model).total == 15_706_484_224
    overridden = llmpar.load_spec(spec, {"model.num_layers": 2}).model
    assert overridden.num_layers == 2 and overridden.mla == model.mla


def test_spec_with_a_bad_hf_config_names_the_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    spec = tmp_path / "run.toml"
    spec.write_text('[model]\nhf_config = "config.json"\n[hardware]\ngpu = "h100-sxm"\n')
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.load_spec(spec)
    [problem] = caught.value.problems
    assert problem.path == "$.model.hf_config"
    assert "$.model_type" in problem.message and "'mamba'" in problem.message


def test_a_qwen3_moe_config_as_transformers_5_writes_it():
    # transformers 5 writes Qwen3-MoE's routed experts as num_local_experts.
    config = json.loads((VALIDATION / "configs" / "qwen3-30b-a3b.json").read_text())
    renamed = {("num_local_experts" if k == "num_experts" else k): v for k, v in config.items()}
    assert model_table_from_hf(renamed) == model_table_from_hf(config)
    neither = {k: v for k, v in config.items() if k != "num_experts"}
    with pytest.raises(llmpar.SpecError, match="num_local_experts"):
        model_table_from_hf(neither)


def published(name: str) -> dict:
    values = json.loads((VALIDATION / "configs" / f"{name}.json").read_text())
    return {k: v for k, v in values.items() if not k.startswith("_")}


@pytest.mark.parametrize(("name", "fraction"), [
    ("phi-4-mini", 0.75), ("glm-4.5-air", 0.5), ("minimax-m2", 0.5),
    ("qwen3-next-80b-a3b", 0.25), ("qwen3.5-27b", 0.25), ("llama-3-8b", None),
    ("deepseek-v3", None)])
def test_rotary_fraction_of_the_published_configs(name, fraction):
    # partial_rotary_factor (Phi-4-mini, GLM-4.5, Qwen3-Next; Qwen3.5 in text_config and
    # its rope_parameters), MiniMax-M2's rotary_dim 64 of head_dim 128; none for Llama 3
    # (the whole head) or DeepSeek-V3 (MLA's qk_rope_head_dim)
    assert model_table_from_hf(published(name)).get("rotary_fraction") == fraction


def test_rotary_fraction_is_read_from_every_spelling():
    # transformers 5.24.0's PreTrainedConfig.convert_rope_params_to_dict: rope_scaling (4.x)
    # or rope_parameters (5.x) first, one table or one per layer type, then the top-level
    # key; Glm4MoeConfig and Qwen3NextConfig default to 0.5 and 0.25 without one
    llama = published("llama-3-8b")
    base = {k: v for k, v in llama.items() if k not in ("rope_scaling", "rope_theta")}
    spellings = [
        {"partial_rotary_factor": 0.5},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                             "partial_rotary_factor": 0.5}},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0,
                          "partial_rotary_factor": 0.5}, "partial_rotary_factor": 0.25},
        {"rope_parameters": {kind: {"rope_type": "default", "partial_rotary_factor": 0.5}
                             for kind in ("full_attention", "sliding_attention")}},
    ]
    for spelling in spellings:
        assert model_table_from_hf({**base, **spelling})["rotary_fraction"] == 0.5, spelling
    assert "rotary_fraction" not in model_table_from_hf({**base, "partial_rotary_factor": 1})
    glm = {k: v for k, v in published("glm-4.5-air").items() if k != "partial_rotary_factor"}
    assert model_table_from_hf(glm)["rotary_fraction"] == 0.5
    qwen = {k: v for k, v in published("qwen3-next-80b-a3b").items()
            if k != "partial_rotary_factor"}
    assert model_table_from_hf(qwen)["rotary_fraction"] == 0.25
    # rotary_dim is MiniMax-M2's spelling only: LlamaConfig does not read it
    assert "rotary_fraction" not in model_table_from_hf({**base, "rotary_dim": 64})


@pytest.mark.parametrize(("change", "path", "fragment"), [
    ({"partial_rotary_factor": 0}, "$.partial_rotary_factor", "expected a number in (0, 1]"),
    ({"partial_rotary_factor": "half"}, "$.partial_rotary_factor", "got 'half'"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.5}},
     "$.rope_parameters.partial_rotary_factor", "got 1.5"),
    ({"rope_parameters": {"full_attention": {"partial_rotary_factor": 0.5},
                          "sliding_attention": {"partial_rotary_factor": 0.25}}},
     "$.rope_parameters", "one partial_rotary_factor for every layer type"),
])
def test_bad_rotary_fractions_name_the_key(change, path, fragment):
    llama = {k: v for k, v in published("llama-3-8b").items() if k != "rope_scaling"}
    [(where, message)] = problems_of({**llama, **change})
    assert where == path and fragment in message and "'llama'" in message


def test_minimax_rotary_dim_past_the_head_names_the_key():
    [(where, message)] = problems_of({**published("minimax-m2"), "rotary_dim": 256})
    assert where == "$.rotary_dim" and "head_dim (128)" in message


def with_layer(values: dict, at: int, kind: object) -> dict:
    """`values` with one entry of its (text config's) layer_types replaced."""
    text = values.get("text_config", values)
    kinds = list(text["layer_types"])
    kinds[at] = kind
    changed = {**text, "layer_types": kinds}
    return {**values, "text_config": changed} if "text_config" in values else changed


@pytest.mark.parametrize(("config", "path", "fragment"), [
    # a count the importer divides by or builds per-layer lists from
    ({**published("olmo-2-7b"), "num_attention_heads": 0}, "$.num_attention_heads",
     "expected an integer of at least 1, got 0"),
    ({**published("llama-3-8b"), "num_hidden_layers": 10**12}, "$.num_hidden_layers",
     "at most 100,000"),
    # a layer kind that is not a name (a list or a table cannot be hashed)
    (with_layer(published("qwen3.5-35b-a3b"), 3, {"a": 1}), "$.text_config.layer_types",
     "expected layer kinds among"),
    (with_layer(published("gpt-oss-120b"), 2, ["full_attention"]), "$.layer_types",
     "expected sliding_attention layers"),
])
def test_malformed_published_configs_name_the_key(config, path, fragment):
    [(where, message)] = problems_of(config)
    assert where == path and fragment in message
