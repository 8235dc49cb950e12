"""[parallel.offload] against ZeRO-Offload's and ZeRO-Infinity's accounting."""

from __future__ import annotations

import llmpar
import pytest
from hypothesis import assume, given
from llmpar.testing import parallel_training_specs

PCIE5 = 63e9 * 0.8  # dgx-h100: PCIe Gen5 x16 per GPU, times the default link efficiency


def run(parameters=7e9, cluster="dgx-h100", num_gpus=1, zero=0, offload=None,
        global_batch_size=4, **hardware):
    spec = {"model": {"parameters": parameters},
            "hardware": {"cluster": cluster, "num_gpus": num_gpus, **hardware},
            "training": {"sequence_length": 2048, "global_batch_size": global_batch_size,
                         "mfu": 0.4},
            "parallel": {"data": {"zero": zero}}}
    if offload is not None:
        spec["parallel"]["offload"] = offload
    return spec


def test_thirteen_billion_parameters_fit_one_32gb_v100():
    # Ren et al. 2021, abstract: "train models with over 13 billion parameters on a single
    # GPU". Mixed-precision Adam keeps 16 bytes per parameter; offloaded, the GPU keeps
    # the 2-byte weights.
    spec = {"model": {"parameters": 13e9},
            "hardware": {"gpu": "v100-sxm2-32gb", "num_gpus": 1}}
    alone = llmpar.evaluate(spec)
    offloaded = llmpar.evaluate({**spec, "parallel": {"offload": {}}})
    assert not alone.fits and alone.total_bytes == 16 * 13e9
    assert offloaded.fits and offloaded.total_bytes == 2 * 13e9
    assert offloaded.host_bytes == 14 * 13e9  # fp32 master weights, moments, fp16 gradients


def test_each_gpu_offloads_its_zero_2_partition():
    plan = llmpar.evaluate(run(num_gpus=8, zero=2, offload={}, global_batch_size=8))
    assert plan.weights_bytes == 2 * 7e9
    assert plan.optimizer_bytes == plan.gradients_bytes == 0
    assert plan.host_bytes == pytest.approx((12 + 2) * 7e9 / 8)


def test_transfers_and_the_host_step_per_parameter():
    m = 4  # micro-batches per step on one GPU
    plan = llmpar.evaluate(run(offload={}, global_batch_size=m))
    work = plan.derivation("offload_seconds").inputs
    n = 7e9
    assert work["offload.gradients-to-host_seconds"] == pytest.approx(m * 2 * n / PCIE5)
    assert work["offload.weights-to-gpu_seconds"] == pytest.approx(2 * n / PCIE5)
    assert work["offload.host-optimizer-step_seconds"] == pytest.approx(n / 1e9)
    assert plan.offload_seconds == pytest.approx(n / 1e9 + (m + 1) * 2 * n / PCIE5)
    # The gradient copies run behind the backward pass, as far as it lasts (here it is
    # shorter: 2 bytes per parameter over PCIe outlast 6 FLOPs per parameter and token of
    # a 2048-token micro-batch); the host's step and the copy back wait.
    compute = llmpar.evaluate(run(global_batch_size=m)).step_seconds
    grads = m * 2 * n / PCIE5
    assert grads > compute
    assert plan.exposed_offload_seconds == pytest.approx(n / 1e9 + 2 * n / PCIE5
                                                         + grads - compute)


def test_step_time_grows_by_the_exposed_offload():
    base = llmpar.evaluate(run(global_batch_size=4))
    plan = llmpar.evaluate(run(offload={}, global_batch_size=4))
    assert plan.step_seconds == pytest.approx(base.step_seconds + plan.exposed_offload_seconds)
    delayed = llmpar.evaluate(run(offload={"delayed_parameter_update": True},
                                  global_batch_size=4))
    # Sec. 4.2: with the update one step behind, the host's work hides behind compute.
    assert delayed.offload_seconds == plan.offload_seconds
    assert delayed.exposed_offload_seconds == pytest.approx(
        max(0.0, plan.offload_seconds - base.step_seconds))


