"""LoRA under tensor parallelism, as Hugging Face PEFT's `LoraParallelLinear`
(peft/tuners/lora/tp_layer.py) builds it over Megatron-Core's parallel linears: under a
column-parallel layer (q, k, v, gate, up) A is whole on every rank and B split by output
columns; under a row-parallel one (o, down) A is split by input rows and B whole. Checked
by hand on Llama-3-8B (h 4096, kv 8 x 128, ffn 14336, 32 layers) and Mixtral-8x7B."""

from __future__ import annotations

import pytest

import llmpar

SESSION = llmpar.Session(load_entry_points=False)
H, KV, FFN, LAYERS, RANK = 4096, 8 * 128, 14336, 32, 16
COLUMN = [(H, H), (H, KV), (H, KV), (H, FFN), (H, FFN)]  # q, k, v, gate, up: (in, out)
ROW = [(H, H), (FFN, H)]  # o, down


def per_rank_adapters(t: int, method: str = "lora") -> float:
    """One tensor rank's adapter parameters of all-linear LoRA: A whole and B / t under
    column-parallel layers (DoRA's magnitude split with B), A / t and B whole under
    row-parallel ones."""
    magnitude = 1 if method == "dora" else 0
    column = sum(RANK * i + (RANK * o + magnitude * o) / t for i, o in COLUMN)
    row = sum(RANK * i / t + RANK * o + magnitude * o for i, o in ROW)
    return LAYERS * (column + row)


def plan(t: int, method: str = "lora", **parallel):
    return SESSION.evaluate({
        "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
        "training": {"sequence_length": 2048, "global_batch_size": 64, "micro_batch_size": 2},
        "parallel": {"tensor": {"degree": t}, "data": {"zero": 0}, **parallel},
        "finetune": {"method": method, "rank": RANK, "target_modules": ["all-linear"]}})


@pytest.mark.parametrize("method", ["lora", "dora"])
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_one_factor_of_each_adapter_is_split(t, method):
    found = plan(t, method)
    # bf16 gradients: 2 bytes per trainable parameter on the GPU
    assert found.gradients_bytes == pytest.approx(2 * per_rank_adapters(t, method), abs=8)


def test_optimizer_states_and_zero_follow_the_split():
    two, one = plan(2), plan(1)
    assert two.optimizer_bytes / one.optimizer_bytes == pytest.approx(
        per_rank_adapters(2) / per_rank_adapters(1), rel=1e-9)
    zero = plan(2, data={"zero": 2})  # data degree 4 shards what tensor left
    assert zero.gradients_bytes == pytest.approx(two.gradients_bytes / 4, abs=8)


def test_the_whole_factor_s_products_run_on_every_tensor_rank():
    # Per token and pass, the whole factor is r x in under column-parallel layers and
    # r x out under row-parallel ones; 3 passes of 2 FLOPs per multiply-accumulate; the
    # t - 1 other ranks repeat it.
    whole = LAYERS * RANK * (sum(i for i, _ in COLUMN) + sum(o for _, o in ROW))
    tokens = 64 * 2048
    for t in (2, 4):
        extra = plan(t).training.hardware_flops_per_step - plan(1).training.hardware_flops_per_step
        assert extra == pytest.approx(3 * 2 * tokens * whole * (t - 1), rel=1e-9)
        assert plan(t).training.flops_per_step == plan(1).training.flops_per_step


def test_mixtral_expert_adapters_split_over_expert_tensor_ranks():
    lora = {"method": "lora", "rank": RANK, "target_modules": ["gate_proj", "up_proj",
                                                              "down_proj"]}

    def mixtral(**expert):
        return SESSION.evaluate({
            "model": "mixtral-8x7b", "hardware": {"gpu": "h100-sxm", "num_gpus": 8},
            "training": {"sequence_length": 1024, "global_batch_size": 8},
            "parallel": {"tensor": {"degree": 2}, "sequence": {}, "expert": {"degree": 4, **expert},
                         "data": {"zero": 0}}, "finetune": lora})

    whole, split = mixtral(tensor_degree=1), mixtral(tensor_degree=2)
    h, ffn = 4096, 14336
    # each expert's gate and up (column: A h x r whole, B r x ffn split) and down (row:
    # A ffn x r split, B r x h whole); 8 experts over 4 expert ranks
    per_expert = {1: RANK * (3 * h + 3 * ffn), 2: RANK * (2 * (h + ffn / 2) + ffn / 2 + h)}
    for degree, found in ((1, whole), (2, split)):
        assert found.gradients_bytes == pytest.approx(
            2 * 32 * 8 / 4 * per_expert[degree], abs=8)
