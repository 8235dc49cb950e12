"""Llama 4 Scout's language model as transformers 5.24 runs it on the CPU
(Llama4ForCausalLM, the text_config of its config.json; eager and SDPA): its two layer
kinds (RoPE and chunked attention with the L2 q/k norm, NoPE and global attention with
the query temperature), each alone, with the top-1 sigmoid router, every expert on its
copy of every token and the shared expert; hf-eager and hf-sdpa against the bytes
measured per tensor in validation/data/llama-4-scout.json (torch 2.13.0, b 1-2, s
128-512, 1 and 2 layers of each kind; a RoPE and a NoPE layer side by side with chunks
of 128 that the sequence reaches and passes), and the whole model as its measured layer
kinds;
Maverick's dense and MoE layers (RoPE layers without the L2 norm) against
validation/data/llama-4-maverick.json."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.activations.hf.family import FAMILIES
from llmpar.footprint.parameters import count_parameters

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "llama-4-scout.json")
RUNS = runs_by_key(DATA)
MAVERICK = M.load(ROOT / "validation" / "data" / "llama-4-maverick.json")
MAVERICK_RUNS = runs_by_key(MAVERICK)
HEADS, KV_HEADS, HEAD_DIM = 40, 8, 128


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA, run)


@pytest.mark.parametrize("key", sorted(MAVERICK_RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_maverick_layer_kind_is_exact(key):
    run = MAVERICK_RUNS[key]
    assert_exact(MAVERICK, run)


def test_maverick_moe_layers_keep_scouts_without_the_l2_norm():
    # the same widths (4 experts of 1024, 16384 tokens), RoPE layers both: Maverick's
    # keeps neither the fp32 q and k copies nor their rsqrt
    for attention in ("eager", "sdpa"):
        for b, s in ((1, 128), (2, 512)):
            scout = RUNS["rope_layers", attention, b, s]
            maverick = MAVERICK_RUNS["moe_layers", attention, b, s]
            norms = 4 * b * s * (HEADS + KV_HEADS) * (HEAD_DIM + 1)
            assert scout.per_layer_bytes - maverick.per_layer_bytes == norms
            assert scout.fixed_bytes == maverick.fixed_bytes


def test_both_layer_kinds_and_both_attentions_are_measured():
    assert DATA["published_config_part"] == "text_config"
    assert DATA["model_class"] == "Llama4ForCausalLM"
    assert {(v, a) for v, a, _, _ in RUNS} == {
        (v, a) for v in ("rope_layers", "nope_layers", "chunked_and_nope_layers")
        for a in ("eager", "sdpa")}


@pytest.mark.parametrize(("b", "s"), [(1, 128), (1, 256), (2, 256)])
def test_sdpa_keeps_the_chunked_mask_in_the_rope_layers_only(b, s):
    # a RoPE (chunked) and a NoPE (global) layer side by side, 8 heads and 2 kv heads of 128,
    # chunks of 128 <= s: the chunked layer gets create_chunked_causal_mask's mask
    # (_ignore_causal_mask_sdpa refuses the skip once kv_length >= the chunk), keeps it
    # converted (b x s x s x 2 bytes) with K and V repeated to the 8 heads; the NoPE layer's
    # create_causal_mask returns None and SDPA runs is_causal with enable_gqa, keeping K and
    # V at their 2 heads
    run = RUNS["chunked_and_nope_layers", "sdpa", b, s]
    table = M.spec_table(DATA, run, 1, ROOT)  # one unit: two layers
    assert (table["model"]["sliding_window"], table["model"]["sliding_window_pattern"]) == (
        128, 2)
    [group] = hf_inventory(llmpar.load_spec(table), HfRun(attention="sdpa")).groups
    kept = {t.name: t.bytes for t in group.tensors}
    tokens = b * s
    assert group.count == 2
    assert kept["sliding-window mask (additive)"] == tokens * s * 2 / 2
    assert kept["key expanded by repeat_kv"] == tokens * 8 * HEAD_DIM * 2 / 2
    assert kept["key"] == tokens * 2 * HEAD_DIM * 2 / 2
    assert_exact(DATA, run)
    assert_exact(DATA, RUNS["chunked_and_nope_layers", "eager", b, s])


def test_rope_and_nope_layers_differ_by_the_l2_norm_and_the_temperature():
    # A RoPE layer keeps q and k in fp32 for the L2 norm and one fp32 rsqrt per head and
    # token; a NoPE layer keeps the fp32 temperature of each position instead
    for attention in ("eager", "sdpa"):
        for b, s in ((1, 128), (1, 256), (2, 512)):
            rope = RUNS["rope_layers", attention, b, s]
            nope = RUNS["nope_layers", attention, b, s]
            norms = 4 * b * s * (HEADS + KV_HEADS) * (HEAD_DIM + 1)
            assert rope.per_layer_bytes - nope.per_layer_bytes == norms - 4 * s
            # the complex frequencies (s x 64 complex64) are kept only where a layer rotates
            assert rope.fixed_bytes - nope.fixed_bytes == s * HEAD_DIM // 2 * 8


def spec(s: int = 256, b: int = 1, name: str = "llama-4-scout") -> llmpar.Spec:
    return llmpar.load_spec({"model": name, "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def test_every_expert_keeps_a_copy_of_every_token():
    # Llama4TextMoe repeats the input once per expert whatever the top-k: the experts'
    # tensors grow with the number of experts (16 -> 32): per copy its score, the repeated
    # and the scaled input (h each), the gate/up output (2 ffn_e), SiLU's output and the
    # gated product (ffn_e each) in bf16, and per router score 4 bytes of fp32 sigmoid
    base = spec()
    more = attrs.evolve(base, model=attrs.evolve(
        base.model, moe=attrs.evolve(base.model.moe, num_experts=32)))
    [one] = hf_inventory(base, HfRun(attention="eager")).groups
    [two] = hf_inventory(more, HfRun(attention="eager")).groups
    h, ffn, tokens = 5120, 8192, 256
    per_copy = 2 * (1 + 2 * h + 4 * ffn)
    assert two.layer_bytes - one.layer_bytes == 16 * tokens * per_copy + 16 * tokens * 4
    assert FAMILIES["Llama4ForCausalLM"].experts_every_copy


def test_the_whole_model_is_its_measured_layer_kinds_and_outside():
    # 36 RoPE (chunked) and 12 NoPE (global) layers at the measured widths: each layer kind
    # as measured, outside the layers as measured with RoPE layers
    for attention in ("eager", "sdpa"):
        for s, b in ((256, 1), (512, 2)):
            rope = RUNS["rope_layers", attention, b, s]
            nope = RUNS["nope_layers", attention, b, s]
            table = M.spec_table(DATA, rope, 1, ROOT)
            table["model"] = {**table["model"], "num_layers": 48}
            inventory = hf_inventory(llmpar.load_spec(table), HfRun(attention=attention))
            expected = rope.fixed_bytes + 36 * rope.per_layer_bytes + 12 * nope.per_layer_bytes
            assert inventory.total_bytes == pytest.approx(expected, rel=1e-12)


def test_maverick_interleaves_dense_rope_layers_with_moe_layers():
    # Maverick: experts on every second layer (odd indices), NoPE on every fourth (3, 7, ...):
    # its 24 dense layers all rotate; half of its 24 MoE layers are NoPE layers
    inventory = hf_inventory(spec(name="llama-4-maverick"), HfRun(attention="sdpa"))
    groups = {group.kind: group for group in inventory.groups}
    assert {kind: group.count for kind, group in groups.items()} == {"dense": 24, "moe": 24}
    temperature = [t for t in groups["moe"].tensors if "temperature" in t.name]
    assert [t.bytes for t in temperature] == [0.5 * 256 * 4]
    assert not [t for t in groups["dense"].tensors if "temperature" in t.name]
    # Maverick's config turns the L2 q/k norm off (use_qk_norm false); Scout's keeps it
    assert not any("L2 norm" in t.name for g in inventory.groups for t in g.tensors)
    scout = hf_inventory(spec(), HfRun(attention="sdpa"))
    [norm] = [t for t in scout.groups[0].tensors if t.name == "key L2 norm rsqrt (fp32)"]
    assert norm.bytes == 0.75 * 256 * KV_HEADS * 4  # 36 of its 48 layers rotate


def test_the_parameters_are_the_measured_full_size_ones():
    # the measurement built Llama4ForCausalLM from text_config on the meta device at full
    # size (48 layers, 16 experts of 8192 and a shared one, dense-free, untied vocabulary)
    model = spec().model
    assert model.qk_l2_norm and not spec(name="llama-4-maverick").model.qk_l2_norm
    assert count_parameters(model).total == DATA["parameters_full_config"]["total_params"]
    assert DATA["parameters_full_config"]["total_params"] == 107_769_861_120
    maverick = spec(name="llama-4-maverick").model
    assert count_parameters(maverick).total == MAVERICK["parameters_full_config"]["total_params"]
    assert MAVERICK["parameters_full_config"]["total_params"] == 400_711_848_960