def test_faster_host_link_and_cpu_mean_less_offload_time():
    slow = llmpar.evaluate(run(offload={}, cluster="dgx-a100"))  # PCIe Gen4
    fast = llmpar.evaluate(run(offload={}, cluster="dgx-h100"))  # PCIe Gen5
    c2c = llmpar.evaluate(run(offload={}, cluster="gb200-nvl72"))  # NVLink-C2C
    assert slow.offload_seconds > fast.offload_seconds > c2c.offload_seconds
    quick_cpu = llmpar.evaluate(run(offload={"cpu_optimizer_parameters_per_s": 4e9}))
    assert fast.offload_seconds - quick_cpu.offload_seconds == pytest.approx(7e9 / 1e9
                                                                             - 7e9 / 4e9)


def test_zero_infinity_streams_each_shard_per_pass():
    m = 2
    plan = llmpar.evaluate(run(num_gpus=8, zero=3, global_batch_size=8 * m,
                               offload={"weights": True}))
    assert plan.weights_bytes == plan.gradients_bytes == plan.optimizer_bytes == 0
    assert plan.host_bytes == pytest.approx(16 * 7e9 / 8)
    work = plan.derivation("offload_seconds").inputs
    assert work["offload.weights-from-host_seconds"] == pytest.approx(
        2 * m * 2 * (7e9 / 8) / PCIE5)  # forward and backward, per micro-batch
    assert "offload.weights-to-gpu_seconds" not in work  # the host updates them in place


def test_without_a_host_link_only_the_host_step_is_costed():
    plan = llmpar.evaluate({"model": {"parameters": 7e9},
                            "hardware": {"gpu": "h100-sxm", "num_gpus": 1},
                            "training": {"mfu": 0.4}, "parallel": {"offload": {}}})
    assert plan.offload_seconds == pytest.approx(7e9 / 1e9)
    assert any("host_bandwidth_bytes_per_s" in w for w in plan.warnings)


def test_a_node_without_enough_host_memory_is_warned_about():
    # 405B under ZeRO-1 on one DGX H100: 8 GPUs x 14/8 bytes x 405e9 = 5.7 TB > 2 TB.
    plan = llmpar.evaluate(run(parameters=405e9, num_gpus=8, zero=1, offload={},
                               global_batch_size=8))
    assert any("host memory per node" in w for w in plan.warnings)
    assert not any("host memory" in w for w in llmpar.evaluate(
        run(num_gpus=8, zero=1, offload={}, global_batch_size=8)).warnings)


@pytest.mark.parametrize(
    ("offload", "zero", "num_gpus", "path", "fragment"),
    [
        ({"gradients": True, "optimizer": False}, 1, 8, "$.parallel.offload.gradients",
         "needs optimizer = true"),
        ({"weights": True}, 2, 8, "$.parallel.offload.weights", "needs ZeRO-3"),
        ({}, 0, 8, "$.parallel.offload.optimizer", "needs ZeRO"),
        ({"cpu_optimizer_parameters_per_s": 0}, 1, 8,
         "$.parallel.offload.cpu_optimizer_parameters_per_s", "> 0"),
        ({"optimzer": False}, 1, 8, "$.parallel.offload.optimzer", ""),
    ],
)
def test_bad_tables_name_their_key(offload, zero, num_gpus, path, fragment):
    with pytest.raises(llmpar.SpecError) as caught:
        llmpar.evaluate(run(num_gpus=num_gpus, zero=zero, offload=offload, global_batch_size=8))
    assert any(p.path == path and fragment in p.message for p in caught.value.problems), (
        caught.value.problems)


def test_an_inference_spec_is_refused():
    with pytest.raises(llmpar.SpecError, match="offloading plans training"):
        llmpar.evaluate({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                         "inference": {"prompt_tokens": 128, "generated_tokens": 128},
                         "parallel": {"offload": {}}})


@given(parallel_training_specs())
def test_offloading_moves_bytes_without_making_or_losing_any(table):
    table["parallel"].setdefault("data", {})["zero"] = max(
        1, table["parallel"].get("data", {}).get("zero", 0))
    try:
        base = llmpar.evaluate(table)
        moved = llmpar.evaluate({**table, "parallel": {**table["parallel"], "offload": {}}})
    except llmpar.SpecError:
        assume(False)
    for before, after in zip(base.stages, moved.stages):
        assert after.total_bytes + after.host_bytes == before.total_bytes
        assert after.optimizer_bytes == after.gradients_bytes == 0
        assert after.weights_bytes == before.weights_bytes
    assert moved.host_bytes == max(stage.host_bytes for stage in moved.stages) > 0
