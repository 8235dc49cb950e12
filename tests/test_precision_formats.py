"""Per-operation formats (`[precision] linear`, `attention`): FP8 linear layers beside bf16
attention, each product timed at its own format's peak and measured efficiency."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import llmpar
from llmpar.dtypes import bytes_per_element, math_format
from llmpar.evaluation.step_time import product_rates
from llmpar.roofline import rates_of

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "validation" / "published" / "gemm"
SESSION = llmpar.Session(load_entry_points=False)
FP8_RECIPES = ("fp8-tensorwise", "fp8-rowwise", "fp8-blockwise", "mxfp8")


def spec(cluster: str = "dgx-h100", **precision: Any) -> dict[str, Any]:
    """Llama-3-70B, TP8 x PP4 x DP2 on 64 GPUs, 8K tokens, fused attention."""
    return {"model": "llama-3-70b", "hardware": {"cluster": cluster, "num_gpus": 64},
            "precision": precision,
            "training": {"sequence_length": 8192, "global_batch_size": 64,
                         "activation_model": "fused"},
            "parallel": {"tensor": {"degree": 8}, "sequence": {}, "pipeline": {"degree": 4},
                         "data": {"zero": 1}}}


def test_unset_formats_are_the_compute_format():
    assert SESSION.evaluate(spec(linear="bf16", attention="bf16")).to_dict() == (
        SESSION.evaluate(spec()).to_dict())


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_fp8_recipes_run_on_the_fp8_tensor_cores(recipe):
    assert math_format(recipe) == "fp8"
    gpu = SESSION.load_spec(spec()).hardware.gpu
    assert gpu.peak_flops_per_s(recipe) == gpu.peak_fp8_flops_per_s


def test_scale_overheads_of_the_recipes():
    # One E8M0 scale per 32 elements (OCP MX v1.0); one fp32 scale per 128 (DeepSeek-V3).
    assert bytes_per_element("mxfp8") == pytest.approx(1 + 1 / 32)
    assert bytes_per_element("fp8-blockwise") == pytest.approx(1 + 4 / 128)
    assert bytes_per_element("fp8-tensorwise") == 1.0


def test_each_product_runs_at_its_formats_rate():
    loaded = SESSION.load_spec(spec(linear="fp8-rowwise"))
    gpu = loaded.hardware.gpu
    bf16 = gpu.peak_bf16_flops_per_s * gpu.matmul_efficiency
    linear, attention = product_rates(loaded, rates_of(gpu))
    assert linear == pytest.approx(gpu.peak_fp8_flops_per_s * gpu.fp8_matmul_efficiency)
    assert attention == bf16


def test_fp8_linear_layers_shorten_the_step_and_keep_the_flops():
    bf16, fp8 = SESSION.evaluate(spec()), SESSION.evaluate(spec(linear="fp8-tensorwise"))
    assert fp8.flops_per_step == bf16.flops_per_step
    assert fp8.hardware_flops_per_step == bf16.hardware_flops_per_step
    assert fp8.step_seconds < bf16.step_seconds
    # MFU stays against the bf16 peak of [precision] compute.
    assert fp8.mfu / bf16.mfu == pytest.approx(bf16.step_seconds / fp8.step_seconds)
    # Less than a halving: attention stays bf16 and the fp8 peak is reached less well.
    assert fp8.compute_seconds > bf16.compute_seconds / 2
    assert not any("not costed" in w for w in fp8.warnings)


def _elementwise_bytes(plan: llmpar.Plan) -> float:
    [step] = [d for d in plan.derivations if d.quantity == "step_seconds"]
    return float(step.inputs["elementwise_bytes"])


def one_gpu(recompute: str = "none", output: bool = False, **precision: Any) -> dict[str, Any]:
    """Llama-3-8B on one H100, micro-batch 2, 4 micro-batches, fused attention; `output`:
    under the default profile with the output layer in the linear layers' format."""
    training: dict[str, Any] = {
        "sequence_length": 4096, "micro_batch_size": 2, "global_batch_size": 8,
        "activation_model": "fused", "recompute": recompute}
    if output:
        training["framework"] = {"preset": "megatron-core", "fp8_output_layer": True}
    return {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "precision": precision,
            "training": training}


