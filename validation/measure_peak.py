#!/usr/bin/env python3
"""Measure the memory peak of one real training step on the CPU, for llmpar's
`training.memory_peak` (ground truth you can redo).

Stand-alone script: the llmpar library never imports it, and the library's tests do not
need torch. A small Llama-like transformers model is built from a config with random
weights (nothing is downloaded), in bf16 (or fp32), and trained for two steps with
torch.optim.AdamW (foreach=True, or fused=True; its states in the weights' dtype), as the
hf-trainer profile runs it on a GPU: forward with labels (transformers' ForCausalLMLoss
upcasts the logits to fp32, a no-op on fp32 logits), backward, optimizer step,
zero_grad(set_to_none=True). The second step is measured: by then the optimizer's states
exist, as in every step of a run. The runs vary the micro-batch, the sequence, full
activation checkpointing, gradient accumulation, the attention implementation (SDPA or
eager), the optimizer kernel and the dtype (`RUNS`).

CPU torch has no caching allocator to ask (`torch.cuda.max_memory_allocated()` needs a
GPU), so the probe counts live tensor storages (validation/peak_probe.py's
`LiveStorages`, shared with measure_peak_fsdp.py and measure_finetune_peak.py, as are the
model and the step): a TorchDispatchMode sees every tensor an operator returns (forward,
the autograd engine's backward, the optimizer's foreach ops); each storage is counted once
(views share it) until it is freed (a weak reference to the storage expires). After every
operator the live bytes are summed; the largest sum is the allocated peak, with the phase
it happened in. What an operator allocates and frees inside
itself (kernel scratch) is not seen; on a GPU the caching allocator would round each block
(llmpar's `reserved_bytes`), which the CPU cannot show.

Usage:
  python validation/measure_peak.py            # writes validation/data/memory_peak.json
See validation/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peak_probe  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "memory_peak.json"
BASE = {"attention": "sdpa", "optimizer": "foreach", "dtype": "bf16"}
"""What a run uses unless it says otherwise."""
RUNS = tuple({**BASE, "micro_batch_size": b, "sequence_length": s, "recompute": recompute,
              "micro_batches": micro_batches}
             for micro_batches in (1, 2) for recompute in ("none", "full")
             for b, s in ((4, 512), (2, 1024))) + tuple({**BASE, **run} for run in (
    # the sequence and the micro-batch (a few tokens: the optimizer step's foreach copy
    # of the second moments is the peak)
    {"micro_batch_size": 1, "sequence_length": 128, "recompute": "none", "micro_batches": 1},
    {"micro_batch_size": 1, "sequence_length": 128, "recompute": "none", "micro_batches": 2},
    {"micro_batch_size": 1, "sequence_length": 2048, "recompute": "none", "micro_batches": 2},
    {"micro_batch_size": 1, "sequence_length": 2048, "recompute": "full", "micro_batches": 2},
    {"micro_batch_size": 8, "sequence_length": 256, "recompute": "none", "micro_batches": 2},
    # eager attention: the scores, their softmax and the dropout mask are saved
    {"attention": "eager", "micro_batch_size": 4, "sequence_length": 512, "recompute": "none",
     "micro_batches": 2},
    {"attention": "eager", "micro_batch_size": 2, "sequence_length": 1024,
     "recompute": "none", "micro_batches": 2},
    {"attention": "eager", "micro_batch_size": 2, "sequence_length": 1024,
     "recompute": "full", "micro_batches": 2},
    {"attention": "eager", "micro_batch_size": 1, "sequence_length": 2048,
     "recompute": "none", "micro_batches": 1},
    # torch.optim.AdamW(fused=True): the step works in place
    {"optimizer": "fused", "micro_batch_size": 1, "sequence_length": 128,
     "recompute": "none", "micro_batches": 2},
    {"optimizer": "fused", "micro_batch_size": 4, "sequence_length": 512,
     "recompute": "none", "micro_batches": 2},
    # fp32 weights, activations and states: logits.float() returns the logits themselves
    {"dtype": "fp32", "micro_batch_size": 4, "sequence_length": 512, "recompute": "none",
     "micro_batches": 2},
    {"dtype": "fp32", "micro_batch_size": 2, "sequence_length": 1024, "recompute": "full",
     "micro_batches": 2},
    {"dtype": "fp32", "micro_batch_size": 1, "sequence_length": 128, "recompute": "none",
     "micro_batches": 2},
))
"""Gradient accumulation over 2 micro-batches: from the second on, the gradients are
alive through the loss's backward (with one, zero_grad(set_to_none=True) has freed them)."""


def measure(run: dict) -> dict:
    config, model = peak_probe.llama(run["attention"])
    model = model.to(peak_probe.DTYPES[run["dtype"]])
    model.train()
    if run["recompute"] == "full":
        # every decoder layer keeps only its input (non-reentrant torch.utils.checkpoint)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    kernel = {run["optimizer"]: True}  # foreach=True or fused=True
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kernel)
    b, s = run["micro_batch_size"], run["sequence_length"]
    ids = torch.randint(0, config.vocab_size, (b, s))

    def step(probe: peak_probe.LiveStorages | None) -> None:
        peak_probe.train_step(model, optimizer, run["micro_batches"],
                              lambda: model(input_ids=ids, labels=ids).loss, probe)

    probe, start = peak_probe.second_step(
        step, lambda: peak_probe.model_and_states(model, optimizer))
    parameters = sum(p.numel() for p in model.parameters())
    return {**run, "parameters": parameters, **peak_probe.peak_fields(probe, start)}


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [measure(run) for run in RUNS]
    for row in rows:
        print(f"{row['attention']} {row['optimizer']} {row['dtype']} "
              f"b={row['micro_batch_size']} s={row['sequence_length']} "
              f"micro-batches={row['micro_batches']} recompute={row['recompute']}: peak "
              f"{row['peak_allocated_bytes'] / 2**20:,.1f} MiB in {row['peak_phase']}")
    peak_probe.write_measured(OUT, {
        "what": "allocated memory peak of one training step (the second), live tensor "
                "storages counted after every operator (validation/measure_peak.py)",
        "config": peak_probe.CONFIG, "dtype": "each run's: weights, activations and AdamW states",
        "optimizer": "torch.optim.AdamW(foreach=True or fused=True: each run's optimizer), "
        "states in the weights' dtype", "attention": "each run's attn_implementation",
        "loss": "transformers ForCausalLMLoss (logits.float())"}, rows)


if __name__ == "__main__":
    main()
