"""The memory of a Megatron-Core step: hidden dropout's masks, the vocab-parallel loss's
in-place softmax, and Megatron-LM's published memory regression tests that check them
with the interleaved schedule (docs/validation-memory.md)."""

from __future__ import annotations

import tomllib

import pytest
from validation_scripts import load_script

import llmpar
from llmpar.evaluation.transients import _loss_parts

REPORT = load_script("report_memory_peak")
PP4 = "gpt3_7b_tp1_pp4_memory_speed"
TP4 = "gpt3_7b_tp4_pp1_memory_speed"


def _row(test: str) -> dict:
    rows = tomllib.loads(REPORT.MEGATRON.read_text())["row"]
    return next(run for run in rows if run["test"] == test)


@pytest.mark.parametrize("row", REPORT.megatron_rows(),
                         ids=lambda r: (f"{r['run']['gpu']}-{r['run']['test']}-"
                                      f"{r['quantity'].replace(' ', '-')}"))
def test_megatron_regression_rows(row):
    """Megatron-LM's memory regression tests on a DGX H100 and a DGX A100 (golden values of
    tests/functional_tests/test_cases/gpt/, validation/published/memory/): every spec
    evaluates; the allocated peak of the logging rank within the issue's worst case (8%),
    at the last stage's loss forward; what stays between steps below the log (the page
    names the unexplained rest), within 8%."""
    assert abs(row["error"]) < REPORT.WORST_TARGET, row
    assert row["stage"] == row["run"]["pipeline"] - 1
    if row["quantity"] == "max allocated":
        assert row["moment"] == "loss forward"
    else:
        assert row["moment"] == "start" and row["error"] < 0


def test_megatron_rows_meet_the_targets():
    peaks = [abs(r["error"]) for r in REPORT.megatron_rows() if r["quantity"] == "max allocated"]
    assert len(peaks) == 4
    assert sorted(peaks)[0] <= REPORT.MEDIAN_TARGET and max(peaks) <= REPORT.WORST_TARGET


def test_between_steps_is_twelve_bytes_per_parameter_at_data_parallel_2():
    """bf16 weights (2 B), the fp32 gradient buffer (4 B) and the distributed optimizer's
    fp32 main weights and Adam moments sharded over 2 (12 / 2 B): 12 B per parameter of
    the stage, on the TP4 run."""
    plan = llmpar.evaluate(REPORT.megatron_spec(_row(TP4)))
    stage = plan.stages[0]
    states = stage.weights_bytes + stage.gradients_bytes + stage.optimizer_bytes
    assert stage.gradients_bytes == pytest.approx(2 * stage.weights_bytes, rel=1e-9)
    assert states == pytest.approx(6 * stage.weights_bytes, rel=1e-9)


def test_tp4_rows_differ_by_transformer_engine_s_workspace():
    """The TP4 test on the H100 and on the A100 keeps the same tensors but for the
    workspaces: PyTorch's cuBLAS workspace is 32 MiB on both (CUBLAS_WORKSPACE_CONFIG=
    :4096:8 in the test's ENV_VARS), Transformer Engine's is 32 MiB from compute capability
    9.0 and 4 MiB below (get_cublas_workspace_size_bytes, TE 2.x). llmpar's memory between
    steps differs by those 28 MiB, each in allocated memory from the step's start; the
    golden values differ by 28.05 MiB (20,663,519,232 - 20,634,103,808 B)."""
    rows = {(r["run"]["gpu"], r["quantity"]): r for r in REPORT.megatron_rows()
            if r["run"]["test"] == TP4}
    between = "allocated between steps"
    predicted = rows["h100-sxm", between]["predicted"] - rows["a100-sxm-80gb", between][
        "predicted"]
    measured = rows["h100-sxm", between]["measured"] - rows["a100-sxm-80gb", between][
        "measured"]
    assert predicted == 28 * 2**20
    assert measured == pytest.approx(predicted, abs=2**20)
    peak = llmpar.evaluate(REPORT.megatron_spec(_row(TP4))).training.memory_peak
    assert peak is not None
    alive = {b.name: b.bytes for b in peak.alive}
    assert alive["cuBLAS workspace (PyTorch)"] == 32 * 2**20
    assert alive["cuBLAS workspace (Transformer Engine)"] == 32 * 2**20


def test_the_interleaved_row_s_last_rank_holds_29_of_32_chunk_micro_batches():
    """p = 4, v = 8, m = 4 (gpt3_7b_tp1_pp4_memory_speed): the last rank's (v-1)p = 28
    warm-up forwards and one more, 29/8 micro-batches of its layers."""
    plan = llmpar.evaluate(REPORT.megatron_spec(_row(PP4)))
    assert plan.stages[-1].micro_batches_in_flight == pytest.approx(29 / 8)
    assert plan.stages[0].micro_batches_in_flight == 4  # all m: 34 warm-up forwards > 32


