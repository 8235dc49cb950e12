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
GPU), so the probe counts live tensor storages: a TorchDispatchMode sees every tensor an
operator returns (forward, the autograd engine's backward, the optimizer's foreach ops);
each storage is counted once (views share it) until it is freed (a weak reference to the
storage expires). After every operator the live bytes are summed; the largest sum is the
allocated peak, with the phase it happened in. What an operator allocates and frees inside
itself (kernel scratch) is not seen; on a GPU the caching allocator would round each block
(llmpar's `reserved_bytes`), which the CPU cannot show.

Usage:
  python validation/measure_peak.py            # writes validation/data/memory_peak.json
See validation/README.md.
"""

from __future__ import annotations

import datetime
import gc
import json
import platform
from pathlib import Path

import torch
import transformers
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "memory_peak.json"
SEED = 0
CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512,
    "intermediate_size": 1376, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "attention_dropout": 0.0,
}
"""A Llama block at small widths: GQA, SwiGLU, RMSNorm, RoPE, an untied output layer."""
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
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class LiveStorages(TorchDispatchMode):
    """Bytes of every live tensor storage, and their peak, by phase."""

    def __init__(self, tensors):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.phase = "setup"
        self.peak, self.peak_phase = 0, ""
        self.peak_by_phase: dict[str, int] = {}
        for tensor in tensors:
            self._track(tensor)
        self._record()

    def _track(self, tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if not storage.nbytes() or key in self.live and not self.live[key][0].expired():
            return
        self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.current += storage.nbytes()

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]

    def _record(self) -> None:
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.phase
        self.peak_by_phase[self.phase] = max(self.peak_by_phase.get(self.phase, 0),
                                             self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
                self._track(leaf)
        self._record()
        return out

    def enter(self, phase: str) -> None:
        gc.collect()
        self._sweep()
        self.phase = phase
        self._record()


def measure(run: dict) -> dict:
    torch.manual_seed(SEED)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items()
                            if k not in ("model_type", "architectures")})
    config._attn_implementation = run["attention"]
    model = LlamaForCausalLM(config).to(DTYPES[run["dtype"]])
    model.train()
    if run["recompute"] == "full":
        # every decoder layer keeps only its input (non-reentrant torch.utils.checkpoint)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    kernel = {run["optimizer"]: True}  # foreach=True or fused=True
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kernel)
    b, s = run["micro_batch_size"], run["sequence_length"]
    ids = torch.randint(0, config.vocab_size, (b, s))

    def step(probe: LiveStorages | None) -> None:
        for micro_batch in range(run["micro_batches"]):
            if probe is not None:
                probe.enter(f"forward {micro_batch}")
            loss = model(input_ids=ids, labels=ids).loss
            if probe is not None:
                probe.enter(f"backward {micro_batch}")
            loss.backward()
            del loss
        if probe is not None:
            probe.enter("optimizer step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(None)  # the first step creates the optimizer's states
    gc.collect()
    tensors = [p for p in model.parameters()] + [b for b in model.buffers()]
    tensors += [t for state in optimizer.state.values() for t in state.values()
                if isinstance(t, torch.Tensor)]
    with LiveStorages(tensors) as probe:
        start = probe.current
        step(probe)
    parameters = sum(p.numel() for p in model.parameters())
    return {**run, "parameters": parameters, "start_bytes": start,
            "peak_allocated_bytes": probe.peak, "peak_phase": probe.peak_phase,
            "peak_by_phase": probe.peak_by_phase}


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [measure(run) for run in RUNS]
    for row in rows:
        print(f"{row['attention']} {row['optimizer']} {row['dtype']} "
              f"b={row['micro_batch_size']} s={row['sequence_length']} "
              f"micro-batches={row['micro_batches']} recompute={row['recompute']}: peak "
              f"{row['peak_allocated_bytes'] / 2**20:,.1f} MiB in {row['peak_phase']}")
    OUT.write_text(json.dumps({
        "what": "allocated memory peak of one training step (the second), live tensor "
                "storages counted after every operator (validation/measure_peak.py)",
        "config": CONFIG, "dtype": "each run's: weights, activations and AdamW states",
        "optimizer": "torch.optim.AdamW(foreach=True or fused=True: each run's optimizer), "
        "states in the weights' dtype", "attention": "each run's attn_implementation",
        "loss": "transformers ForCausalLMLoss (logits.float())",
        "versions": {"torch": torch.__version__,
                                         "transformers": transformers.__version__,
                                         "python": platform.python_version()},
        "measured": datetime.date.today().isoformat(), "runs": rows}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
