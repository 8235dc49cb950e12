"""A cross-entropy run one chunk of tokens at a time (`cross_entropy_chunks`): torchtune's
CEWithChunkedOutputLoss (torchtune/modules/loss/ce_chunked_output_loss.py, commit
0031bfb0) upcasts each chunk of Tensor.chunk(n, dim=1) to fp32 in turn, so the upcast and
the backward's fp32 gradients are one chunk's; log_softmax keeps every chunk's output
until that chunk's backward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmpar
from llmpar.errors import SpecError
from llmpar.evaluation.transients import _loss_parts

EXAMPLE = "specs/examples/llama-3-8b-128k-torchtitan.toml"
PLAIN = "specs/examples/llama-3-8b-fsdp-8-h100.toml"
VOCAB = 128256


def _parts(chunks: int, sequence: int) -> dict[str, float]:
    """The loss's parts of a micro-batch of one sequence."""
    spec = llmpar.Session()._checked(PLAIN, {
        "training.framework": {"preset": "torchtitan", "cross_entropy_chunks": chunks},
        "training.sequence_length": sequence, "training.micro_batch_size": 1})[0]
    forward, backward = _loss_parts(spec)
    return {p.name: sum(p.tags.values()) for p in forward + backward}


def test_one_chunk_is_the_whole_loss():
    whole = _parts(1, 4096)
    tokens = 4096
    assert whole["logits.float()"] == tokens * VOCAB * 4
    assert whole["gradient of the log-probabilities (fp32)"] == tokens * VOCAB * 4


@pytest.mark.parametrize(("sequence", "chunk_tokens"), [(4096, 512), (4097, 513), (7, 1)])
def test_the_fp32_upcast_and_gradients_are_one_chunk_s(sequence, chunk_tokens):
    """Tensor.chunk(8, dim=1) makes chunks of ceil(s / 8) tokens (the last one shorter);
    the largest is alive at a time. s = 7 gives 7 chunks of one token."""
    parts = _parts(8, sequence)
    one = chunk_tokens * VOCAB * 4
    assert parts["one chunk's logits.float()"] == pytest.approx(one)
    assert parts["one chunk's gradient of the log-probabilities (fp32)"] == pytest.approx(one)
    assert parts["one chunk's gradient of logits.float() (fp32)"] == pytest.approx(one)
    # every chunk's log-probabilities stay until its own backward
    assert parts["log-probabilities (fp32, kept)"] == sequence * VOCAB * 4
    assert parts["logits"] == sequence * VOCAB * 2


def test_chunks_lower_the_loss_peak_and_nothing_else():
    overrides = {"training.sequence_length": 32768}
    whole = llmpar.evaluate(EXAMPLE, {**overrides, "training.framework": "torchtitan"})
    chunked = llmpar.evaluate(EXAMPLE, {**overrides, "training.framework": {
        "preset": "torchtitan", "cross_entropy_chunks": 8}})
    assert chunked.total_bytes == whole.total_bytes
    assert chunked.training.step_seconds == whole.training.step_seconds
    assert chunked.training.memory_peak.allocated_bytes < whole.training.memory_peak.allocated_bytes
    more = llmpar.evaluate(EXAMPLE, {**overrides, "training.framework": {
        "preset": "torchtitan", "cross_entropy_chunks": 16}})
    assert more.training.memory_peak.allocated_bytes <= chunked.training.memory_peak.allocated_bytes


def test_a_fused_cross_entropy_ignores_chunks():
    fused = {"preset": "torchtitan", "fused_cross_entropy": True}
    one = llmpar.evaluate(EXAMPLE, {"training.framework": fused})
    eight = llmpar.evaluate(EXAMPLE, {"training.framework": {**fused,
                                                              "cross_entropy_chunks": 8}})
    assert (one.training.memory_peak.allocated_bytes
            == eight.training.memory_peak.allocated_bytes)


@pytest.mark.parametrize("bad", [0, -2])
def test_chunks_must_be_positive(bad):
    with pytest.raises(SpecError) as caught:
        llmpar.evaluate(EXAMPLE, {"training.framework": {"preset": "torchtitan",
                                                         "cross_entropy_chunks": bad}})
    assert "cross_entropy_chunks" in str(caught.value)


MEASURED = Path(__file__).resolve().parent.parent / "validation" / "data" / "compiled_loss.json"


def _compiled_parts(chunks: int) -> dict[str, float]:
    spec = llmpar.Session()._checked(PLAIN, {
        "training.framework": {"preset": "torchtitan", "cross_entropy_chunks": chunks,
                               "compiled_cross_entropy": True},
        "training.sequence_length": 4096, "training.micro_batch_size": 1})[0]
    forward, backward = _loss_parts(spec)
    return ({p.name: sum(p.tags.values()) for p in forward},
            {p.name: sum(p.tags.values()) for p in backward})


def test_the_compiled_loss_keeps_what_inductor_saves():
    """validation/data/compiled_loss.json (torch 2.13.0 inductor, CPU): the compiled
    F.cross_entropy(logits.float(), ...) saves the logits' own storage, the labels and two
    fp32 per-token statistics, and allocates only per-token buffers and, in its backward,
    the logits' gradient in their dtype. llmpar's parts: the same, for 4096 tokens."""
    data = json.loads(MEASURED.read_text())
    tokens, vocab = data["tokens"], data["vocab"]
    wide = [t for t in data["compiled_saved"] if t["shape"] == [tokens, vocab]]
    assert wide == [{"shape": [tokens, vocab], "dtype": "bfloat16", "is_the_logits": True}]
    statistics = [t for t in data["compiled_saved"] if t["shape"] == [tokens, 1]]
    assert [t["dtype"] for t in statistics] == ["float32", "float32"]
    assert all(a["shape"] != [tokens, vocab] for a in data["compiled_forward_allocations"])
    assert [a["dtype"] for a in data["compiled_backward_allocations"]
            if a["shape"] == [tokens, vocab]] == ["bfloat16"]
    # eager keeps the fp32 log-probabilities (log_softmax's result, also nll_loss's input)
    assert {t["dtype"] for t in data["eager_saved"] if t["shape"] == [tokens, vocab]} == {
        "float32"}

    forward, backward = _compiled_parts(8)
    assert forward["logits (kept by the compiled loss)"] == 4096 * VOCAB * 2
    assert forward["max and log-sum-exp per token (fp32, kept)"] == pytest.approx(4096 * 2 * 4)
    assert backward["one chunk's gradient of the logits"] == pytest.approx(512 * VOCAB * 2)
    assert not any("fp32" in name and size >= 4096 * VOCAB for name, size in
                   {**forward, **backward}.items())
    whole = _compiled_parts(1)[1]
    assert whole["one chunk's gradient of the logits"] == pytest.approx(4096 * VOCAB * 2)


def test_the_compiled_loss_peak_is_below_the_eager_one():
    overrides = {"training.sequence_length": 32768}
    eager = llmpar.evaluate(EXAMPLE, {**overrides, "training.framework": {
        "preset": "torchtitan", "cross_entropy_chunks": 8}})
    compiled = llmpar.evaluate(EXAMPLE, {**overrides, "training.framework": {
        "preset": "torchtitan", "cross_entropy_chunks": 8, "compiled_cross_entropy": True}})
    assert compiled.total_bytes == eager.total_bytes
    assert (compiled.training.memory_peak.allocated_bytes
            < eager.training.memory_peak.allocated_bytes)
