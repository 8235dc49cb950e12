"""gpt-oss's two layer kinds as transformers 5.24 runs them on the CPU (eager attention
with learned sinks over a sliding window or the whole sequence; 32 experts of the
clamped SwiGLU with biases behind a top-4 router with a bias): hf-eager against the
bytes measured per tensor in validation/data/gpt-oss-20b.json (torch 2.13.0, b 1-2,
s 128-512, 1 and 2 layers of each kind), the sinks' and the experts' tensors by hand,
SDPA refused as transformers refuses it, and the whole model as its measured layers."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.common import ActivationUnavailable
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "gpt-oss-20b.json")
RUNS = runs_by_key(DATA)


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA, run)


def test_both_layer_kinds_are_measured_eager_only():
    # GptOssPreTrainedModel._supports_sdpa = False: set_attn_implementation("sdpa") raises,
    # and the measurement records it for each layer count
    assert {key[1] for key in RUNS} == {"eager"}
    assert {key[0] for key in RUNS} == {"sliding_attention_layers", "full_attention_layers"}
    for variant in DATA["variants"]:
        refused = [e for e in variant["errors"] if e["stage"] == "set_attn_implementation"]
        assert len(refused) == 2 and all("GptOssForCausalLM does not support" in e["error"]
                                         for e in refused)


def spec(s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": "gpt-oss-20b", "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def measured_rows(module: str, variant: str = "full_attention_layers") -> list[dict]:
    """The storages first saved inside `module` and alive after the forward, eager, b 1,
    s 256, 2 layers."""
    found = next(v for v in DATA["variants"] if v["variant"] == variant)
    listing = next(i for i in found["inventory"] if i["num_layers"] == 2)
    fields = DATA["inventory_fields"]
    rows = [dict(zip(fields, row, strict=True)) for row in listing["tensors"]]
    return [r for r in rows if r["module"].startswith(module) and r["first_save_of_storage"]
            and r["storage_live_after_forward"] and r["kind"] == "activation"]


def test_the_sinks_attention_by_hand():
    # eager_attention_forward of modeling_gpt_oss.py: q (RoPE's cat of the two rotated
    # halves) and k, v expanded from 8 to 64 heads of 64 (bf16); the row maximum of
    # cat(scores, sinks) keeps its int64 indices (b x 64 x s), the bf16 softmax keeps its
    # b x 64 x s x (s + 1) output, of which P.V keeps a view; o_proj's input
    b, s, a, d = 1, 256, 64, 64
    by_hand = 3 * 2 * b * s * a * d + 8 * b * a * s + 2 * b * a * s * (s + 1) + 2 * b * s * a * d
    rows = measured_rows("model.layers.1.self_attn")
    assert sum(r["storage_bytes"] for r in rows) == by_hand + 2 * b * s * 2880  # + its input
    assert sorted({r["dtype"] for r in rows}) == ["bfloat16", "int64"]
    [group] = hf_inventory(spec(s, b), HfRun(attention="eager")).groups
    attention = [t for t in group.tensors if t.name in (
        "attention input", "query", "key expanded by repeat_kv", "value expanded by repeat_kv",
        "row maximum indices (int64)", "softmax output with the sink column",
        "output projection input")]
    assert sum(t.bytes for t in attention) == by_hand + 2 * b * s * 2880


def test_the_clamped_experts_by_hand():
    # GptOssExperts on grouped_mm (integrations/moe.py), per token copy (b s k of them, k 4):
    # the dispatched input (2880), gate_up's output (2 x 2880, kept through the clamps'
    # strided views), the clamped gate, sigmoid(alpha gate), glu, up + 1 and their product
    # (2880 each), the expert output (2880), all bf16; its bf16 routing weight and four
    # int64 indices (the sorted expert ids the bias gathers keep, perm // k, perm, the
    # inverse); the 32 int32 offsets per layer. The router keeps its top-4 indices (int64)
    # and the bf16 softmax over them.
    b, s, k, h, ffn = 1, 256, 4, 2880, 2880
    copies = b * s * k
    experts = copies * (2 * (h + 2 * ffn + 5 * ffn + h) + 2 + 4 * 8) + 4 * 32
    router = b * s * k * (8 + 2)
    rows = measured_rows("model.layers.1.mlp")
    assert sum(r["storage_bytes"] for r in rows) == experts + router + 2 * b * s * h
    [group] = hf_inventory(spec(s, b), HfRun(attention="eager")).groups
    mlp = group.tensors[[t.name for t in group.tensors].index("moe input"):]
    assert sum(t.bytes for t in mlp) == experts + router + 2 * b * s * h


def test_sdpa_is_refused_as_transformers_refuses_it():
    with pytest.raises(ActivationUnavailable, match="_supports_sdpa = False"):
        hf_inventory(spec(), HfRun(attention="sdpa"))


def test_the_whole_model_is_its_measured_layer_kinds_and_outside():
    # 12 windowed and 12 full layers: eager attention adds the window's mask to the scores
    # (masking_utils builds it outside the layers and nothing keeps it), so both kinds keep
    # the same bytes; outside them the embedding, cos and sin of 32 frequencies each
    # (GptOssRotaryEmbedding repeats none), the final norm and the loss
    for s, b in ((256, 1), (512, 2)):
        windowed = RUNS["sliding_attention_layers", "eager", b, s]
        full = RUNS["full_attention_layers", "eager", b, s]
        assert windowed.per_layer_bytes == full.per_layer_bytes
        assert windowed.fixed_bytes == full.fixed_bytes
        inventory = hf_inventory(spec(s, b), HfRun(attention="eager"))
        assert inventory.total_bytes == full.fixed_bytes + 24 * full.per_layer_bytes


def test_the_unmeasured_eager_experts_loop_is_refused():
    # GptOssExperts.forward (its own loop over the hit experts, biases added per expert) is
    # not measured; the grouped_mm implementation, transformers' default, is
    with pytest.raises(ActivationUnavailable, match="eager experts loop"):
        hf_inventory(spec(), HfRun(attention="eager", experts="eager"))
