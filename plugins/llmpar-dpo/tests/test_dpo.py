"""DPO's accounting: the policy trained on twice the sequences of its pairs, a frozen
reference's weights beside it (split as the policy's), and the reference's forward pass
(2 N per token, no backward); checked against the spec without the workload, by hand."""

from __future__ import annotations

import attrs
import llmpar
import pytest

GB = 1e9
PAIRS = 32
SEQUENCE = 2048
LLAMA_3_8B_VOCAB = 128256


def spec(gpus=8, parallel=None, workload=None, **training):
    table = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": gpus},
             "training": {"sequence_length": SEQUENCE, "global_batch_size": 2 * PAIRS,
                          "micro_batch_size": 2, **training},
             "parallel": parallel if parallel is not None else {"data": {"zero": 1}}}
    if workload is not None:
        table["workload"] = {"dpo": workload}
    return table


def plans(session, **kwargs):
    """(the policy trained alone on the pairs' sequences, the same under DPO)."""
    dpo = kwargs.pop("workload", {})
    return session.evaluate(spec(**kwargs)), session.evaluate(spec(workload=dpo, **kwargs))


def reference_forward_bytes(micro_batch, tensor=1, context=1):
    """The reference forward's logits (micro-batch x s x V, bf16) and one sequence's
    log-softmax, as TRL's `_compute_loss` and `selective_log_softmax` hold them."""
    return (micro_batch + 1) * SEQUENCE * LLAMA_3_8B_VOCAB * 2 / (tensor * context)


def test_memory_is_policy_training_plus_reference_weights_plus_its_forward(session):
    alone, dpo = plans(session)
    # ZeRO-1: the reference is whole on every GPU, as the policy's weights (TRL's
    # prepare_deepspeed keeps it at stage 0 unless ZeRO-3): 8.03e9 x 2 bytes.
    assert dpo.weights_bytes == 2 * alone.weights_bytes
    assert alone.weights_bytes == pytest.approx(2 * alone.parameters, abs=8)
    assert (dpo.gradients_bytes, dpo.optimizer_bytes, dpo.activations_bytes) == (
        alone.gradients_bytes, alone.optimizer_bytes, alone.activations_bytes)
    assert dpo.buffers_bytes - alone.buffers_bytes == pytest.approx(
        reference_forward_bytes(2), abs=1)
    assert dpo.total_bytes == pytest.approx(
        alone.total_bytes + alone.weights_bytes + reference_forward_bytes(2), abs=8)


def test_flops_are_6n_on_twice_the_pairs_plus_2n_for_the_reference(session):
    size = {"model": {"parameters": 7e9}}
    alone = session.evaluate({**spec(), **size})
    dpo = session.evaluate({**spec(workload={}), **size})
    tokens = 2 * PAIRS * SEQUENCE  # chosen and rejected: twice the pairs
    assert alone.training.tokens_per_step == dpo.training.tokens_per_step == tokens
    assert alone.training.flops_per_step == pytest.approx(6 * 7e9 * tokens)
    assert dpo.training.flops_per_step == pytest.approx(6 * 7e9 * tokens + 2 * 7e9 * tokens)
    assert dpo.training.hardware_flops_per_step == pytest.approx(
        alone.training.hardware_flops_per_step + 2 * 7e9 * tokens)


def test_exact_flops_add_one_forward_of_three_passes(session):
    # From the architecture, training is forward + backward = 3 forwards (Narayanan et
    # al. 2021, Sec. 5.1); the reference adds one forward on the same sequences.
    alone, dpo = plans(session)
    assert dpo.training.flops_per_step == pytest.approx(alone.training.flops_per_step * 4 / 3)
    assert dpo.training.step_seconds > alone.training.step_seconds


def test_the_reference_is_split_as_the_policy_weights_are(session):
    for parallel, gpus in (({"tensor": {"degree": 4}, "data": {"zero": 1}}, 8),
                           ({"pipeline": {"degree": 2}, "data": {"zero": 1}}, 8),
                           ({"data": {"zero": 3}}, 8),
                           ({"data": {"fsdp": True, "shard_degree": 4}}, 16)):
        alone, dpo = plans(session, parallel=parallel, gpus=gpus)
        assert dpo.weights_bytes == pytest.approx(2 * alone.weights_bytes, abs=8), parallel
        assert dpo.gradients_bytes == alone.gradients_bytes