def test_fp8_casts_move_each_linear_input_gradient_and_weight_by_hand():
    # Llama-3-8B: h 4096, f 14336, Q 4096 and K, V 1024 wide each, vocabulary 128256, 32
    # layers. Each cast reads bf16 (2 bytes) and writes two fp8 copies (1 byte each).
    # Megatron-Core (the default profile) keeps its output layer in bf16: no cast there.
    h, f, qkv, vocab, layers = 4096, 14336, 4096 + 2 * 1024, 128256, 32
    tokens, micro_batches, per_element = 2 * 4096, 4, 2 + 2 * 1
    inputs = layers * (h + h + h + f)  # Q/K/V, output, gate/up, down
    gradients = layers * (qkv + h + 2 * f + h)
    weights = layers * (h * qkv + h * h + h * 2 * f + f * h)
    expected = ((inputs + gradients) * tokens * micro_batches + weights) * per_element
    added = (_elementwise_bytes(SESSION.evaluate(one_gpu(linear="fp8-tensorwise")))
             - _elementwise_bytes(SESSION.evaluate(one_gpu())))
    assert added == pytest.approx(expected, rel=1e-12)
    # A stack that runs the output layer in fp8 casts its input, its output gradient and
    # its weight as well.
    output = (h + vocab) * tokens * micro_batches + h * vocab
    whole = _elementwise_bytes(SESSION.evaluate(one_gpu(linear="fp8-tensorwise", output=True)))
    assert whole - _elementwise_bytes(SESSION.evaluate(one_gpu(output=True))) == (
        pytest.approx(expected + output * per_element, rel=1e-12))


def test_an_output_layer_left_in_bf16_runs_at_the_bf16_rate():
    """Megatron-Core's output layer (not a Transformer Engine module) runs at the bf16
    rate beside fp8 layers: its 3 x 2 x h x vocab FLOPs per token take
    1 / bf16 rate - 1 / fp8 rate longer than in a stack that converts it (compute-bound
    either way, so its shape loss, the launch's fixed time, is the same)."""
    kept, converted = (SESSION.evaluate(one_gpu(linear="fp8-tensorwise", output=flag))
                       for flag in (False, True))
    gpu = SESSION.load_spec(one_gpu()).hardware.gpu
    bf16_rate = gpu.peak_flops_per_s("bf16") * gpu.matmul_efficiency
    fp8_rate = gpu.peak_fp8_flops_per_s * gpu.fp8_matmul_efficiency
    flops = 3 * 2 * 4096 * 128256 * 8 * 4096  # forward and backward, 8 sequences
    [a] = [d for d in kept.derivations if d.quantity == "step_seconds"]
    [b] = [d for d in converted.derivations if d.quantity == "step_seconds"]
    assert a.inputs["matmul_seconds"] - b.inputs["matmul_seconds"] == pytest.approx(
        flops / bf16_rate - flops / fp8_rate, rel=1e-9)


def test_fp8_casts_take_time_and_recomputation_casts_again():
    plain = SESSION.evaluate(one_gpu(linear="fp8-tensorwise"))
    rerun = SESSION.evaluate(one_gpu("full", linear="fp8-tensorwise"))
    cast = _elementwise_bytes(plain) - _elementwise_bytes(SESSION.evaluate(one_gpu()))
    rerun_cast = (_elementwise_bytes(rerun)
                  - _elementwise_bytes(SESSION.evaluate(one_gpu("full"))))
    # The rerun casts the inputs again (not the gradients, nor the weights).
    assert cast < rerun_cast < 2 * cast
    gpu = SESSION.load_spec(one_gpu()).hardware.gpu
    [step] = [d for d in plain.derivations if d.quantity == "step_seconds"]
    assert plain.compute_seconds == pytest.approx(
        step.inputs["matmul_seconds"] + _elementwise_bytes(plain)
        / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency))


def test_block_scales_make_casts_larger():
    def cast(recipe: str) -> float:
        return (_elementwise_bytes(SESSION.evaluate(one_gpu(linear=recipe)))
                - _elementwise_bytes(SESSION.evaluate(one_gpu())))

    # Per element: 2 read + 2 x (1 + scales) written.
    assert cast("fp8-blockwise") / cast("fp8-tensorwise") == pytest.approx(
        (2 + 2 * (1 + 4 / 128)) / 4)
    assert cast("fp8-tensorwise") == cast("fp8-rowwise")


def test_a_gpu_without_an_fp8_peak_is_refused():
    with pytest.raises(llmpar.SpecError) as error:
        SESSION.evaluate(spec("dgx-a100", linear="fp8-rowwise"))
    assert [p.path for p in error.value.problems] == ["$.precision.linear"]


def _rows(name: str) -> dict[str, dict[str, Any]]:
    return {r["gpu"]: r for r in tomllib.loads((GEMM / name).read_text())["rows"]}


def test_fp8_matmul_efficiencies_follow_the_measured_fp8_to_bf16_ratio():
    fp8, bf16 = _rows("stas00_mamf_fp8_table.toml"), _rows("stas00_mamf_table.toml")
    assert set(fp8) == {"h100-sxm", "h200-sxm", "b200", "b300", "gb200"}
    for name, row in fp8.items():
        gpu = SESSION.load_spec({"model": "llama-3-8b", "hardware": {"gpu": name}}).hardware.gpu
        assert row["efficiency"] == pytest.approx(row["tflops"] / row["peak_tflops"], abs=1e-4)
        assert row["peak_tflops"] * 1e12 == pytest.approx(gpu.peak_fp8_flops_per_s)
        ratio = row["efficiency"] / bf16[row["bf16_gpu"]]["efficiency"]
        assert gpu.fp8_matmul_efficiency == pytest.approx(gpu.matmul_efficiency * ratio,
                                                          abs=5e-4)
