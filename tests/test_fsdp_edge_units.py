"""FSDP's units outside the transformer blocks: the embeddings and the output layer
(`Framework.fsdp_edge_units`) and the two blocks the data strategy's buffers hold.

Hand-checks on Llama-3-8B (32 layers, hidden 4096, vocabulary 128,256, untied; the
shipped example specs/examples/llama-3-8b-fsdp-8-h100.toml: FSDP over 8 H100, bf16):
the embeddings and the output layer hold 128,256 x 4,096 = 525,336,576 parameters each,
so a block holds (8,030,261,248 - 2 x 525,336,576) / 32 = 218,112,128.
"""

from __future__ import annotations

import pytest

import llmpar

FSDP = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
VOCAB_X_HIDDEN = 128_256 * 4_096
BLOCK = (8_030_261_248 - 2 * VOCAB_X_HIDDEN) // 32
BF16 = 2
EDGE_NAMES = ("gathered output layer (FSDP unit)",
              "gathered embeddings and output layer (FSDP root unit)")


def _moments(units: str | None, **overrides: object) -> dict[str, int]:
    profile: object = "torchtitan" if units is None else {"preset": "torchtitan",
                                                           "fsdp_edge_units": units}
    timeline = llmpar.Session(load_entry_points=False).memory_timeline(
        FSDP, {"training.framework": profile, **overrides})
    return {m.moment: m.allocated_bytes for m in timeline}


def test_a_block_is_a_layer_without_the_embeddings_and_the_output_layer():
    """The buffers hold the running block's and the prefetched block's gathered weights:
    2 x 218,112,128 x 2 B, not the stage's mean over 32 layers with the embeddings and
    the output layer spread over them (2 x 250,945,664 x 2 B)."""
    assert 8_030_261_248 - 2 * VOCAB_X_HIDDEN == 32 * BLOCK  # no remainder
    plan = llmpar.evaluate(FSDP)
    assert plan.parameters == 8_030_261_248
    assert plan.buffers_bytes == 2 * BLOCK * BF16


def test_torchtitan_keeps_the_output_layer_gathered_from_its_forward_to_its_backward():
    """torchtitan's apply_fsdp: [norm, output] is a unit not resharded after forward.
    Its 525,336,576 x 2 B = 1,050,673,152 B stay gathered through the loss, when no block
    is (the buffers count two: the excess is 1,050,673,152 - 872,448,512 = 178,224,640 B),
    and in the output layer's backward beside the last block's prefetched gather
    (1,050,673,152 - 436,224,256 = 614,448,896 B); not in a layer's backward."""
    plan = llmpar.evaluate(FSDP, {"training.framework": "torchtitan"})
    peak = plan.training.memory_peak
    assert peak is not None and peak.moment == "loss backward"
    alive = {b.name: b.bytes for b in peak.alive}
    assert alive["gathered output layer (FSDP unit)"] == 178_224_640
    assert VOCAB_X_HIDDEN * BF16 - 2 * BLOCK * BF16 == 178_224_640
    with_edges, without = _moments(None), _moments("per-module")
    assert with_edges["loss forward"] - without["loss forward"] == 178_224_640
    assert with_edges["loss backward"] - without["loss backward"] == 178_224_640
    # per-module gathers the output layer for its backward too: both hold it then
    assert with_edges["output layer backward"] == without["output layer backward"]
    assert with_edges["layer backward"] == without["layer backward"]
    assert with_edges["start"] == without["start"]


