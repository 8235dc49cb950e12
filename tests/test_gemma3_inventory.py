"""Gemma 3's layers as transformers 5.24 runs them on the CPU (Gemma3ForCausalLM: sandwich
norms, per-head QK norms, one kv head in the 1B model, a sliding window of 512 in five
layers of six with their own RoPE base): hf-eager and hf-sdpa against the bytes measured
per tensor in validation/data/gemma-3-1b.json (torch 2.13.0, b 1-2, s 128-512, 1 and 2
layers of each kind, and a windowed and a global layer side by side with a window of 128
that the sequence reaches and passes), the kept key and value and the SDPA mask by hand,
and the whole model as its measured layer kinds."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parents[1]
GEMMA = M.load(ROOT / "validation" / "data" / "gemma-3-1b.json")
RUNS = runs_by_key(GEMMA)
HEAD_DIM, WINDOW = 256, 512


def spec(s: int = 256, b: int = 1, **model: object) -> llmpar.Spec:
    return llmpar.load_spec({"model": {"preset": "gemma-3-1b", **model},
                             "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def measured_rows(variant: str, attention: str, module: str, layers: int = 2) -> list[dict]:
    """The storages first saved inside `module` of the `layers`-layer run at b 1, s 256
    and alive after the forward."""
    found = next(v for v in GEMMA["variants"] if v["variant"] == variant)
    listing = next(i for i in found["inventory"]
                   if i["num_layers"] == layers and i["attn_implementation"] == attention)
    rows = [dict(zip(GEMMA["inventory_fields"], row, strict=True))
            for row in listing["tensors"]]
    return [r for r in rows if r["module"] == module and r["first_save_of_storage"]
            and r["storage_live_after_forward"] and r["kind"] == "activation"]


def test_both_layer_kinds_and_every_shape_were_measured():
    assert {key[0] for key in RUNS} == {"sliding_attention_layers", "full_attention_layers",
                                        "mixed_layers_small_window"}
    assert len(RUNS) == 2 * 2 * 6 + 2 * 3


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_gemma3_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(GEMMA, run)


def test_one_kv_head_is_kept_unexpanded_by_eager_attention_at_batch_one():
    # repeat_kv of one kv head is a stride-0 view and matmul folds (1, 4) heads into bmm's
    # batch without a copy: Q.K^T and P.V keep the 1 x 256 x 256 bf16 key and value
    # storages (131,072 bytes each), not 4-head copies; the query is 4 x 256 x 256
    rows = measured_rows("sliding_attention_layers", "eager", "model.layers.1.self_attn")
    bmm = sorted(r["storage_bytes"] for r in rows if r["saved_by_autograd_nodes"]
                 == "BmmBackward0")
    assert bmm == [131_072, 131_072, 524_288, 524_288]
    [group] = hf_inventory(spec(num_layers=1), HfRun(attention="eager")).groups
    kept = {t.name: t.bytes for t in group.tensors}
    assert kept["key (one kv head, a view)"] == kept["value (one kv head, a view)"] == 131_072
    at_two = hf_inventory(spec(b=2, num_layers=1), HfRun(attention="eager")).groups[0]
    assert "key expanded by repeat_kv" in {t.name for t in at_two.tensors}


@pytest.mark.parametrize("b", [1, 2])
def test_sdpa_keeps_the_converted_window_mask_in_every_sliding_layer(b):
    # at s = window = 512 transformers passes SDPA the boolean b x 1 x s x s mask (and the
    # key and value repeated: views of the one kv head); SDPA converts it to an additive
    # bf16 mask in every call, which its kernel keeps: b x s x s x 2 bytes per layer, and
    # nothing outside the layers. The full-attention layers run is_causal without one.
    s = WINDOW
    sliding = RUNS["sliding_attention_layers", "sdpa", b, s]
    full = RUNS["full_attention_layers", "sdpa", b, s]
    assert sliding.per_layer_bytes - full.per_layer_bytes == b * s * s * 2
    assert sliding.fixed_bytes == full.fixed_bytes
    [group] = hf_inventory(spec(s=s, b=b, num_layers=1), HfRun(attention="sdpa")).groups
    [mask] = [t for t in group.tensors if "mask" in t.name]
    assert mask.bytes == b * s * s * 2 and mask.attention_score


@pytest.mark.parametrize(("b", "s"), [(1, 128), (1, 256), (2, 256)])
def test_sdpa_keeps_the_window_mask_in_the_windowed_layers_only(b, s):
    # a windowed and a global layer side by side (one unit), window 128 <= s: the windowed
    # layer gets the sliding mask (masking_utils' _ignore_causal_mask_sdpa refuses the skip
    # once kv_length >= the window) and keeps it converted, b x s x s x 2 bytes, with its key
    # and value repeated by repeat_kv (views of the one kv head); the global layer's
    # create_causal_mask returns None, SDPA runs is_causal with enable_gqa: no mask. Eager
    # attention keeps no mask in either (the additive mask is not an operand of a product).
    sdpa = RUNS["mixed_layers_small_window", "sdpa", b, s]
    eager = RUNS["mixed_layers_small_window", "eager", b, s]
    table = M.spec_table(GEMMA, sdpa, 1, ROOT)  # one unit: two layers
    assert table["model"]["sliding_window"] == 128
    assert table["model"]["sliding_window_pattern"] == 2
    [group] = hf_inventory(llmpar.load_spec(table), HfRun(attention="sdpa")).groups
    [mask] = [t for t in group.tensors if "mask" in t.name]
    assert group.count == 2 and mask.bytes == b * s * s * 2 / 2  # one layer of the two
    assert_exact(GEMMA, sdpa)
    assert_exact(GEMMA, eager)
    if (b, s) == (1, 256):
        windowed = measured_rows("mixed_layers_small_window", "sdpa",
                                 "model.layers.0.self_attn", layers=1)
        full = measured_rows("mixed_layers_small_window", "sdpa",
                             "model.layers.1.self_attn", layers=1)
        kernel = "ScaledDotProductFlashAttentionForCpuBackward0"
        shapes = sorted(r["shape"] for r in windowed if r["saved_by_autograd_nodes"] == kernel)
        assert shapes.count([1, 4, 256, 256]) == 4  # q, the repeated key, the mask, output
        assert sorted(r["shape"] for r in full if r["saved_by_autograd_nodes"]
                      == kernel).count([1, 4, 256, 256]) == 2  # q and output
        assert (sum(r["storage_bytes"] for r in windowed)
                - sum(r["storage_bytes"] for r in full) == s * s * 2)


def test_the_whole_gemma3_model_is_its_measured_layer_kinds_and_outside():
    # 26 layers (22 windowed, 4 global) at b 1, s 256 < window, where both kinds keep the
    # same: outside the layers as measured plus the second RoPE set (the global base's cos
    # and sin, s x 256 bf16 each), since the model has both kinds
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec(), HfRun(attention=attention))
        assert {group.kind: group.count for group in inventory.groups} == {"dense": 26}
        run = RUNS["sliding_attention_layers", attention, 1, 256]
        assert run.per_layer_bytes == RUNS["full_attention_layers", attention, 1,
                                           256].per_layer_bytes
        rope = [t for t in inventory.fixed if t.name.startswith("RoPE")]
        assert len(rope) == 4
        assert inventory.total_bytes == (run.fixed_bytes + 2 * 256 * HEAD_DIM * 2
                                         + 26 * run.per_layer_bytes)


def test_layer_types_all_full_read_as_no_window():
    config = M.config_used(GEMMA, "full_attention_layers", 2, ROOT)
    model = llmpar.model_from_hf(config)
    assert model.sliding_window is None
    windowed = llmpar.model_from_hf(M.config_used(GEMMA, "sliding_attention_layers", 2, ROOT))
    assert windowed.sliding_window == WINDOW
