"""FP4 weight formats (nvfp4, mxfp4): their bytes with block scales, the Blackwell fp4
peak their products run at, dequantization where a GPU has none, and gpt-oss's MXFP4
experts beside BF16 attention."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmpar
from llmpar.dtypes import bytes_per_element, math_format
from llmpar.errors import SpecError

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
GPT_OSS = str(EXAMPLES / "serve-gpt-oss-120b-mxfp4-b200.toml")


def test_bytes_per_element_include_the_block_scales():
    # nvfp4: 4-bit E2M1 + one 8-bit E4M3 scale per 16; mxfp4 (OCP MX v1.0): + one 8-bit
    # E8M0 scale per 32.
    assert bytes_per_element("nvfp4") == (4 + 8 / 16) / 8 == 0.5625
    assert bytes_per_element("mxfp4") == (4 + 8 / 32) / 8 == 0.53125
    assert math_format("nvfp4") == math_format("mxfp4") == "fp4"


@pytest.mark.parametrize(("gpu", "peak"), [("b200", 9e15), ("b300", 13.5e15),
                                           ("gb200", 10e15)])
def test_blackwell_presets_state_the_dense_fp4_peak(gpu, peak):
    preset = llmpar.Session().load_spec(GPT_OSS, {"hardware.gpu": gpu}).hardware.gpu
    assert preset.peak_flops_per_s("nvfp4") == preset.peak_flops_per_s("mxfp4") == peak
    assert peak >= 2 * preset.peak_flops_per_s("fp8")


def test_gpt_oss_experts_in_mxfp4_the_rest_in_bf16():
    plan = llmpar.evaluate(GPT_OSS)
    groups = plan.parameters_by_group
    experts = groups["experts"]
    rest = sum(count for group, count in groups.items() if group != "experts")
    assert plan.weights_bytes == pytest.approx(experts * 0.53125 + rest * 2, rel=1e-9)
    bf16 = llmpar.evaluate(GPT_OSS, {"inference.expert_weights": "bf16"})
    assert bf16.weights_bytes == pytest.approx((experts + rest) * 2, rel=1e-9)
    # Decode at batch 8 streams the touched experts' weights: fewer bytes, a faster step.
    assert plan.tpot_seconds < bf16.tpot_seconds
    assert plan.phases[1].bytes < bf16.phases[1].bytes
    assert any("mxfp4 products run at the fp4 peak" in w for w in plan.warnings)
    assert not any("fp4" in w for w in bf16.warnings)


def test_fp4_products_run_at_twice_the_fp8_peak_on_blackwell():
    def spec(weights: str) -> dict:
        return {"model": "llama-3.1-70b", "hardware": {"gpu": "b200", "num_gpus": 4},
                "inference": {"batch_size": 4, "prompt_tokens": 4096,
                              "generated_tokens": 256, "weights": weights},
                "parallel": {"tensor": {"degree": 4}}}

    fp8, fp4 = llmpar.evaluate(spec("fp8")), llmpar.evaluate(spec("nvfp4"))
    # The same FLOPs; the blocks' linear products at the fp4 peak, the rest unchanged.
    assert fp4.phases[0].flops == pytest.approx(fp8.phases[0].flops, rel=1e-9)
    assert fp4.phases[0].compute_seconds < fp8.phases[0].compute_seconds
    assert fp4.weights_bytes < fp8.weights_bytes
    assert any("nvfp4 weights are read at the GPU's memory_efficiency" in w
               for w in fp4.warnings)


def test_a_gpu_without_fp4_tensor_cores_dequantizes():
    plan = llmpar.evaluate(GPT_OSS, {"hardware.gpu": "h100-sxm", "hardware.num_gpus": 2,
                                     "parallel.tensor.degree": 2})
    assert any("states no fp4 peak, so they are dequantized to bf16" in w
               for w in plan.warnings)
    assert plan.prefill_seconds is not None


def test_an_unknown_expert_format_names_the_key():
    with pytest.raises(SpecError) as error:
        llmpar.evaluate(GPT_OSS, {"inference.expert_weights": "fp3"})
    assert error.value.problems[0].path == "$.inference.expert_weights"
