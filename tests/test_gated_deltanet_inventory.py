"""Qwen3-Next's two layer kinds as transformers 5.24 runs them on the CPU (the torch path
of the chunked gated delta rule; the gated attention, eager and SDPA): hf-eager and hf-sdpa
against the bytes measured per tensor in validation/data/qwen3-next-80b-a3b.json (torch
2.13.0, b 1-2, s 128-512, 1 and 2 layers of each kind, 32 of the 512 routed experts), the
gated DeltaNet's tensors by hand, and the whole model as its measured layer kinds."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
from inventories import assert_exact, assert_split_tags, runs_by_key

import llmpar
from llmpar.footprint.activations.common import sizes_of
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.activations.hf.context import Context
from llmpar.footprint.activations.hf.deltanet import gated_deltanet_tensors
from llmpar.footprint.activations.hf.family import family_of
from llmpar.footprint.baseline import baseline_footprint

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "qwen3-next-80b-a3b.json")
RUNS = runs_by_key(DATA)
ROTATED = 64
"""RoPE's width in transformers: partial_rotary_factor 0.25 of head_dim 256."""


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA, run)


def test_rope_keeps_cos_and_sin_of_the_rotated_quarter():
    # partial_rotary_factor 0.25 of head_dim 256 (Qwen3NextConfig): cos and sin are
    # s x 64 bf16 each, kept only where a layer attends (the DeltaNets alone keep none)
    model = spec().model
    assert (model.rotary_fraction, model.rotary_dim) == (0.25, ROTATED)
    rope = [t for t in hf_inventory(spec(), HfRun(attention="sdpa")).fixed
            if t.name.startswith("RoPE")]
    assert [t.bytes for t in rope] == [256 * ROTATED * 2] * 2
    for attention in ("eager", "sdpa"):
        attends = RUNS["attention_layers", attention, 1, 256].fixed_bytes
        alone = RUNS["linear_attention_layers", attention, 1, 256].fixed_bytes
        assert attends - alone == 2 * 256 * ROTATED * 2
    # the fused inventory's fp32 frequency table spans the same channels (Megatron-Core's
    # RotaryEmbedding: int(kv_channels x rotary_percent)), s x 64, and the whole head of a
    # model that rotates all of it
    fused = {"activation_model": "fused"}
    table = llmpar.load_spec({"model": "qwen3-next-80b-a3b", "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 256, **fused}})
    whole = attrs.evolve(table, model=attrs.evolve(table.model, rotary_fraction=1.0))
    for given, width in ((table, ROTATED), (whole, 256)):
        inventory = baseline_footprint(given).activations
        assert inventory is not None
        [frequencies] = [t for t in inventory.fixed if t.name.startswith("RoPE")]
        assert frequencies.bytes == 256 * width * 4


def spec(s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": "qwen3-next-80b-a3b", "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def measured_mixer_bytes(layer: str = "model.layers.1.linear_attn") -> int:
    """The storages first saved inside one gated DeltaNet (its gated norm and projections
    included) and alive after the forward, eager, b 1, s 256, 2 layers."""
    variant = next(v for v in DATA["variants"] if v["variant"] == "linear_attention_layers")
    listing = next(i for i in variant["inventory"]
                   if i["num_layers"] == 2 and i["attn_implementation"] == "eager")
    fields = DATA["inventory_fields"]
    rows = [dict(zip(fields, row, strict=True)) for row in listing["tensors"]]
    return sum(r["storage_bytes"] for r in rows
               if r["module"].startswith(layer) and r["first_save_of_storage"]
               and r["storage_live_after_forward"] and r["kind"] == "activation")


@pytest.mark.parametrize(("b", "s"), [(1, 256), (2, 128), (1, 512), (1, 64)])
def test_gated_deltanet_by_hand(b, s):
    # Qwen3NextGatedDeltaNet (transformers 5.24): h 2048, 16 key heads and 32 value heads
    # of 128 (q, k repeated to 32 heads), conv over 8192 channels with 4 taps, chunks of 64.
    # bf16: the projections' input, the convolution's input and padded output, beta and
    # the out_proj input; fp32: softplus's input and output, q and k before their L2 norms
    # and the two rsqrt, beta, padded v, k, k*beta, q, five Q x Q tensors per chunk, three
    # exp per position and one per chunk, the solves' outputs, q (from chunk 2 on) and k
    # decayed, c states of 128 x 128 and v_new; the gated norm (fp32 input, rsqrt, its bf16
    # normalized and weighted x, fp32 gate and silu); per layer exp(A_log), its negation
    # and the 64 x 64 boolean mask.
    h, heads, d, conv, q = 2048, 32, 128, 8192, 64
    c = math.ceil(s / q)
    padded, v = c * q, heads * d
    bf16 = 2 * b * s * (h + conv + heads + v) + 2 * b * conv * (s + 3) + 2 * b * s * 2 * v
    fp32 = 4 * b * (s * 2 * heads + heads * s * (2 * d + 2 + 1)
                    + heads * padded * d * 4 + heads * c * q * 5 * q + heads * padded * 3
                    + heads * c + heads * padded * 2 * d + heads * padded * d * (c > 1)
                    + heads * padded * d + c * heads * d * d + heads * padded * d
                    + s * v + s * heads + s * 2 * v)
    per_layer = 4 * 2 * heads + q * q
    given = spec(s=s, b=b)
    ctx = Context(sizes=sizes_of(given),
                  model=given.model, run=HfRun(), family=family_of(given.model))
    counted = sum(t.bytes for t in gated_deltanet_tensors(ctx))
    assert counted == bf16 + fp32 + per_layer
    if (b, s) == (1, 256):
        assert counted == measured_mixer_bytes() == 93_688_576


def test_the_output_gate_keeps_its_sigmoid_and_the_gated_output():
    # attn_output * sigmoid(gate): the product keeps the output (made contiguous) and the
    # sigmoid, and o_proj keeps the product: two more b x s x 16 x 256 bf16 tensors than
    # the same attention without the gate
    whole = spec()
    model = attrs.evolve(whole.model, mixer_pattern="A", linear_attention=None)
    gated = attrs.evolve(whole, model=model)
    plain = attrs.evolve(whole, model=attrs.evolve(model, attention_output_gate=False))
    for attention in ("eager", "sdpa"):
        [with_gate] = hf_inventory(gated, HfRun(attention=attention)).groups
        [without] = hf_inventory(plain, HfRun(attention=attention)).groups
        assert with_gate.layer_bytes - without.layer_bytes == 2 * 256 * 4096 * 2


def test_the_whole_model_is_its_measured_layer_kinds_and_outside():
    # 36 gated DeltaNet and 12 gated attention layers, each with 512 experts (the measured
    # 32 change only the router's fp32 probabilities per token and grouped_mm's int32
    # offsets, 4 x (256 + 1) bytes per expert), at b 1, s 256;
    # outside the layers as measured with DeltaNets alone, plus RoPE's cos and sin of the
    # attention layers (s x 64 bf16 each)
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec(), HfRun(attention=attention))
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {"moe linear_attention": 36, "moe attention": 12}
        per_layer = {kind: RUNS[variant, attention, 1, 256].per_layer_bytes
                     + 4 * (256 + 1) * (512 - 32)
                     for kind, variant in (("moe linear_attention", "linear_attention_layers"),
                                           ("moe attention", "attention_layers"))}
        fixed = RUNS["linear_attention_layers", attention, 1, 256].fixed_bytes
        assert inventory.total_bytes == (fixed + 2 * 256 * ROTATED * 2
                                         + sum(counts[k] * per_layer[k] for k in counts))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_every_tensor_is_tagged(attention):
    # scores (s x s) only in the attention layers; every per-token tensor splits with the
    # context; none is split both by heads and by sequence parallelism; the recurrent
    # state and the chunked scan's tensors split by heads with tensor parallelism
    from llmpar.footprint.inventory import SPLIT_TENSOR

    inventory = hf_inventory(spec(s=512), HfRun(attention=attention))
    for group in inventory.groups:
        for t in group.tensors:
            assert_split_tags(t)
            if "H_v" in [symbol for symbol, _ in t.shape]:
                assert SPLIT_TENSOR in t.splits, t.name
        scores = [t for t in group.tensors if t.attention_score]
        assert bool(scores) == (group.kind == "moe attention" and attention == "eager")