def test_vocab_parallel_loss_upcasts_once_since_core_r0_8():
    """megatron/core/tensor_parallel/cross_entropy.py from core_r0.8.0 (commit 9634c0e4):
    the max is subtracted and the exponent taken in the fp32 copy itself, so the loss's
    forward holds the bf16 logits and one fp32 tensor, its backward the fp32 softmax
    turned gradient and the gradient cast to bf16; before it (the legacy profiles), a
    second fp32 tensor in the forward."""
    session = llmpar.Session()
    example = "specs/examples/llama-3-8b-tp8-sp-a100.toml"
    spec = session._checked(example, None)[0]
    legacy = session._checked(example, {"training.framework": "megatron-core-legacy"})[0]
    elements = spec.training.micro_batch_size * spec.training.sequence_length * 128256
    forward, backward = _loss_parts(spec)
    assert sum(sum(p.tags.values()) for p in forward) == elements * (2 + 4)
    assert sum(sum(p.tags.values()) for p in backward) == elements * (4 + 2)
    forward, _ = _loss_parts(legacy)
    assert sum(sum(p.tags.values()) for p in forward) == elements * (2 + 4 + 4)


def test_vocab_parallel_loss_of_fp32_logits_copies_nothing():
    """Tensor.float() of fp32 logits returns them: the softmax is made in the logits
    themselves and the gradient returned needs no cast."""
    spec = llmpar.Session()._checked("specs/examples/llama-3-8b-tp8-sp-a100.toml",
                                     {"precision.activations": "fp32"})[0]
    elements = spec.training.micro_batch_size * spec.training.sequence_length * 128256
    forward, backward = _loss_parts(spec)
    assert sum(sum(p.tags.values()) for p in forward) == elements * 4
    assert sum(sum(p.tags.values()) for p in backward) == elements * 4


def test_hidden_dropout_keeps_a_byte_mask_after_attention_mlp_and_embedding():
    """Korthikanti et al. 2022, Sec. 4.1: a dropout keeps a one-byte mask per element;
    after each layer's attention and MLP and after the embedding, b x s x h each
    (Megatron-LM's --hidden-dropout, 0.1 by default there), split by sequence
    parallelism as the residual stream is; none by default. Llama-3-8B, TP8 + SP:
    s = 8192, h = 4096, b = 1, 32 layers."""
    example = "specs/examples/llama-3-8b-tp8-sp-a100.toml"
    with_masks = llmpar.evaluate(example, {"training.hidden_dropout": 0.1})
    without = llmpar.evaluate(example)
    spec = llmpar.Session()._checked(example, None)[0]
    b, s, h, t = spec.training.micro_batch_size, spec.training.sequence_length, 4096, 8
    rows = {r.name: r.bytes for r in with_masks.activation_tensors}
    assert rows["attention dropout mask"] == rows["MLP dropout mask"] == b * s * h / t
    assert not any("dropout" in r.name for r in without.activation_tensors)
    stage = with_masks.stages[0]
    masks = stage.micro_batches_in_flight * (2 * stage.layers + 1) * b * s * h / t
    assert with_masks.stages[0].activations_bytes - without.stages[0].activations_bytes == (
        pytest.approx(masks, abs=1))


def test_hidden_dropout_must_be_a_probability():
    with pytest.raises(llmpar.SpecError) as raised:
        llmpar.evaluate("specs/examples/llama-3-8b-tp8-sp-a100.toml",
                        {"training.hidden_dropout": 1.0})
    assert "hidden_dropout" in str(raised.value)


def test_megatron_launch_states_hidden_dropout_and_import_reads_it():
    """Megatron-LM trains with --hidden-dropout 0.1 unless told (arguments.py): the launch
    always gives the spec's value, so the run keeps the masks the plan counts (none by
    default), and the import reads it back; a value outside [0, 1) names the flag."""
    from llmpar.launch.megatron import read_arguments

    session = llmpar.Session()
    example = "specs/examples/gpt3-175b-1024-a100.toml"
    plain = session.launch(example, "megatron")
    assert "--hidden-dropout 0.0" in plain.command
    launch = session.launch(example, "megatron", {"training.hidden_dropout": 0.1})
    assert read_arguments(launch.files[0].text, "x").settings["training.hidden_dropout"] == 0.1
    with pytest.raises(llmpar.SpecError) as raised:
        read_arguments(launch.files[0].text.replace("--hidden-dropout 0.1",
                                                    "--hidden-dropout 1.5"), "x")
    assert "--hidden-dropout" in str(raised.value)


def test_import_without_hidden_dropout_states_megatron_s_default():
    """Megatron-LM's --hidden-dropout defaults to 0.1 (TransformerConfig.hidden_dropout,
    megatron/core/transformer/transformer_config.py): an argument list without the flag
    imports as 0.1 whatever the base states, so the plan keeps the masks Megatron's run
    keeps; the flag given is read as given. (NeMo's and Megatron-Bridge's overrides leave
    an absent value to the recipe: not this default.)"""
    session = llmpar.Session()
    example = "specs/examples/gpt3-175b-1024-a100.toml"
    base = session.load_spec(example)
    reader = session.launch_targets.find("megatron")
    text = session.launch(example, "megatron").files[0].text
    assert "--hidden-dropout 0.0" in text
    assert reader.read(text, "x", base).settings["training.hidden_dropout"] == 0.0
    plain = reader.read(text.replace("--hidden-dropout 0.0", ""), "x", base)
    assert plain.settings["training.hidden_dropout"] == 0.1