def test_per_module_gathers_the_output_layer_for_its_backward_only():
    """DeepSpeed ZeRO-3 / Megatron-Core's torch FSDP2 wrapping: at the output layer's
    backward its weights and the last block's prefetched ones are gathered, 614,448,896
    B beyond the buffers' two blocks; at the loss's moments none of it."""
    plan = llmpar.evaluate(FSDP, {"training.framework": {
        "preset": "torchtitan", "fsdp_edge_units": "per-module"}})
    every = {b.name for b in plan.training.memory_peak.alive}
    assert not every & set(EDGE_NAMES)
    edge = (VOCAB_X_HIDDEN - BLOCK) * BF16
    assert edge == 614_448_896
    from llmpar.evaluation.evaluate import evaluate_core, transforms_of
    from llmpar.evaluation.peak import edge_unit_blocks
    from llmpar.footprint.baseline import baseline_footprint

    session = llmpar.Session(load_entry_points=False)
    spec, layout = session._checked(FSDP, {"training.framework": {
        "preset": "torchtitan", "fsdp_edge_units": "per-module"}})
    footprint = baseline_footprint(spec)
    core = evaluate_core(spec, footprint, layout,
                         transforms_of(spec, footprint, layout, session.strategies))
    blocks = edge_unit_blocks(spec, core.composition, core.parameters[0],
                              core.facts.peak_parts[0], False)
    assert {m: int(b.size) for m, b in blocks.items()} == {"output layer backward": edge}


def test_the_root_unit_holds_the_embeddings_and_the_output_layer_through_the_step():
    """fully_shard on each block and on the model: the root (embeddings, final norm,
    output layer: 2 x 525,336,576 x 2 B = 2,101,346,304 B) is never resharded after
    forward, so a layer's backward holds it beside its two blocks, and the loss holds
    it alone (2,101,346,304 - 872,448,512 = 1,228,897,792 B beyond the buffers)."""
    root, separate = _moments("root"), _moments("per-module")
    assert root["layer backward"] - separate["layer backward"] == 2 * VOCAB_X_HIDDEN * BF16
    assert root["loss forward"] - separate["loss forward"] == 1_228_897_792
    assert root["optimizer step"] == separate["optimizer step"]
    plan = llmpar.evaluate(FSDP, {"training.framework": "pytorch-fsdp2"})
    names = {b.name for b in plan.training.memory_peak.alive}
    assert "gathered embeddings and output layer (FSDP root unit)" in names


def test_no_gathered_edges_without_a_data_shard_of_the_weights():
    """ZeRO-1 keeps every weight whole on each GPU: nothing is gathered."""
    plan = llmpar.evaluate(FSDP, {"training.framework": "pytorch-fsdp2",
                                  "parallel.data.fsdp": False, "parallel.data.zero": 1})
    assert not {b.name for b in plan.training.memory_peak.alive} & set(EDGE_NAMES)
    assert plan.buffers_bytes == 0


def test_tied_embeddings_under_torchtitan_are_one_unit_kept_through_the_step():
    """torchtitan groups tied embeddings, norm and output in one unit not resharded
    after forward (torchtitan/distributed/fsdp.py): it is alive at the layers'
    backward too, as the root unit is."""
    overrides = {"model": "llama-3.2-1b"}
    separate = _moments(None, **overrides)
    per_module = _moments("per-module", **overrides)
    spec = llmpar.Session(load_entry_points=False).load_spec(FSDP, overrides=overrides)
    vocab_x_hidden = spec.model.vocab_size * spec.model.hidden_size
    assert separate["layer backward"] - per_module["layer backward"] == pytest.approx(
        vocab_x_hidden * BF16, abs=512)


def test_an_unknown_wrapping_names_its_key():
    from llmpar.errors import SpecError

    with pytest.raises(SpecError) as error:
        llmpar.evaluate(FSDP, {"training.framework": {"preset": "torchtitan",
                                                      "fsdp_edge_units": "blocks"}})
    assert "fsdp_edge_units" in str(error.value)
    assert "per-module" in str(error.value)


def test_weights_kept_gathered_are_not_counted_twice():
    """reshard_after_forward = false holds the stage's whole weights (the embeddings and
    the output layer with them) among the buffers: no edge unit beside them."""
    plan = llmpar.evaluate(FSDP, {"training.framework": "pytorch-fsdp2",
                                  "parallel.data.reshard_after_forward": False})
    assert not {b.name for b in plan.training.memory_peak.alive} & set(EDGE_NAMES)
    # the held weights: the whole unsharded stage in FSDP2's gather buffers, beside the
    # 1/8 shard the states count, the running and prefetched blocks among them
    assert plan.buffers_bytes == 8_030_261_248 * BF16
