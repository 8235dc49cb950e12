"""Bad specs get a SpecError naming the key path, the bad value and what was expected."""

from __future__ import annotations

import json

import pytest

import llmpar
from llmpar import SpecError

GPU = '[hardware]\ngpu = "h100-sxm"\n'


def problems_of(text: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        llmpar.load_spec(text)
    return [(p.path, p.message) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("", "$", "empty"),
        ("model = [", "$", "not valid TOML"),
        ('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpu = 2\n',
         "$.hardware.num_gpu", "unknown key (did you mean 'num_gpus'"),
        ('model = "qwen3-4b"\n' + GPU + "[trainig]\nsequence_length = 5\n",
         "$.trainig", "did you mean 'training'?"),
        ('model = "qwen3-4"\n' + GPU, "$.model", "did you mean 'qwen3-4b'"),
        ('model = "qwen3-4b"\n[hardware]\ngpu = "h100"\n', "$.hardware.gpu",
         "'h100-sxm'"),
        ('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = -2\n',
         "$.hardware.num_gpus", "got -2"),
        ('[model]\npreset = "qwen3-4b"\nnum_kv_heads = 5\n' + GPU, "$.model.num_kv_heads",
         "num_attention_heads (32) must be divisible by num_kv_heads (5)"),
        ('[model]\npreset = "qwen3-4b"\nnum_layers = "36"\n' + GPU, "$.model.num_layers",
         "expected an integer, got '36'"),
        ('[model]\npreset = "qwen3-4b"\nrotary_fraction = 0\n' + GPU,
         "$.model.rotary_fraction", "must be in (0, 1], got 0"),
        ('[model]\npreset = "qwen3-4b"\nrotary_fraction = 1.5\n' + GPU,
         "$.model.rotary_fraction", "must be in (0, 1], got 1.5"),
        ('[model]\npreset = "qwen3-4b"\nrotary_fraction = 0.01\n' + GPU,
         "$.model.rotary_fraction", "even number of channels: int(head_dim (128) x 0.01) is 1"),
        ('[model]\npreset = "deepseek-v3"\nrotary_fraction = 0.5\n' + GPU,
         "$.model.rotary_fraction", "without [model.mla]"),
        ('[model]\npreset = "gpt2"\nrotary_fraction = 0.5\n' + GPU,
         "$.model.rotary_fraction", "only with position_embedding = 'rope'"),
        ('[model]\npreset = "qwen3-4b"\nnum_layers = true\n' + GPU, "$.model.num_layers",
         "expected an integer, got True"),
        ('[model]\npreset = "qwen3-4b"\nnum_layers = 36.5\n' + GPU, "$.model.num_layers",
         "expected an integer, got 36.5"),
        ('model = "qwen3-4b"\n' + GPU + "[training]\nmfu = nan\n", "$.training.mfu",
         "finite"),
        ('model = "qwen3-4b"\n' + GPU + "[training]\ntokens = inf\n", "$.training.tokens",
         "finite"),
        ('model = "qwen3-4b"\n' + GPU + "[training]\nmfu = 1.5\n", "$.training.mfu",
         "must be in (0, 1], got 1.5"),
        ('model = "gpt-3-175b"\n' + GPU + "[training]\nsequence_length = 4096\n",
         "$.training.sequence_length",
         "sequence_length (4,096) exceeds the learned position table"),
        ('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = 8\n'
         "[parallel.data]\ndegree = 3\n", "$.parallel",
         "degrees multiply to 3 (data 3) but hardware.num_gpus is 8"),
        ('model = "qwen3-4b"\n' + GPU + "[parallel.dta]\ndegree = 1\n", "$.parallel.dta",
         "did you mean 'data'?"),
        ('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = 8\n'
         "[training]\nglobal_batch_size = 12\n", "$.training.global_batch_size",
         "global_batch_size (12) must be a multiple of micro_batch_size (1) x data degree (8)"),
        ('model = "qwen3-4b"\n[hardware.gpu]\npreset = "h100-sxm"\nmemory_bytes = "80 Gibs"\n',
         "$.hardware.gpu.memory_bytes", "got '80 Gibs'"),
        ('model = "qwen3-4b"\n' + GPU + '[training]\nactivation_model = "korthikant"\n',
         "$.training.activation_model", "did you mean 'korthikanti'?"),
        (GPU, "$.model", "required"),
        ("[model]\nnum_layers = 3\n" + GPU, "$.model", "missing: hidden_size"),
        ('model = "7b"\n' + GPU + '[optimizer]\nstates = [{name = "m", dtype = "fp33"}]\n',
         "$.optimizer.states[0].dtype", "did you mean 'fp32'?"),
        ('model = "7b"\n' + GPU + "[training]\ntokens = 1e12\ntokens_per_parameter = 20\n",
         "$.training.tokens_per_parameter", "not both"),
        ('model = "7b"\n' + GPU + "version = 2\n", "$.hardware.version", "unknown key"),
        ('version = 2\nmodel = "7b"\n' + GPU, "$.version", "expected 1"),
        ('version = true\nmodel = "7b"\n' + GPU, "$.version", "expected 1, got True"),
        ('[model]\npreset = "mixtral-8x7b"\n[model.moe]\nnum_experts = 4\n'
         "experts_per_token = 8\n" + GPU, "$.model.moe.experts_per_token",
         "experts_per_token (8) exceeds num_experts (4)"),
        ('[model]\npreset = "mixtral-8x7b"\n[model.moe]\ndense_layers = 40\n' + GPU,
         "$.model.moe.dense_layers", "dense_layers (40) leaves no MoE layer among "
         "num_layers (32)"),
        ('[model]\npreset = "mixtral-8x7b"\n[model.moe]\ndense_layers = 32\n' + GPU,
         "$.model.moe.dense_layers", "num_layers (32)"),
        ('[model]\npreset = "mixtral-8x7b"\n[model.moe]\nlayer_frequency = 1000\n' + GPU,
         "$.model.moe.layer_frequency", "layer_frequency (1000) exceeds num_layers (32)"),
        ('[model]\npreset = "mixtral-8x7b"\n[model.moe]\ndense_layers = 29\n'
         "layer_frequency = 20\n" + GPU, "$.model.moe.layer_frequency",
         "after dense_layers (29) up to num_layers (32) is a multiple of layer_frequency (20)"),
        ("[model]\nnum_layers = 2\nhidden_size = 4097\nnum_attention_heads = 32\n"
         "ffn_hidden_size = 64\nvocab_size = 64\n" + GPU, "$.model.hidden_size",
         "hidden_size (4097) is not divisible by num_attention_heads (32): give head_dim"),
        ('model = "7b"\nparallel = 3\n' + GPU, "$.parallel", "expected a table"),
    ],
)
def test_problem_names_path_and_expectation(text, path, fragment):
    found = problems_of(text)
    assert any(p == path and fragment in message for p, message in found), found


