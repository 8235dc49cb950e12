"""ERNIE 4.5's, GLM-4.5-Air's and MiniMax-M2's layers as transformers 5.24 runs them on
the CPU (Ernie4_5_MoeForCausalLM: the interleaved fp32 RoPE copied per layer, the softmax
router with the correction bias and a clamped renormalization, the shared experts, a dense
first layer; Glm4MoeForCausalLM: Q/K/V biases, RoPE on half of each head and concatenated,
DeepSeek-V3's sigmoid router, the shared expert, a dense first layer; MiniMaxM2ForCausalLM:
RMSNorm over the whole query and key projections, RoPE on half of each head, a sigmoid
router in the weights' dtype): hf-eager and hf-sdpa against the bytes measured per tensor
in validation/data/ernie-4.5-21b-a3b.json, glm-4.5-air.json and minimax-m2.json (torch
2.13.0, b 1-2, s 128-512, 1 and 2 layers of each kind), the routers and RoPE by hand, and
the whole models as their measured layer kinds."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventories import assert_exact, assert_split_tags, runs_by_key

import llmpar
from llmpar.footprint.activations.common import sizes_of
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.family import family_of
from llmpar.footprint.activations.hf.moe import router_tensors

ROOT = Path(__file__).resolve().parents[1]
ERNIE = M.load(ROOT / "validation" / "data" / "ernie-4.5-21b-a3b.json")
ERNIE_RUNS = runs_by_key(ERNIE)
GLM = M.load(ROOT / "validation" / "data" / "glm-4.5-air.json")
GLM_RUNS = runs_by_key(GLM)
GLM_ROTATED = 64
"""RoPE's width in transformers: partial_rotary_factor 0.5 of head_dim 128 (MiniMax-M2's
rotary_dim is 64 of 128 as well)."""


MINIMAX = M.load(ROOT / "validation" / "data" / "minimax-m2.json")
MINIMAX_RUNS = runs_by_key(MINIMAX)


def spec(model: str, s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def measured_rows(data: dict, variant: str, attention: str, module: str) -> list[dict]:
    """The storages first saved inside `module` of the 2-layer run at b 1, s 256 and alive
    after the forward."""
    found = next(v for v in data["variants"] if v["variant"] == variant)
    listing = next(i for i in found["inventory"]
                   if i["num_layers"] == 2 and i["attn_implementation"] == attention)
    rows = [dict(zip(data["inventory_fields"], row, strict=True)) for row in listing["tensors"]]
    return [r for r in rows if r["module"].startswith(module) and r["first_save_of_storage"]
            and r["storage_live_after_forward"] and r["kind"] == "activation"]


@pytest.mark.parametrize("key", sorted(ERNIE_RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_ernie_layer_kind_is_exact(key):
    run = ERNIE_RUNS[key]
    assert_exact(ERNIE, run)


@pytest.mark.parametrize(("b", "s"), [(1, 256), (2, 128), (1, 512)])
def test_ernie_router_by_hand(b, s):
    # Ernie4_5_MoeTopKRouter (transformers 5.24): F.linear(x.float(), weight.float()) keeps
    # the fp32 copy of x (h 2560); softmax keeps its 64 fp32 probabilities, which the gather
    # keeps too; the biased top-6 yields indices only, the gather keeps them (int64); the
    # out-of-place division keeps the 6 gathered probabilities and the clamped sum, and
    # clamp keeps the sum
    h, experts, k = 2560, 64, 6
    per_token = 4 * h + 4 * experts + 8 * k + 4 * k + 4 + 4
    given = spec("ernie-4.5-21b-a3b", s=s, b=b)
    ctx = Context(sizes=sizes_of(given), model=given.model, run=HfRun(),
                  family=family_of(given.model))
    counted = sum(t.bytes for t in router_tensors(ctx))
    assert counted == b * s * per_token
    if (b, s) == (1, 256):
        rows = measured_rows(ERNIE, "moe_layers", "eager", "model.layers.1.mlp.gate")
        assert counted == sum(r["storage_bytes"] for r in rows) == 2_707_456


def test_ernie_rope_is_copied_per_layer_in_fp32():
    # apply_rotary_pos_emb repeats each half of the fp32 cos and sin into s x 128 copies in
    # every layer, kept by the products with q.float() and k.float(): 2 x 4 bytes x s x 128
    # per layer, none outside the layers (the rotary embedding's own are kept by nothing)
    for attention in ("eager", "sdpa"):
        rows = measured_rows(ERNIE, "moe_layers", attention, "model.layers.1.self_attn")
        rope = [r for r in rows if r["saved_by_autograd_nodes"] == "MulBackward0"
                and r["dtype"] == "float32"]
        assert [r["shape"] for r in rope] == [[1, 1, 256, 128]] * 2
        inventory = hf_inventory(spec("ernie-4.5-21b-a3b"), HfRun(attention=attention))
        for group in inventory.groups:
            copies = [t for t in group.tensors if t.name.startswith("RoPE")]
            assert sum(t.bytes for t in copies) == 2 * 4 * 256 * 128
        assert not [t for t in inventory.fixed if t.name.startswith("RoPE")]


def test_the_whole_ernie_model_is_its_measured_layer_kinds_and_outside():
    # one dense layer, then 27 with experts (moe_layer_start_index 1), at b 1, s 256; the
    # measured layers are those of the preset, experts and all
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec("ernie-4.5-21b-a3b"), HfRun(attention=attention))
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {"dense": 1, "moe": 27}
        per_layer = {"dense": ERNIE_RUNS["dense_layers", attention, 1, 256].per_layer_bytes,
                     "moe": ERNIE_RUNS["moe_layers", attention, 1, 256].per_layer_bytes}
        fixed = ERNIE_RUNS["moe_layers", attention, 1, 256].fixed_bytes
        assert fixed == ERNIE_RUNS["dense_layers", attention, 1, 256].fixed_bytes
        assert inventory.total_bytes == fixed + sum(counts[k] * per_layer[k] for k in counts)


@pytest.mark.parametrize("model", ["ernie-4.5-21b-a3b", "glm-4.5-air"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_every_tensor_is_tagged(model, attention):
    # scores (s x s) only with eager attention; every per-token tensor splits with the
    # context; none is split both by heads and by sequence parallelism
    inventory = hf_inventory(spec(model, s=512), HfRun(attention=attention))
    for group in inventory.groups:
        for t in group.tensors:
            assert_split_tags(t)
        scores = [t for t in group.tensors if t.attention_score]
        assert bool(scores) == (attention == "eager")


@pytest.mark.parametrize(("model", "config", "rows"), [
    ("glm-4.5-air", {"partial_rotary_factor": 0.5}, (GLM, "moe_layers")),
    ("minimax-m2", {"rotary_dim": 64}, (MINIMAX, "main"))])
def test_rope_keeps_cos_and_sin_of_the_rotated_half(model, config, rows):
    # the rotary embedding's inv_freq spans int(128 x 0.5) = 64 channels
    # (compute_default_rope_parameters; MiniMaxM2Config reads rotary_dim 64 as
    # partial_rotary_factor 64 / 128): cos and sin are s x 64 bf16 each, built once
    # outside the layers, and the preset, imported from the published config.json, says so
    data, variant = rows
    assert {key: data_config(data)[key] for key in config} == config
    preset = spec(model)
    assert preset.model.rotary_fraction == 0.5 and preset.model.rotary_dim == GLM_ROTATED
    inventory = hf_inventory(preset, HfRun(attention="sdpa"))
    rope = [t for t in inventory.fixed if t.name.startswith("RoPE")]
    assert [t.bytes for t in rope] == [256 * GLM_ROTATED * 2] * 2
    found = next(v for v in data["variants"] if v["variant"] == variant)
    listing = next(i for i in found["inventory"]
                   if i["num_layers"] == 1 and i["attn_implementation"] == "sdpa")
    rows_kept = [dict(zip(data["inventory_fields"], r, strict=True))
                 for r in listing["tensors"]]
    # measured: first kept by the products with q and k in the first layer
    measured = [r["shape"] for r in rows_kept if r["module"] == "model.layers.0.self_attn"
                and r["saved_by_autograd_nodes"] == "MulBackward0"
                and r["first_save_of_storage"] and r["storage_live_after_forward"]]
    assert measured == [[1, 1, 256, GLM_ROTATED]] * 2


def data_config(data: dict) -> dict:
    return M.load(ROOT / data["published_config_file"])


@pytest.mark.parametrize("key", sorted(GLM_RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_glm_layer_kind_is_exact(key):
    run = GLM_RUNS[key]
    assert_exact(GLM, run)


def test_glm_router_by_hand():
    # Glm4MoeTopkRouter (transformers 5.24, DeepSeek-V3's): F.linear(x.float(), ...) keeps
    # the fp32 copy of x (h 4096); sigmoid keeps its 32 fp32 scores (the measured experts),
    # which the gather keeps too; the group-limited top-8 yields indices, the gather keeps
    # them (int64); the in-place division keeps the 8 gathered scores and their sum; the
    # routed_scaling_factor product keeps nothing
    h, experts, k, s = 4096, 32, 8, 256
    model = {"preset": "glm-4.5-air", "num_layers": 2,
             "moe": {"num_experts": experts, "dense_layers": 0}}
    given = llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "precision": {"activations": "bf16", "weights": "bf16"},
                              "training": {"sequence_length": s, "micro_batch_size": 1}})
    ctx = Context(sizes=sizes_of(given), model=given.model, run=HfRun(),
                  family=family_of(given.model))
    counted = sum(t.bytes for t in router_tensors(ctx))
    rows = measured_rows(GLM, "moe_layers", "sdpa", "model.layers.1.mlp.gate")
    assert counted == s * (4 * h + 4 * experts + 8 * k + 4 * k + 4)
    assert counted == sum(r["storage_bytes"] for r in rows) == 4_252_672


def test_glm_sdpa_output_is_copied_for_the_output_projection():
    # the concatenated RoPE makes q a new b x a x s x d tensor, so SDPA's output comes out
    # laid out the same and o_proj keeps its transposed contiguous copy (as Qwen3-Next's)
    rows = measured_rows(GLM, "moe_layers", "sdpa", "model.layers.1.self_attn.o_proj")
    [copy] = rows
    assert copy["shape"] == [256, 96 * 128]
    [group, _] = hf_inventory(spec("glm-4.5-air"), HfRun(attention="sdpa")).groups
    names = [t.name for t in group.tensors]
    assert "output projection input" in names and "attention output" in names


def test_the_whole_glm_model_is_its_measured_layer_kinds_and_outside():
    # one dense layer, then 45 with 128 experts (the measured 32 change only the router's
    # fp32 scores per token and grouped_mm's int32 offsets, 4 x (256 + 1) bytes per
    # expert), at b 1, s 256; outside the layers as measured
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec("glm-4.5-air"), HfRun(attention=attention))
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {"dense": 1, "moe": 45}
        moe = GLM_RUNS["moe_layers", attention, 1, 256]
        per_layer = {"dense": GLM_RUNS["dense_layers", attention, 1, 256].per_layer_bytes,
                     "moe": moe.per_layer_bytes + 4 * (256 + 1) * (128 - 32)}
        fixed = moe.fixed_bytes
        assert inventory.total_bytes == fixed + sum(counts[k] * per_layer[k] for k in counts)


@pytest.mark.parametrize("key", sorted(MINIMAX_RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_minimax_layer_is_exact(key):
    run = MINIMAX_RUNS[key]
    assert_exact(MINIMAX, run)


def test_minimax_router_by_hand():
    # MiniMaxM2TopKRouter (transformers 5.24): F.linear in the weights' dtype keeps the MoE
    # input itself (h 3072, bf16, counted once as the MLP's input); sigmoid of the fp32
    # logits keeps its 32 fp32 scores (the measured experts), which the gather keeps too;
    # the biased top-8 yields indices, the gather keeps them (int64); the in-place
    # division keeps a copy of the 8 gathered scores and their sum
    h, experts, k, s = 3072, 32, 8, 256
    model = {"preset": "minimax-m2", "num_layers": 2, "moe": {"num_experts": experts}}
    given = llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                              "precision": {"activations": "bf16", "weights": "bf16"},
                              "training": {"sequence_length": s, "micro_batch_size": 1}})
    ctx = Context(sizes=sizes_of(given), model=given.model, run=HfRun(),
                  family=family_of(given.model))
    counted = sum(t.bytes for t in router_tensors(ctx))
    assert counted == s * (4 * experts + 8 * k + 4 * k + 4)
    rows = measured_rows(MINIMAX, "main", "eager", "model.layers.1.mlp.gate")
    assert counted + s * h * 2 == sum(r["storage_bytes"] for r in rows) == 1_631_232


def test_the_whole_minimax_model_is_its_measured_layer_and_outside():
    # 62 layers with 256 experts (the measured 32 change only the router's fp32 scores per
    # token and grouped_mm's int32 offsets, 4 x (256 + 1) bytes per expert), at b 1,
    # s 256; outside the layers as measured
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec("minimax-m2"), HfRun(attention=attention))
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {"moe": 62}
        run = MINIMAX_RUNS["main", attention, 1, 256]
        per_layer = run.per_layer_bytes + 4 * (256 + 1) * (256 - 32)
        assert inventory.total_bytes == run.fixed_bytes + 62 * per_layer
