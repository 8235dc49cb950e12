"""Activation offload (`[training] activation_offload_layers`): the first N layers of each
stage keep their saved tensors in host memory; the copies run over the host link behind
compute (Megatron-Core's --cpu-offloading-num-layers, PyTorch's save_on_cpu)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
LAYERS_PER_STAGE = 20  # Llama-3-70B's 80 layers over 4 stages
HOST_BYTES_PER_S = 63e9  # dgx-h100: PCIe Gen5 x16 each way


def spec(layers: int | None = None, **training: Any) -> dict[str, Any]:
    """Llama-3-70B on 64 H100, TP8 x PP4 x DP2, 32 micro-batches of one 8K sequence."""
    table = {"sequence_length": 8192, "global_batch_size": 64, "recompute": "selective",
             "activation_model": "fused", **training}
    if layers is not None:
        table["activation_offload_layers"] = layers
    return {"model": "llama-3-70b", "hardware": {"cluster": "dgx-h100", "num_gpus": 64},
            "training": table,
            "parallel": {"tensor": {"degree": 8}, "sequence": {}, "pipeline": {"degree": 4},
                         "data": {"zero": 1}}}


def stage0(plan: llmpar.Plan) -> Any:
    return plan.stages[0]


def test_without_the_key_nothing_moves():
    plan = SESSION.evaluate(spec())
    assert plan.host_bytes == 0 and plan.offload_seconds == 0


@pytest.mark.parametrize("layers", [1, 5, 10, 19])
def test_offloaded_layers_move_their_share_to_host_memory(layers):
    before, after = stage0(SESSION.evaluate(spec())), stage0(SESSION.evaluate(spec(layers)))
    # The layers' bytes, per micro-batch in flight (the stage's fixed tensors stay).
    moved = before.activations_bytes - after.activations_bytes
    assert after.host_bytes == pytest.approx(moved, abs=4)
    # One layer of one micro-batch is on its way at a time: a buffer of that size.
    one_layer = moved / layers / before.micro_batches_in_flight
    assert after.buffers_bytes - before.buffers_bytes == pytest.approx(one_layer, rel=1e-6)


def test_the_last_layer_of_a_stage_stays_on_the_gpu():
    assert SESSION.evaluate(spec(80)).to_dict() == SESSION.evaluate(
        spec(LAYERS_PER_STAGE - 1)).to_dict()


def test_copies_go_out_and_back_once_per_micro_batch_behind_compute():
    plan = SESSION.evaluate(spec(10))
    host = stage0(plan).host_bytes / stage0(plan).micro_batches_in_flight  # one micro-batch
    m = plan.micro_batches_per_step
    assert plan.offload_seconds == pytest.approx(2 * m * host / HOST_BYTES_PER_S, rel=1e-6)
    # All but one layer's copy in one direction hides behind compute here.
    one_layer = host / 10 / HOST_BYTES_PER_S
    assert plan.exposed_offload_seconds == pytest.approx(one_layer, rel=1e-6)
    assert plan.step_seconds == pytest.approx(
        SESSION.evaluate(spec()).step_seconds + one_layer, rel=1e-6)


@given(fewer=st.integers(0, 18), more=st.integers(1, 19))
def test_gpu_memory_never_grows_with_more_offloaded_layers(fewer, more):
    if fewer >= more:
        fewer, more = more - 1, fewer + 1
    low = SESSION.evaluate(spec(fewer or None)).total_bytes
    assert SESSION.evaluate(spec(min(more, 19))).total_bytes <= low


def test_offload_needs_the_host_link():
    bare = spec(4)
    bare["hardware"] = {"gpu": "h100-sxm", "num_gpus": 64, "gpus_per_node": 8}
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(bare)
    assert [p.path for p in error.value.problems] == ["$.training.activation_offload_layers"]


def test_offload_and_partial_recomputation_are_not_combined():
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec(4, recompute="full", recompute_layers=4))
    assert "not both" in error.value.problems[0].message


def test_checkpointed_layers_offload_their_inputs_alone():
    """Hand-check on the shipped example of torchtune's offloaded run
    (specs/examples/llama-3.2-3b-offload-a100.toml, validation/published/
    offload_torchtune_a100_bf16.toml): under full recomputation a layer keeps only its
    input, b x s x h bf16 = 2 x 4096 x 3072 x 2 bytes (what torchtune's OffloadActivations
    copies of each checkpointed layer); 27 of Llama 3.2 3B's 28 layers go out and back over
    DGX A100's PCIe Gen4 x16 (31.5 GB/s each way), and one layer's copy in one direction
    stays exposed, as the example's comment says. The plan states the mechanism its
    validation family checks."""
    layer_input_bytes = 2 * 4096 * 3072 * 2
    example = EXAMPLES / "llama-3.2-3b-offload-a100.toml"
    plan = SESSION.evaluate(example)
    assert plan.host_bytes == pytest.approx(27 * layer_input_bytes, rel=1e-9)
    assert plan.offload_seconds == pytest.approx(2 * 27 * layer_input_bytes / 31.5e9, rel=1e-9)
    assert plan.exposed_offload_seconds == pytest.approx(layer_input_bytes / 31.5e9, rel=1e-9)
    text = example.read_text()
    assert f"{layer_input_bytes / 1e6:.1f} MB" in text
    assert f"{plan.host_bytes / 1e9:.2f} GB" in text
    assert f"{plan.offload_seconds * 1e3:.0f} ms" in text
    assert f"({plan.exposed_offload_seconds * 1e3:.1f} ms)" in text
    assert "activation-offload: within" in plan.training.step_time_trust
    without = SESSION.evaluate(example, {"training.activation_offload_layers": None})
    assert "activation-offload" not in without.training.step_time_trust