def test_an_explicit_head_dim_wins_over_hidden_size_over_heads():
    model = llmpar.load_spec({"model": {"preset": "qwen3-4b", "hidden_size": 4097,
                                        "head_dim": 128},
                              "hardware": {"gpu": "h100-sxm"}}).model
    assert model.head_dim == 128 and model.query_width == 32 * 128


def test_the_last_layer_of_a_frequency_is_an_moe_layer():
    """layer_frequency equal to num_layers leaves one MoE layer: no contradiction."""
    model = llmpar.load_spec({"model": {"preset": "mixtral-8x7b",
                                        "moe": {"layer_frequency": 32}},
                              "hardware": {"gpu": "h100-sxm"}}).model
    assert model.num_moe_layers == 1


def test_a_preset_with_hf_config_is_refused(tmp_path):
    """The preset's keys would win over the config's, which would be read for nothing."""
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "run.toml"
    spec.write_text('[model]\npreset = "qwen3-4b"\nhf_config = "config.json"\n' + GPU)
    with pytest.raises(SpecError) as caught:
        llmpar.load_spec(spec)
    [problem] = caught.value.problems
    assert problem.path == "$.model.hf_config"
    assert "give a preset or hf_config, not both" in problem.message
    assert "model.preset fills the same keys" in problem.message
    spec.write_text('[model]\nhf_config = "config.json"\n' + GPU)
    assert llmpar.load_spec(spec).model.hidden_size == 64


