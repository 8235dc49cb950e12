"""DeepSeek-V3.2-Exp's layers as transformers 5.24 runs them on the CPU
(DeepseekV32ForCausalLM: DeepSeek-V3's MLA with the lightning indexer, whose top-k indices
are scattered into the attention mask, then the experts beside the shared expert, or a
dense MLP in the first three layers): hf-eager and hf-sdpa against the bytes measured per
tensor in validation/data/deepseek-v3.2-exp.json (torch 2.13.0, b 1-2, s 128-512, 1 and 2
layers of each kind, at small widths: hidden 256, 4 heads, 16 experts, 16384 tokens), the
indexer by hand, the whole model as its measured layer kinds, and FlopCounterMode's
FLOPs, forward and backward."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M
from llmpar.footprint.flops import forward_flops_per_sequence
from llmpar.hf import model_table_from_hf

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "deepseek-v3.2-exp.json")
RUNS = runs_by_key(DATA)
V3_SOURCE = "counted as transformers' DeepseekV3ForCausalLM"


def spec_at_measured_widths(variant: str, layers: int, s: int = 256, b: int = 1,
                            **changes: object) -> llmpar.Spec:
    """The measured variant's model (its small widths) with `layers` layers and the
    config.json keys `changes` changed."""
    config = {**M.config_used(DATA, variant, 1, ROOT), "num_hidden_layers": layers, **changes}
    config.setdefault("_source", DATA["source_repo"])
    return llmpar.load_spec({"model": model_table_from_hf(config),
                             "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def measured_rows(variant: str, attention: str) -> list[dict]:
    """Every tensor saved in the 2-layer run at b 1, s 256."""
    found = next(v for v in DATA["variants"] if v["variant"] == variant)
    listing = next(i for i in found["inventory"]
                   if i["num_layers"] == 2 and i["attn_implementation"] == attention)
    return [dict(zip(DATA["inventory_fields"], row, strict=True)) for row in listing["tensors"]]


def test_every_layer_kind_and_shape_was_measured():
    assert DATA["model_class"] == "DeepseekV32ForCausalLM"
    assert DATA["versions"]["torch"].startswith("2.13.0")
    assert DATA["versions"]["transformers"] == "5.24.0"
    variants = {key[:2] for key in RUNS}
    assert variants == {(v, a) for v in ("moe_layers", "dense_layers", "moe_layers_top_64")
                        for a in ("eager", "sdpa")} | {("moe_layers_equal_head_widths",
                                                        "sdpa")}
    assert len(RUNS) == 2 * 2 * 6 + 2 * 2 + 6
    assert not [error for v in DATA["variants"] for error in v["errors"]]


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_kind_is_exact(key):
    assert_exact(DATA, RUNS[key])


def test_the_indexer_keeps_nothing_and_the_selection_changes_no_byte():
    # DeepseekV32Indexer.forward runs under torch.no_grad (modeling_deepseek_v32.py): no
    # tensor is saved inside it, in eager or SDPA runs; selecting 64 keys instead of every
    # earlier one (index_topk 2048 > s) keeps the same bytes, the mask being kept by
    # neither eager attention's addition nor SDPA's math path
    for attention in ("eager", "sdpa"):
        rows = measured_rows("moe_layers", attention)
        assert rows and not [r for r in rows if ".indexer" in r["module"]]
        for b, s in ((1, 256), (2, 512)):
            top_64 = RUNS["moe_layers_top_64", attention, b, s]
            every = RUNS["moe_layers", attention, b, s]
            assert top_64.total_bytes == every.total_bytes


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_sparse_attention_layers_keep_deepseek_v3s_tensors(attention):
    # at DeepSeek's head widths (192 for the query, 128 for the value) SDPA takes its math
    # path, so V3.2's layer keeps exactly V3's MLA tensors, tensor by tensor
    given = llmpar.load_spec({"model": "deepseek-v3.2-exp", "hardware": {"gpu": "h100-sxm"},
                              "training": {"sequence_length": 4096}})
    v3 = attrs.evolve(given, model=attrs.evolve(given.model, sparse_attention=None,
                                                source=V3_SOURCE))
    run = HfRun(attention=attention)
    ours, theirs = hf_inventory(given, run), hf_inventory(v3, run)
    assert [g.tensors for g in ours.groups] == [g.tensors for g in theirs.groups]
    assert ours.total_bytes == theirs.total_bytes


def test_the_fused_kernel_keeps_the_mask_the_model_always_passes():
    # at equal query and value head widths (32) SDPA's fused CPU kernel runs with the
    # boolean mask DeepseekV32Model always builds (allow_is_causal_skip=False) and the
    # indexer's selection: it keeps the mask converted to an additive bf16 one, 1 x 1 x s
    # x s, the whole kv_b_proj output behind the value view (4 x (16 + 32) per token) and
    # a transposed copy of its output for o_proj
    rows = [r for r in measured_rows("moe_layers_equal_head_widths", "sdpa")
            if r["module"] == "model.layers.1.self_attn" and r["first_save_of_storage"]
            and r["kind"] == "activation"]
    kernel = [r for r in rows
              if r["saved_by_autograd_nodes"] == "ScaledDotProductFlashAttentionForCpuBackward0"]
    assert [1, 1, 256, 256] in [r["shape"] for r in kernel]
    assert 256 * 4 * (16 + 32) * 2 in [r["storage_bytes"] for r in kernel]
    [group] = hf_inventory(spec_at_measured_widths("moe_layers_equal_head_widths", 2),
                           HfRun(attention="sdpa")).groups
    found = {t.name: t.bytes for t in group.tensors}
    assert found["sparse attention mask (additive)"] == 256 * 256 * 2
    assert found["kv_b_proj output"] == 256 * 4 * (16 + 32) * 2
    assert "output projection input" in found


def test_the_whole_model_is_its_measured_layer_kinds_and_outside():
    # 61 layers, the first 3 dense (first_k_dense_replace), at the measured widths: the
    # layers as measured one kind at a time, outside them as measured
    for attention in ("eager", "sdpa"):
        for b, s in ((1, 256), (2, 512)):
            whole = spec_at_measured_widths("moe_layers", 61, s, b, first_k_dense_replace=3)
            inventory = hf_inventory(whole, HfRun(attention=attention))
            counts = {group.kind: group.count for group in inventory.groups}
            assert counts == {"dense": 3, "moe": 58}
            moe = RUNS["moe_layers", attention, b, s]
            dense = RUNS["dense_layers", attention, b, s]
            assert moe.fixed_bytes == dense.fixed_bytes
            assert inventory.total_bytes == (moe.fixed_bytes + 3 * dense.per_layer_bytes
                                             + 58 * moe.per_layer_bytes)
    published = hf_inventory(llmpar.load_spec({"model": "deepseek-v3.2-exp",
                                               "hardware": {"gpu": "h100-sxm"}}),
                             HfRun(attention="sdpa"))
    assert {group.kind: group.count for group in published.groups} == {"dense": 3, "moe": 58}


def flop_runs() -> list[tuple[str, dict]]:
    return [(variant["variant"], run) for variant in DATA["variants"]
            for run in variant["flop_runs"]]


@pytest.mark.parametrize(("variant", "run"), flop_runs(),
                         ids=lambda x: x if isinstance(x, str) else
                         f"{x['attn_implementation']}-L{x['num_layers']}-s{x['seq']}")
def test_flops_equal_flop_counter_forward_and_backward(variant, run):
    # forward: llmpar's count (projections with the indexer's, MLA's products over every
    # kept key, s <= top_k, and the indexer's scores over every pair) equals
    # FlopCounterMode's plus the grouped expert matmuls it does not count, exactly;
    # backward: llmpar's training step is 3x the forward, transformers' has no backward of
    # the indexer (torch.no_grad), so the measured step is 3x the forward less 2x the
    # indexer's forward (llmpar's own count: the model less the model without it)
    s, layers = run["seq"], run["num_layers"]
    model = llmpar.model_from_hf(M.config_used(DATA, variant, layers, ROOT))
    forward = forward_flops_per_sequence(model, s).total * run["batch"]
    uncounted = run["forward_ops"]["uncounted_kernel_flops_computed_here"]
    assert forward == run["forward_flops"] + uncounted
    dense = forward_flops_per_sequence(attrs.evolve(model, sparse_attention=None), s).total
    indexer = forward - dense * run["batch"]
    assert indexer > 0
    assert 3 * forward - 2 * indexer == run["forward_backward_flops"] + 3 * uncounted