def test_vocabulary_and_sequence_splits_divide_the_reference_logits(session):
    alone, dpo = plans(session, parallel={"tensor": {"degree": 2}, "context": {"degree": 2},
                                          "data": {"zero": 1}})
    assert dpo.buffers_bytes - alone.buffers_bytes == pytest.approx(
        reference_forward_bytes(2, tensor=2, context=2), abs=1)


def test_a_reference_format_of_its_own(session):
    alone, dpo = plans(session, workload={"reference_format": "fp8"})
    assert dpo.weights_bytes - alone.weights_bytes == pytest.approx(alone.weights_bytes / 2,
                                                                    abs=8)


def test_lora_uses_the_base_with_adapters_disabled(session):
    # TRL: a PEFT policy and no ref_model -> no second model; the reference forward runs
    # with the adapters disabled.
    lora = {"method": "lora", "rank": 16, "target_modules": ["all-linear"]}
    alone = session.evaluate({**spec(), "finetune": lora})
    dpo = session.evaluate({**spec(workload={}), "finetune": lora})
    assert dpo.weights_bytes == alone.weights_bytes
    assert dpo.buffers_bytes > alone.buffers_bytes
    base_forward = session.evaluate(spec()).training.flops_per_step / 3
    assert dpo.training.flops_per_step == pytest.approx(
        alone.training.flops_per_step + base_forward)
    copy = session.evaluate({**spec(workload={"reference": "copy"}), "finetune": lora})
    assert copy.weights_bytes > dpo.weights_bytes


def test_precomputed_log_probs_keep_nothing_in_the_step(session):
    alone, dpo = plans(session, workload={"reference": "precomputed"})
    assert (dpo.total_bytes, dpo.training.flops_per_step, dpo.training.step_seconds) == (
        alone.total_bytes, alone.training.flops_per_step, alone.training.step_seconds)
    assert any("precomputed" in note.text for note in dpo.training.notes)


def test_batches_come_in_pairs(session):
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(spec(workload={}, global_batch_size=63, micro_batch_size=1))
    assert [p.path for p in error.value.problems] == ["$.training.global_batch_size"]


@pytest.mark.parametrize(("table", "path"), [
    ({"reference": "base"}, "$.workload.dpo.reference"),
    ({"reference": "precomputed", "reference_format": "fp8"},
     "$.workload.dpo.reference_format"),
    ({"reference": "ref"}, "$.workload.dpo.reference"),
    ({"reference_format": "fp7"}, "$.workload.dpo.reference_format"),
    ({"beta": 0.1}, "$.workload.dpo"),
])
def test_bad_tables_name_the_key(session, table, path):
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(spec(workload=table))
    assert any(p.path.startswith(path) for p in error.value.problems), error.value.problems


def test_not_on_a_serving_spec(session):
    table = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 1},
             "inference": {"prompt_tokens": 128, "generated_tokens": 16},
             "workload": {"dpo": {}}}
    with pytest.raises(llmpar.SpecError) as error:
        session.evaluate(table)
    assert "$.workload" in [p.path for p in error.value.problems]


def test_search_ranks_dpo_layouts_and_the_spec_round_trips(session):
    found = llmpar.search(spec(gpus=8, parallel={}, workload={}), session=session)
    best = found.best
    assert best is not None and best.plan.weights_bytes > 0
    assert best.spec.workload["dpo"].config.reference == "auto"
    text = llmpar.dump_spec(best.spec)
    assert "[workload.dpo]" in text
    again = session.load_spec(text=text)
    assert attrs.evolve(again, source=None) == attrs.evolve(best.spec, source=None)


@pytest.mark.parametrize("name", ["llama-3-8b-dpo-lora-h100", "llama-3-8b-dpo-fsdp-8-h100"])
def test_the_shipped_examples_evaluate_and_fit(session, name):
    path = session.presets.path("examples", name)
    plan = session.evaluate(path)
    assert plan.fits and plan.training.step_seconds > 0
    without = session.load_spec(path)
    alone = session.evaluate(attrs.evolve(without, workload={}))
    assert plan.total_bytes > alone.total_bytes
    assert plan.training.flops_per_step == pytest.approx(alone.training.flops_per_step * 4 / 3,
                                                         rel=0.01)
