"""SmolLM3's two layer kinds as transformers 5.24 runs them on the CPU (SmolLM3Attention
with RoPE, or without it where no_rope_layers holds 0, every fourth layer of the
published model; eager and SDPA): hf-eager and hf-sdpa against the bytes measured per
tensor in validation/data/smollm3-3b.json (torch 2.13.0, b 1-2, s 128-512, 1 and 2
layers of each kind), and the whole model as its measured layer kinds."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventories import assert_exact, runs_by_key

import llmpar
from llmpar.footprint.activations.hf import HfRun, hf_inventory
from llmpar.footprint.activations.hf import measured as M

ROOT = Path(__file__).resolve().parents[1]
DATA = M.load(ROOT / "validation" / "data" / "smollm3-3b.json")
RUNS = runs_by_key(DATA)
HEAD_DIM = 128


def rope_residual(run: M.MeasuredRun) -> int:
    """A model of NoPE layers alone computes RoPE's cos and sin (bf16, s x 128 each) and
    never uses them, so nothing keeps them; llmpar's model has no NoPE layers (they change
    no parameter, FLOP, cache or per-layer byte) and counts them, as the published model,
    whose other layers rotate, keeps them."""
    if run.variant != "nope_layers":
        return 0
    return 2 * run.sequence * HEAD_DIM * 2


@pytest.mark.parametrize("key", sorted(RUNS), ids=lambda key: "-".join(map(str, key)))
def test_each_layer_kind_is_exact(key):
    run = RUNS[key]
    assert_exact(DATA, run, rope_residual(run))


def test_nope_layers_keep_what_rope_layers_keep():
    # Skipping RoPE leaves q and k views of their projections' outputs where RoPE makes new
    # tensors of the same size and layout: eager's Q.K^T and SDPA keep the same bytes
    for attention in ("eager", "sdpa"):
        for b, s in ((1, 128), (1, 256), (2, 512)):
            rope = RUNS["rope_layers", attention, b, s]
            nope = RUNS["nope_layers", attention, b, s]
            assert nope.per_layer_bytes == rope.per_layer_bytes
            assert rope.fixed_bytes - nope.fixed_bytes == 2 * s * HEAD_DIM * 2


def spec(s: int = 256, b: int = 1) -> llmpar.Spec:
    return llmpar.load_spec({"model": "smollm3-3b", "hardware": {"gpu": "h100-sxm"},
                             "precision": {"activations": "bf16", "weights": "bf16"},
                             "training": {"sequence_length": s, "micro_batch_size": b}})


def test_the_whole_model_is_its_measured_layer_kinds_and_outside():
    # 27 RoPE and 9 NoPE layers, each as measured; outside them as measured with RoPE
    # layers (the embedding, tied to the output layer, cos and sin, the final norm, the loss)
    for attention in ("eager", "sdpa"):
        for s, b in ((256, 1), (512, 2)):
            rope = RUNS["rope_layers", attention, b, s]
            nope = RUNS["nope_layers", attention, b, s]
            inventory = hf_inventory(spec(s, b), HfRun(attention=attention))
            assert inventory.total_bytes == (rope.fixed_bytes + 27 * rope.per_layer_bytes
                                             + 9 * nope.per_layer_bytes)
