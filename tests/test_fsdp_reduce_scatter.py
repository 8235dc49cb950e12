"""FSDP2's gradient reduce-scatters of the units outside the transformer blocks
(`Framework.reduce_scatter_copy_in`, `llmpar.evaluation.peak.reduce_scatter_blocks`).

FSDP2's post-backward of a unit (foreach_reduce, torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py, PyTorch 2.13) reshards the unit, copies its gradients into a
reduce-scatter input of the whole unit in reduce_dtype and reduce-scatters it into a new
shard; the gradient autograd has just made is still held. Measured on the CPU with
validation/measure_peak_fsdp.py (docs/validation-memory.md: the 1 x 64 token rows peak
there, within 0.04%).

Hand-checks on Llama-3-8B (specs/examples/llama-3-8b-fsdp-8-h100.toml: FSDP over 8 H100,
bf16 weights and gradients, 8 micro-batches per step): the embeddings and the output layer
hold 128,256 x 4,096 = 525,336,576 parameters each, a block (8,030,261,248 - 2 x
525,336,576) / 32 = 218,112,128.
"""

from __future__ import annotations

from typing import Any

import llmpar
from llmpar.evaluation.evaluate import evaluate_core, transforms_of
from llmpar.evaluation.peak import reduce_scatter_blocks, workspace_blocks
from llmpar.footprint.baseline import baseline_footprint

FSDP = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
VOCAB_X_HIDDEN = 128_256 * 4_096
BLOCK = (8_030_261_248 - 2 * VOCAB_X_HIDDEN) // 32
BF16 = 2
SESSION = llmpar.Session(load_entry_points=False)


def _blocks(overrides: dict[str, Any], freed: bool = False) -> dict[str, dict[str, int]]:
    spec, layout = SESSION._checked(FSDP, overrides)
    footprint = baseline_footprint(spec)
    core = evaluate_core(spec, footprint, layout,
                         transforms_of(spec, footprint, layout, SESSION.strategies))
    found = reduce_scatter_blocks(spec, core.composition, core.parameters[0],
                                  core.facts.peak_parts[0], False, freed)
    return {moment: {b.name: int(b.size) for b in blocks} for moment, blocks in found.items()}


def _moments(overrides: dict[str, Any]) -> dict[str, int]:
    return {m.moment: m.allocated_bytes for m in SESSION.memory_timeline(FSDP, overrides)}


def test_torchtitan_reduces_its_output_layer_and_its_embeddings_units():
    """torchtitan's [norm, output] unit, after the output layer's backward beside the last
    block's prefetched gather: its input 525,336,576 x 2 B less the one block the buffers
    count beyond it (1,050,673,152 - 436,224,256 = 614,448,896 B), the output layer's
    gradient (1,050,673,152 B) and the new shard (1/8: 131,334,144 B). The embeddings'
    unit at the end of the backward, every block resharded: the input less both blocks
    (178,224,640 B), its gradient, and a new shard beside the gradients the earlier
    micro-batches made."""
    found = _blocks({"training.framework": "torchtitan"})
    whole, shard = VOCAB_X_HIDDEN * BF16, VOCAB_X_HIDDEN * BF16 // 8
    assert found == {
        "output layer reduce-scatter": {
            "reduce-scatter input (whole unit, reduce format)": whole - BLOCK * BF16,
            "unit's unsharded gradient (its largest weight)": whole,
            "reduce-scatter output (new gradient shard)": shard},
        "embeddings reduce-scatter": {
            "reduce-scatter input (whole unit, reduce format)": whole - 2 * BLOCK * BF16,
            "unit's unsharded gradient (its largest weight)": whole,
            "reduce-scatter output (new gradient shard)": shard}}
    assert whole - BLOCK * BF16 == 614_448_896 and shard == 131_334_144


def test_the_root_unit_reduces_the_embeddings_and_the_output_layer_together():
    """fully_shard on the model: one unit of both (2 x 525,336,576 parameters), reduced
    at the end of the backward; the gradient held is one of them. With one micro-batch
    (zero_grad frees the gradients) the new shard is the only gradient of the unit: the
    gradients' state counts it."""
    found = _blocks({"training.framework": "pytorch-fsdp2"})
    assert list(found) == ["embeddings reduce-scatter"]
    unit = found["embeddings reduce-scatter"]
    assert unit["reduce-scatter input (whole unit, reduce format)"] == (
        2 * VOCAB_X_HIDDEN * BF16 - 2 * BLOCK * BF16)
    assert unit["unit's unsharded gradient (its largest weight)"] == VOCAB_X_HIDDEN * BF16
    freed = _blocks({"training.framework": "pytorch-fsdp2"}, freed=True)
    assert freed["embeddings reduce-scatter"]["reduce-scatter output (new gradient shard)"] == 0


def test_fp32_reduce_dtype_doubles_the_input():
    """MixedPrecisionPolicy(reduce_dtype=float32): the input is the unit's parameters in
    fp32 (4 B each), the held gradient stays in the compute format."""
    found = _blocks({"training.framework": "pytorch-fsdp2",
                     "parallel.data.reduce_dtype": "fp32"})["embeddings reduce-scatter"]
    assert found["reduce-scatter input (whole unit, reduce format)"] == (
        2 * VOCAB_X_HIDDEN * 4 - 2 * BLOCK * BF16)
    assert found["reduce-scatter output (new gradient shard)"] == 2 * VOCAB_X_HIDDEN * 4 // 8


def test_only_fsdp2_profiles_and_sharded_weights_count_it():
    """A profile without reduce_scatter_copy_in (hf-trainer: FSDP1's flat parameter),
    per-module wrapping (DeepSpeed, Megatron-Core), ZeRO-1 (no weight shard) and weights
    kept gathered have no such moment."""
    assert _blocks({"training.framework": "hf-trainer"}) == {}
    assert _blocks({"training.framework": {"preset": "torchtitan",
                                           "fsdp_edge_units": "per-module"}}) == {}
    assert _blocks({"training.framework": "torchtitan", "parallel.data.fsdp": False,
                    "parallel.data.zero": 1}) == {}
    assert _blocks({"training.framework": "torchtitan",
                    "parallel.data.reshard_after_forward": False}) == {}
    moments = _moments({"training.framework": "hf-trainer"})
    assert "embeddings reduce-scatter" not in moments


def test_the_moments_are_the_steady_state_plus_what_the_reduce_scatter_holds():
    """The embeddings' moment: the states and buffers (no activations: the step's one
    micro-batch in flight has finished its backward) plus its three blocks; the output
    layer's: the output layer's backward moment less that backward's transients, plus
    its three blocks."""
    overrides = {"training.framework": "torchtitan"}
    moments = _moments(overrides)
    plan = SESSION.evaluate(FSDP, overrides)
    stage = plan.stages[0]
    # the states, buffers and the cuBLAS workspace PyTorch keeps from its first GEMM on
    workspaces = sum(int(b.size) for b in workspace_blocks(SESSION.load_spec(FSDP, overrides)))
    steady = stage.total_bytes - (stage.activations_bytes or 0) + workspaces
    found = _blocks(overrides)
    assert moments["embeddings reduce-scatter"] == steady + sum(
        found["embeddings reduce-scatter"].values())
    assert moments["output layer reduce-scatter"] > moments["embeddings reduce-scatter"]
    assert list(moments).index("output layer reduce-scatter") == list(moments).index(
        "output layer backward") + 1
