"""Phi-4-mini's layer as transformers 5.24 runs it on the CPU (Phi3ForCausalLM: fused
qkv_proj and gate_up_proj, RoPE on partial_rotary_factor 0.75 of each head, the rest
concatenated unrotated): hf-eager and hf-sdpa against the bytes measured per tensor in
validation/data/phi-4-mini.json (torch 2.13.0, b 1-2, s 128-512, 1 and 2 layers, at a
width of 1024 with 8 heads and 4 kv heads of 128), and RoPE's cos and sin by hand."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "phi-4-mini.json")
RUNS = runs_by_key(DATA)
HEAD_DIM, ROTATED = 128, 96
"""int(128 x 0.75) channels rotated (compute_default_rope_parameters)."""


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_run_is_exact(key):
    assert_exact(DATA, RUNS[key])


def test_every_shape_was_measured():
    assert len(RUNS) == 2 * 6


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_rope_keeps_cos_and_sin_of_the_rotated_channels(attention):
    # measured: the first layer's products with q_rot and k_rot keep cos and sin of
    # 1 x 1 x s x 96 bf16; llmpar keeps them once outside the layers at rotary_dim 96,
    # and would count 2 x s x (128 - 96) x 2 bytes more at the whole head
    found = DATA["variants"][0]
    listing = next(i for i in found["inventory"]
                   if i["num_layers"] == 1 and i["attn_implementation"] == attention)
    rows = [dict(zip(DATA["inventory_fields"], r, strict=True)) for r in listing["tensors"]]
    kept = [r["shape"] for r in rows if r["module"] == "model.layers.0.self_attn"
            and r["saved_by_autograd_nodes"] == "MulBackward0"
            and r["first_save_of_storage"] and r["storage_live_after_forward"]]
    assert kept == [[1, 1, 256, ROTATED]] * 2
    run = RUNS["main", attention, 1, 256]
    spec = llmpar.load_spec(M.spec_table(DATA, run, 1, ROOT))
    assert (spec.model.rotary_fraction, spec.model.rotary_dim) == (0.75, ROTATED)
    inventory = hf_inventory(spec, HfRun(attention=attention))
    rope = [t for t in inventory.fixed if t.name.startswith("RoPE")]
    assert [t.bytes for t in rope] == [256 * ROTATED * 2] * 2
    whole = attrs.evolve(spec, model=attrs.evolve(spec.model, rotary_fraction=1.0))
    assert (hf_inventory(whole, HfRun(attention=attention)).total_bytes
            - inventory.total_bytes == 2 * 256 * (HEAD_DIM - ROTATED) * 2)
