"""The model catalogue: presets written from published config.json files, their parameter
counts against the figures their publishers state and against transformers, short names,
a model read from a TOML file, and the model types of 2025 (gpt-oss, Llama 4, GLM-4.5,
ERNIE 4.5, MiniMax-M2, SmolLM3, OLMo 3, Mistral 3) with their measured FLOPs."""

from __future__ import annotations

import json
import re
import tomllib
from decimal import Decimal
from pathlib import Path

import attrs
import pytest
from validation_scripts import load_script

import llmpar
from llmpar.footprint.parameters import count_parameters
from llmpar.hf import model_table_from_hf

WRITER = load_script("write_presets")
FLOP_TERMS = load_script("flop_terms")
CITED = WRITER.cited_configs()
SESSION = llmpar.Session(load_entry_points=False)
UNITS = {"M": Decimal(10) ** 6, "B": Decimal(10) ** 9, "T": Decimal(10) ** 12}


def stated_of(path: Path) -> dict[str, str]:
    return json.loads(path.read_text(encoding="utf-8")).get("_stated_parameters", {})


STATED = [(path, kind) for path in CITED for kind in stated_of(path) if kind != "where"]


def figure(text: str) -> tuple[Decimal, Decimal]:
    """A stated figure ("14.8B") as a count and one unit of its last digit (0.1e9)."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?([MBT])", text)
    assert match, text
    whole, fraction, unit = match.groups()
    digits = len(fraction or "")
    return (Decimal(f"{whole}.{fraction or 0}") * UNITS[unit],
            UNITS[unit] / Decimal(10) ** digits)


def test_at_least_45_model_presets():
    assert len(SESSION.presets.names("models")) >= 45


@pytest.mark.parametrize("config", CITED, ids=lambda p: p.stem)
def test_each_preset_is_what_its_config_writes(config):
    # specs/models/<name>.toml is `llmpar import-hf` of validation/configs/<name>.json plus
    # its citation (validation/write_presets.py), so a preset cannot drift from its config.
    preset = SESSION.presets.path("models", config.stem)
    assert preset.read_text(encoding="utf-8") == WRITER.preset_text(config)


@pytest.mark.parametrize(("config", "kind"), STATED, ids=lambda x: getattr(x, "stem", x))
def test_counts_agree_with_the_publishers_figures(config, kind):
    # `_stated_parameters` are the figures of the model card or paper named in `where`,
    # rounded (or cut) to their last digit: the count must lie within one unit of it.
    # "non_embedding": without the input embedding and the output layer (Qwen's and
    # Gemma 3's convention: Qwen3-0.6B 0.6B in all, 0.44B without its tied embedding);
    # "active_non_embedding" the active ones so (GLM-4.5); "active_less_embedding" the
    # active ones without the input embedding, a lookup (gpt-oss's model card, Table 1).
    count = count_parameters(llmpar.model_from_hf(config))
    embedding = count.by_group.get("embedding", 0)
    tables = embedding + count.by_group.get("head", 0)
    counted = {"total": count.total, "active": count.active,
               "non_embedding": count.total - tables,
               "active_non_embedding": count.active - tables,
               "active_less_embedding": count.active - embedding}[kind]
    value, unit = figure(stated_of(config)[kind])
    assert abs(Decimal(int(counted)) - value) < unit, (kind, counted, value)


CHECKS = WRITER.ROOT / "validation" / "data" / "config_checks.toml"
OUTCOMES = ("matched", "corrected: ", "partly: ", "not checked: ")


def test_every_config_records_the_copy_it_was_checked_against():
    # validation/data/config_checks.toml: one row per validation/configs/*.json naming the
    # copy of the published config.json its count-changing values were compared with
    # (repository, path and commit) and the outcome. A config not checked against the
    # published file says so in its note, and a preset written from it in its source.
    rows = tomllib.loads(CHECKS.read_text(encoding="utf-8"))["config"]
    names = [row["name"] for row in rows]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(path.stem for path in WRITER.CONFIGS.glob("*.json"))
    for row in rows:
        assert row["result"].startswith(OUTCOMES), row
        config = json.loads((WRITER.CONFIGS / f"{row['name']}.json").read_text(encoding="utf-8"))
        if row["result"].startswith("not checked"):
            assert row["checked_against"] == row["commit"] == ""
            assert "not checked against the published" in config["_note"]
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]), row
            assert row["commit"][:12] in config["_note"], row["name"]
        if row["result"].startswith(("partly", "not checked")) and "_cite" in config:
            source = SESSION.load_spec({"model": row["name"],
                                        "hardware": {"gpu": "h100-sxm"}}).model.source
            assert "not checked against the published config.json" in source, row["name"]


def test_deepseek_r1_is_deepseek_v3():
    r1, v3 = (SESSION.load_spec({"model": name, "hardware": {"gpu": "h100-sxm"}}).model
              for name in ("deepseek-r1", "deepseek-v3"))
    assert count_parameters(r1) == count_parameters(v3)


def test_kimi_k2_is_read_as_deepseek_v3():
    # Kimi K2's config.json says model_type "kimi_k2" over DeepSeek-V3's modeling code.
    model = llmpar.model_from_hf(WRITER.CONFIGS / "kimi-k2.json")
    assert model.moe is not None and model.moe.num_experts == 384
    assert model.mla is not None and model.mla.kv_lora_rank == 512


def test_a_model_file_in_a_subfolder_is_read_relative_to_the_spec(tmp_path):
    # `[model] file = "models/x.toml"` names a TOML file beside the spec; a preset name
    # stays a name.
    (tmp_path / "models").mkdir()
    preset = SESSION.presets.path("models", "qwen3-0.6b").read_text(encoding="utf-8")
    (tmp_path / "models" / "mine.toml").write_text(preset, encoding="utf-8")
    spec = tmp_path / "run.toml"
    spec.write_text('[model]\nfile = "models/mine.toml"\nnum_layers = 2\n'
                    '[hardware]\ngpu = "h100-sxm"\n', encoding="utf-8")
    model = llmpar.load_spec(spec).model
    reference = SESSION.load_spec({"model": "qwen3-0.6b", "hardware": {"gpu": "h100-sxm"}},
                                  {"model.num_layers": 2}).model
    assert count_parameters(model) == count_parameters(reference)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    moved = elsewhere / "run.toml"
    moved.write_text(spec.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.load_spec(moved)
    [problem] = caught.value.problems
    assert problem.path == "$.model.file" and "file not found" in problem.message


# --- short names -----------------------------------------------------------------------

def resolved(kind: str, name: str) -> str:
    return SESSION.presets.path(kind, name).stem


@pytest.mark.parametrize(("kind", "name", "preset"), [
    ("models", "llama-3.1-70b", "llama-3.1-70b"),      # a full name is itself
    ("models", "Llama-3.1-70B", "llama-3.1-70b"),      # case and separators do not count
    ("models", "llama3.1-70b", "llama-3.1-70b"),
    ("models", "qwen3_32b", "qwen3-32b"),
    ("models", "qwen3-30b", "qwen3-30b-a3b"),          # the one preset it begins
    ("models", "mistral-large-2", "mistral-large-2-123b"),
    ("models", "kimi", "kimi-k2"),
    ("models", "phi-4", "phi-4"),                      # a full name wins over phi-4-mini
    ("gpus", "h200", "h200-sxm"),
    ("optimizers", "sgd", "sgd-momentum"),
])
def test_a_short_name_resolves_to_the_one_preset_it_names(kind, name, preset):
    assert resolved(kind, name) == preset


def test_a_spec_with_short_names_reads_the_presets_under_their_own_names():
    spec = SESSION.load_spec({"model": "qwen3-30b", "hardware": {"gpu": "h200"}})
    assert spec.model.name == "qwen3-30b-a3b" and spec.hardware.gpu.name == "h200-sxm"
    full = SESSION.load_spec({"model": "qwen3-30b-a3b", "hardware": {"gpu": "h200-sxm"}})
    assert spec == full


@pytest.mark.parametrize(("kind", "name", "candidates"), [
    # ranked as did-you-mean ranks the names a word begins: nearest in length first
    ("gpus", "h100", ["h100-sxm", "h100-pcie"]),
    ("gpus", "a100", ["a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb"]),
    ("models", "gemma-3", ["gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"]),
    ("models", "deepseek", ["deepseek-r1", "deepseek-v3", "deepseek-v3.2-exp"]),
])
def test_a_short_name_of_several_presets_is_an_error_listing_them(kind, name, candidates):
    section = {"models": "model", "gpus": "hardware.gpu"}[kind]
    spec = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}}
    if kind == "models":
        spec["model"] = name
    else:
        spec["hardware"]["gpu"] = name
    with pytest.raises(llmpar.SpecError) as caught:
        SESSION.load_spec(spec)
    [problem] = caught.value.problems
    assert problem.path == f"$.{section}"
    listed = " or ".join(repr(c) for c in candidates)
    assert problem.message == (f"no {kind[:-1]} preset named {name!r}: a short name of "
                               f"{len(candidates)} presets; give one (did you mean {listed}?)")


def test_a_name_cut_inside_a_word_is_no_short_name_but_a_did_you_mean():
    # "h10" and "llama-3.1-70" stop inside a word: no alias, the nearest names first.
    for kind, name, first in [("gpus", "h10", "h100-sxm"), ("models", "llama-3.1-70",
                                                           "llama-3.1-70b")]:
        with pytest.raises(llmpar.loading.presets.PresetNotFound) as caught:
            SESSION.presets.path(kind, name)
        assert not caught.value.candidates
        assert caught.value.message().startswith(
            f"no {kind[:-1]} preset named {name!r} (did you mean {first!r}")


def test_an_example_is_named_in_full():
    example = SESSION.presets.names("examples")[0]
    with pytest.raises(llmpar.loading.presets.PresetNotFound):
        SESSION.presets.path("examples", example[:-3])


def test_presets_show_lists_the_candidates(capsys):
    from llmpar.cli.main import main

    assert main(["presets", "show", "h100"]) != 0
    assert "(did you mean 'h100-sxm' or 'h100-pcie'?)" in capsys.readouterr().err
    assert main(["presets", "show", "kimi"]) == 0
    assert "# model preset 'kimi-k2'" in capsys.readouterr().out


# --- model types of 2025 ----------------------------------------------------------------

def config_of(name: str) -> dict:
    return json.loads((WRITER.CONFIGS / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("name", "mlp", "attention", "tables"), [
    # gpt-oss model card (arXiv:2508.10925), Table 1, in billions: MLP (experts and
    # router), attention (with the sinks), embedding and unembedding.
    ("gpt-oss-20b", "19.12B", "0.64B", "1.16B"),
    ("gpt-oss-120b", "114.71B", "0.96B", "1.16B"),
])
def test_gpt_oss_components_agree_with_its_model_card(name, mlp, attention, tables):
    groups = count_parameters(llmpar.model_from_hf(config_of(name))).by_group
    counted = {"mlp": groups["experts"] + groups["router"], "attention": groups["attention"],
               "tables": groups["embedding"] + groups["head"]}
    for kind, text in {"mlp": mlp, "attention": attention, "tables": tables}.items():
        value, unit = figure(text)
        assert abs(Decimal(counted[kind]) - value) < unit, kind


def test_gpt_oss_attention_by_hand():
    # GptOssAttention: q/k/v/o with biases and a sink logit per head; h 2880, 64 query
    # heads and 8 kv heads of 64.
    model = llmpar.model_from_hf(config_of("gpt-oss-20b"))
    h, q, kv = 2880, 64 * 64, 8 * 64
    per_layer = (h * q + q) + 2 * (h * kv + kv) + (q * h + h) + 64
    assert count_parameters(model).by_group["attention"] == 24 * per_layer
    assert [model.is_sliding_window_layer(i) for i in range(4)] == [True, False] * 2
    assert model.moe is not None and model.moe.router_bias and model.mlp_bias


def test_gpt_oss_windowed_layers_cap_their_cache():
    # 12 of 24 layers attend within 128 tokens: past the window only the 12 full layers
    # grow, 2 (K and V) x 8 heads x 64 x 2 bytes a token each.
    def cache(prompt: int) -> int:
        plan = SESSION.evaluate({"model": "gpt-oss-20b", "hardware": {"gpu": "h100-sxm"},
                                 "inference": {"batch_size": 2, "prompt_tokens": prompt,
                                               "generated_tokens": 1, "weights": "bf16",
                                               "kv_cache": "bf16"}})
        assert plan.kv_cache_bytes is not None
        return plan.kv_cache_bytes
    per_token_layer = 2 * 8 * 64 * 2
    assert cache(63) == 2 * 64 * 24 * per_token_layer
    assert cache(3071) - cache(1023) == 2 * 2048 * 12 * per_token_layer


def test_unmeasured_transformers_code_has_no_hf_activations():
    # OLMo 3's modeling code (Olmo3ForCausalLM) is not measured
    spec = SESSION.load_spec({"model": "olmo-2-7b", "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 512,
                                           "activation_model": "hf-eager"}})
    olmo3 = attrs.evolve(spec.model, source="counted as transformers' Olmo3ForCausalLM")
    plan = SESSION.evaluate(attrs.evolve(spec, model=olmo3))
    assert any("Olmo3ForCausalLM keeps for backward is not measured" in warning
               for warning in plan.warnings)
    fused = SESSION.evaluate({"model": "gpt-oss-20b", "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 512, "activation_model": "fused"}})
    assert fused.activations_bytes > 0


def test_smollm3_nope_layers_count_as_llama():
    # NoPE layers skip RoPE: no parameter changes; the same dims as a Llama config count
    # the same.
    config = {k: v for k, v in config_of("smollm3-3b").items() if not k.startswith("_")}
    llama = {**config, "model_type": "llama", "tie_word_embeddings": True}
    assert (count_parameters(llmpar.model_from_hf(config))
            == count_parameters(llmpar.model_from_hf(llama)))


def test_glm_4_5_biases_on_q_k_v_only_and_dense_first_layers():
    model = llmpar.model_from_hf(config_of("glm-4.5"))
    groups = count_parameters(model).by_group
    h, q, kv = 5120, 96 * 128, 8 * 128
    per_layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 2 * 128  # + per-head q/k norms
    assert groups["attention"] == 92 * per_layer
    assert groups["mlp"] == 3 * 3 * h * 12288
    assert groups["shared_experts"] == 89 * 3 * h * 1536


def test_ernie_moe_layers_from_start_index_and_interval():
    config = {k: v for k, v in config_of("ernie-4.5-21b-a3b").items()
              if not k.startswith("_")}
    model = llmpar.model_from_hf({**config, "moe_layer_interval": 2})
    assert [model.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    with pytest.raises(llmpar.SpecError, match="moe_layer_end_index"):
        llmpar.model_from_hf({**config, "moe_layer_end_index": 20})


def test_olmo3_windows_from_layer_types():
    # Olmo3ForCausalLM: OLMo 2's block, three windowed layers to one full one.
    config = {**{k: v for k, v in config_of("olmo-2-13b").items() if not k.startswith("_")},
              "model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"],
              "sliding_window": 4096,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    config["layer_types"] *= config["num_hidden_layers"] // 4
    model = llmpar.model_from_hf(config)
    assert (model.sliding_window, model.sliding_window_pattern) == (4096, 4)
    olmo2 = llmpar.model_from_hf(config_of("olmo-2-13b"))
    assert count_parameters(model) == count_parameters(olmo2)
    every = {**config, "layer_types": ["full_attention"] * 40}
    assert llmpar.model_from_hf(every).sliding_window is None
    with pytest.raises(llmpar.SpecError, match="layer_types"):
        llmpar.model_from_hf({**config, "layer_types": ["full_attention", "sliding_attention"]
                              * 20})


@pytest.mark.parametrize(("model_type", "fragment"), [
    ("zamba2", "shared attention blocks"),
    ("falcon_mamba", "Mamba (version 1) state-space layers"),
    ("jamba", "Mamba (version 1) state-space layers"),
    ("qwen2_5_vl", "multimodal towers are out of scope"),
    ("some_new_vlm", "multimodal towers are out of scope"),
])
def test_unsupported_mechanisms_are_named(model_type, fragment):
    config = {"model_type": model_type, "hidden_size": 8}
    if model_type == "some_new_vlm":
        config["vision_config"] = {"hidden_size": 8}
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf(config)
    [problem] = caught.value.problems
    assert problem.path == "$.model_type"
    assert f"model_type {model_type!r} is not supported: llmpar does not model" in problem.message
    assert fragment in problem.message


def test_llama4_reads_its_language_model():
    # Llama 4 Maverick: 24 MoE layers (every second, from layer 1) of 128 experts and a
    # shared one of 8192, 24 dense layers of 16384; chunked attention on 3 layers in 4.
    config = config_of("llama-4-maverick")
    model = llmpar.model_from_hf(config)
    groups = count_parameters(model).by_group
    h = 5120
    assert groups["mlp"] == 24 * 3 * h * 16384
    assert groups["experts"] == 24 * 128 * 3 * h * 8192
    assert groups["shared_experts"] == 24 * 3 * h * 8192 and groups["router"] == 24 * 128 * h
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert [model.is_sliding_window_layer(i) for i in range(4)] == [True, True, True, False]
    assert model.sliding_window == 8192
    assert "without the vision tower" in model.source and "out of scope" in model.source
    text = config["text_config"]
    for key, value in [("moe_layers", [0, 2]), ("no_rope_layers", [0] * 48)]:
        with pytest.raises(llmpar.SpecError) as caught:
            llmpar.model_from_hf({**config, "text_config": {**text, key: value}})
        assert caught.value.problems[0].path == f"$.text_config.{key}"


# --- measured with transformers ----------------------------------------------------------

MEASURED = sorted((WRITER.CONFIGS.parent / "data" / "parameters").glob("*.json"))


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_counts_equal_transformers_on_the_meta_device(path):
    # validation/data/parameters/<name>.json: the transformers model of the preset's
    # config built at full size on the meta device (validation/measure_parameters.py,
    # torch 2.13.0, transformers 5.24.0), its parameters in total and by group.
    measured = json.loads(path.read_text(encoding="utf-8"))
    count = count_parameters(llmpar.model_from_hf(WRITER.ROOT / measured["published_config_file"]))
    assert count.total == measured["total_params"]
    ours = {group: n for group, n in count.by_group.items() if n}
    assert ours == measured["by_group_params"]


def test_every_preset_config_is_measured():
    assert {path.stem for path in MEASURED} == {path.stem for path in CITED}


def test_mistral3_reads_the_language_model_its_text_config_names():
    small = llmpar.model_from_hf(config_of("mistral-small-3.1-24b"))
    assert "MistralForCausalLM" in small.source and "out of scope" in small.source
    ministral = llmpar.model_from_hf(config_of("ministral-3-8b"))
    assert "Ministral3ForCausalLM" in ministral.source
    config = config_of("ministral-3-8b")
    wrong = {**config, "text_config": {**config["text_config"], "model_type": "llama"}}
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.model_from_hf(wrong)
    [problem] = caught.value.problems
    assert problem.path == "$.text_config.model_type"
    assert "'mistral' or 'ministral3'" in problem.message


def test_olmo3_defaults_to_a_full_layer_in_four():
    # Olmo3Config (transformers 5.24): sliding_window 4096, layer_types with every fourth
    # layer full when the config gives none.
    config = {**{k: v for k, v in config_of("olmo-2-13b").items() if not k.startswith("_")},
              "model_type": "olmo3"}
    model = llmpar.model_from_hf(config)
    assert (model.sliding_window, model.sliding_window_pattern) == (4096, 4)


def test_minimax_m2_norms_the_whole_query_and_key_projections():
    config = {k: v for k, v in config_of("minimax-m2").items() if not k.startswith("_")}
    model = llmpar.model_from_hf(config)
    h, q, kv = 3072, 48 * 128, 8 * 128
    per_layer = 2 * h * q + 2 * h * kv + q + kv  # projections, q_norm and k_norm
    assert count_parameters(model).by_group["attention"] == 62 * per_layer
    renamed = {("num_experts" if k == "num_local_experts" else k): v for k, v in config.items()}
    assert llmpar.model_from_hf(renamed) == model
    with pytest.raises(llmpar.SpecError, match="use_qk_norm"):
        llmpar.model_from_hf({**config, "use_qk_norm": False})


FLOP_RUNS = [pytest.param(run, id=f"{path.stem}-L{run['num_layers']}-b{run['batch']}-s{run['seq']}")
             for path in sorted((WRITER.CONFIGS.parent / "data" / "flops").glob("*.json"))
             for run in json.loads(path.read_text(encoding="utf-8"))["runs"]]


@pytest.mark.parametrize("run", FLOP_RUNS)
def test_flops_equal_flop_counter_on_the_2025_model_types(run):
    # validation/data/flops/<name>.json (validation/measure_flops.py): FlopCounterMode on
    # the transformers model of `config_used` (1 or 2 layers, eager attention, training
    # mode), plus the kernels it has no formula for, counted from their shapes; llmpar's
    # forward is the same matrix products, its training step 3x the forward.
    from llmpar.footprint.flops import forward_flops_per_sequence

    model = llmpar.model_from_hf(run["config_used"])
    predicted = (forward_flops_per_sequence(model, run["seq"]).total * run["batch"]
                 + FLOP_TERMS.every_expert_extra(model, run))
    uncounted = run["uncounted_kernel_flops_computed_here"]
    if model.sparse_attention is not None:
        # DeepSeek-V3.2: up to top_k tokens every key is kept, so the counter sees the dense
        # attention and the indexer's full square; transformers runs the indexer under
        # torch.no_grad (DeepseekV32Indexer.forward), so its backward counts none of it.
        assert run["seq"] <= model.sparse_attention.top_k
        dense = attrs.evolve(model, sparse_attention=None)
        index = predicted - forward_flops_per_sequence(dense, run["seq"]).total * run["batch"]
        assert predicted == pytest.approx(run["forward_flops"] + uncounted, rel=1e-9)
        assert 3 * predicted - 2 * index == pytest.approx(
            run["forward_backward_flops"] + 3 * uncounted, rel=1e-9)
        return
    if model.mixer_pattern is not None:
        # exact where FlopCounterMode counts the kernels' products (`recurrent_unseen`)
        unseen, backward = FLOP_TERMS.recurrent_unseen(model, run)
        assert predicted - unseen == run["forward_flops"] + uncounted
        # the reference delta rule's autograd adds products of its own at 8 chunks (s
        # 512: 0.03% of the backward), so the backward agrees to 0.1%
        assert 2 * (predicted - unseen) == pytest.approx(backward, rel=1e-3)
        return
    assert predicted == pytest.approx(run["forward_flops"] + uncounted, rel=0.01)
    assert 3 * predicted == pytest.approx(run["forward_backward_flops"] + 3 * uncounted,
                                          rel=0.01)


@pytest.mark.parametrize("name", ["gemma-3-1b", "llama-4-scout"])
def test_flops_of_windowed_chunked_and_nope_layers_equal_flop_counter(name):
    # validation/data/flops/<name>.json: a windowed and a global layer (Gemma 3), a RoPE
    # chunked and a NoPE global layer (Llama 4 Scout); eager attention computes every score
    # of the s x s square whatever the mask, as llmpar counts them, and transformers runs
    # Llama 4's every expert on every token (`every_expert_extra`): equal to the FLOP, with
    # no kernel the counter leaves out, and the parameters transformers built
    from llmpar.footprint.flops import forward_flops_per_sequence

    folder = WRITER.CONFIGS.parent / "data" / "flops"
    runs = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))["runs"]
    assert {run["num_layers"] for run in runs} == {1, 2}
    for run in runs:
        model = llmpar.model_from_hf(run["config_used"])
        kinds = {windowed for _, windowed in model.layer_kinds_in(0, run["num_layers"])}
        assert kinds == ({True} if run["num_layers"] == 1 else {True, False})
        predicted = (forward_flops_per_sequence(model, run["seq"]).total * run["batch"]
                     + FLOP_TERMS.every_expert_extra(model, run))
        assert run["uncounted_kernel_flops_computed_here"] == 0
        assert predicted == run["forward_flops"]
        assert 3 * predicted == run["forward_backward_flops"]
        assert count_parameters(model).total == run["parameters"]


@pytest.mark.parametrize("name", ["gpt-oss-20b", "llama-4-scout"])
def test_num_experts_spelling_is_read(name):
    # transformers' attribute maps let a config name the routed experts num_experts.
    config = config_of(name)
    inner = config.get("text_config", config)
    renamed = {("num_experts" if k == "num_local_experts" else k): v for k, v in inner.items()}
    spelled = {**config, "text_config": renamed} if "text_config" in config else renamed
    assert model_table_from_hf(spelled) == model_table_from_hf(config)


def test_kimi_k2_5_reads_its_text_config():
    # Kimi K2.5 wraps a kimi_k2 language model in a multimodal config.
    text = {k: v for k, v in config_of("kimi-k2").items() if not k.startswith("_")}
    wrapped = {"model_type": "kimi_k25", "text_config": text,
               "vision_config": {"model_type": "kimi_k25_vision"}}
    assert (count_parameters(llmpar.model_from_hf(wrapped))
            == count_parameters(llmpar.model_from_hf(text)))