MFU_SPEC = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
            "training": {"sequence_length": 8192, "mfu": 0.9, "recompute": "full"}}


def evaluation_problems(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        llmpar.evaluate(spec)
    return [(p.path, p.message) for p in caught.value.problems]


def test_an_assumed_mfu_that_puts_hfu_above_one_is_refused():
    [(path, message)] = evaluation_problems(MFU_SPEC)
    assert path == "$.training.mfu"
    assert "recompute = 'full'" in message and "mfu (0.9)" in message
    largest = float(message.rsplit("<= ", 1)[1])
    # The largest mfu it names is possible, and only just.
    plan = llmpar.evaluate({**MFU_SPEC, "training": {**MFU_SPEC["training"], "mfu": largest}})
    assert 0.999 < plan.training.hfu <= 1.0
    assert largest == pytest.approx(plan.flops_per_step / plan.hardware_flops_per_step,
                                    abs=1e-3)


def test_the_gpus_achievable_mfu_is_held_to_the_same_rule():
    gpu = {"name": "no-efficiencies", "memory_bytes": "80 GiB", "peak_bf16_flops_per_s": 1e15,
           "achievable_mfu": 0.95}
    # Korthikanti et al.'s accounting: the full s x s square, and selective recomputation
    # reruns its products, so the hardware FLOPs exceed the model's by enough.
    spec = {**MFU_SPEC, "hardware": {"gpu": gpu, "num_gpus": 8},
            "training": {"sequence_length": 8192, "recompute": "selective",
                         "activation_model": "korthikanti"}}
    [(path, message)] = evaluation_problems(spec)
    assert path == "$.hardware.gpu.achievable_mfu"
    assert "achievable_mfu (0.95)" in message and "recompute = 'selective'" in message


def test_every_problem_of_a_spec_is_reported_together():
    text = ('model = "qwen3-4"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = 0\n'
            '[training]\nmfu = 2.0\nrecompute = "ful"\nactivation_model = "x"\n')
    paths = {path for path, _ in problems_of(text)}
    assert paths == {"$.model", "$.hardware.num_gpus", "$.training.mfu",
                     "$.training.recompute", "$.training.activation_model"}


def test_error_names_the_file(tmp_path):
    spec = tmp_path / "run.toml"
    spec.write_text('model = "qwen3-4b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpus = 0\n')
    with pytest.raises(SpecError) as caught:
        llmpar.load_spec(spec)
    assert str(spec) in str(caught.value)
    assert "$.hardware.num_gpus" in str(caught.value)


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        llmpar.load_spec(tmp_path / "nope.toml")


def test_non_utf8_file_is_a_spec_error(tmp_path):
    spec = tmp_path / "binary.toml"
    spec.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(SpecError, match="cannot read"):
        llmpar.load_spec(spec)


@pytest.mark.parametrize(("word", "kind", "first"), [
    ("h100", "gpu", ["'h100-sxm'", "'h100-pcie'"]),
    ("a100", "gpu", ["'a100-sxm-40gb'", "'a100-sxm-80gb'"]),
    ("mixtral", "model", ["'mixtral-8x7b'", "'mixtral-8x22b'"]),
])
def test_did_you_mean_names_the_presets_a_short_name_begins(word, kind, first):
    model, gpu = ("llama-3-8b", word) if kind == "gpu" else (word, "h100-sxm")
    text = f'model = "{model}"\n[hardware]\ngpu = "{gpu}"\n'
    [(_, message)] = problems_of(text)
    suggested = message.split("did you mean ")[1]
    assert suggested.startswith(" or ".join(first))
