"""Bad specs get a SpecError naming the key path, the bad value and what was expected."""

from __future__ import annotations

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
         "sequence_length (4096) exceeds the learned position table"),
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
        ('model = "7b"\nparallel = 3\n' + GPU, "$.parallel", "expected a table"),
    ],
)
def test_problem_names_path_and_expectation(text, path, fragment):
    found = problems_of(text)
    assert any(p == path and fragment in message for p, message in found), found


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
