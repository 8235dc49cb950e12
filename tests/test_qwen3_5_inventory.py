"""Qwen3.5's language models as transformers 5.24 runs them on the CPU
(Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM, the text_config of their multimodal
configs: Qwen3-Next's gated DeltaNet and gated attention layers, then a dense MLP (27B)
or the experts beside the gated shared expert (35B-A3B), and an interleaved multimodal
RoPE): hf-eager and hf-sdpa against the bytes measured per tensor in
validation/data/qwen3.5-27b.json and qwen3.5-35b-a3b.json (torch 2.13.0, b 1-2, s 128-512,
1 and 2 layers of each kind), and the whole models as their measured layer kinds."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventories import assert_exact

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parents[1]
DATA = {name: M.load(ROOT / "validation" / "data" / f"{name}.json")
        for name in ("qwen3.5-27b", "qwen3.5-35b-a3b")}
RUNS = {(name, run.variant, run.attention, run.batch, run.sequence): run
        for name, data in DATA.items() for run in M.measured_runs(data)}
HEAD_DIM, ROTATED = 256, 64
"""RoPE's width in transformers: partial_rotary_factor 0.25 of head_dim 256."""


def spec(model: str, s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": model, "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def test_both_models_both_layer_kinds_and_every_shape_were_measured():
    assert len(RUNS) == 2 * 2 * 2 * 6


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_qwen3_5_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA[key[0]], run)


def test_rope_is_kept_per_sample():
    # measured: the attention layers' outside bytes grow by 2 x 64 x 2 bytes per token of
    # every sample (cos and sin of b x s x 64), more than the b = 1 ones
    for name in DATA:
        one = RUNS[name, "attention_layers", "sdpa", 1, 256].fixed_bytes
        two = RUNS[name, "attention_layers", "sdpa", 2, 256].fixed_bytes
        alone_one = RUNS[name, "linear_attention_layers", "sdpa", 1, 256].fixed_bytes
        alone_two = RUNS[name, "linear_attention_layers", "sdpa", 2, 256].fixed_bytes
        assert (two - alone_two) - (one - alone_one) == 2 * 256 * ROTATED * 2
    inventory = hf_inventory(spec("qwen3.5-27b", b=2), HfRun(attention="sdpa"))
    rope = [t for t in inventory.fixed if t.name.startswith("RoPE")]
    # rope_parameters' partial_rotary_factor 0.25 of head_dim 256
    assert spec("qwen3.5-27b").model.rotary_dim == ROTATED
    assert [t.bytes for t in rope] == [2 * 256 * ROTATED * 2] * 2


@pytest.mark.parametrize(("name", "layers", "experts"),
                         [("qwen3.5-27b", 64, None), ("qwen3.5-35b-a3b", 40, 256)])
def test_the_whole_qwen3_5_model_is_its_measured_layer_kinds_and_outside(name, layers,
                                                                        experts):
    # three gated DeltaNets to one gated attention, at b 1, s 256; the MoE model's 256
    # experts (the measured 32 change only the router's fp32 probabilities per token and
    # grouped_mm's int32 offsets, 4 x (256 + 1) bytes per expert); outside the layers as
    # measured with DeltaNets alone, plus RoPE's cos and sin of the attention layers
    # (s x 64 bf16 each)
    block = "moe" if experts else "dense"
    for attention in ("eager", "sdpa"):
        inventory = hf_inventory(spec(name), HfRun(attention=attention))
        counts = {group.kind: group.count for group in inventory.groups}
        assert counts == {f"{block} linear_attention": layers * 3 // 4,
                          f"{block} attention": layers // 4}
        extra = 4 * (256 + 1) * (experts - 32) if experts else 0
        per_layer = {kind: RUNS[name, variant, attention, 1, 256].per_layer_bytes + extra
                     for kind, variant in ((f"{block} linear_attention",
                                            "linear_attention_layers"),
                                           (f"{block} attention", "attention_layers"))}
        fixed = RUNS[name, "linear_attention_layers", attention, 1, 256].fixed_bytes
        assert inventory.total_bytes == (fixed + 2 * 256 * ROTATED * 2
                                         + sum(counts[k] * per_layer[k] for k in counts))
