"""What the peak-measuring scripts share (measure_peak.py, measure_peak_fsdp.py,
measure_finetune_peak.py): the small Llama-like transformers model, the probe that
counts live tensor storages, the training step with its phases, the measurement of the
second step and the data file's versions.

Not a script, and not for the llmpar library or its tests (it needs torch and
transformers): the scripts import it from validation/ beside them.

The probe: CPU torch has no caching allocator to ask (`torch.cuda.max_memory_allocated()`
needs a GPU), so `LiveStorages` counts live tensor storages: a TorchDispatchMode sees
every tensor an operator returns (forward, the autograd engine's backward, the
optimizer's foreach ops); each storage is counted once (views share it) until it is
freed (a weak reference to the storage expires). After every operator the live bytes are
summed; the largest sum is the allocated peak, with the phase it happened in.
"""

from __future__ import annotations

import datetime
import gc
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import LlamaConfig, LlamaForCausalLM

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


def llama(attention: str) -> tuple[LlamaConfig, LlamaForCausalLM]:
    """`CONFIG`'s model with random fp32 weights drawn after seeding torch with `SEED`
    (nothing is downloaded), under the attention implementation `attention`."""
    torch.manual_seed(SEED)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items()
                            if k not in ("model_type", "architectures")})
    config._attn_implementation = attention
    return config, LlamaForCausalLM(config)


def train_step(model, optimizer, micro_batches: int, loss: Callable[[], torch.Tensor],
               probe: LiveStorages | None) -> None:
    """One training step: per micro-batch the forward to `loss()` and its backward, then
    the optimizer's step and zero_grad(set_to_none=True); the probe, if any, told each
    phase ("forward i", "backward i", "optimizer step")."""
    for micro_batch in range(micro_batches):
        if probe is not None:
            probe.enter(f"forward {micro_batch}")
        value = loss()
        if probe is not None:
            probe.enter(f"backward {micro_batch}")
        value.backward()
        del value
    if probe is not None:
        probe.enter("optimizer step")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_states(optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors (AdamW's moments and step counts)."""
    return [t for state in optimizer.state.values() for t in state.values()
            if isinstance(t, torch.Tensor)]


def model_and_states(model, optimizer) -> list[torch.Tensor]:
    """The model's parameters and buffers and the optimizer's states."""
    tensors = [p for p in model.parameters()] + [b for b in model.buffers()]
    return tensors + optimizer_states(optimizer)


def second_step(step: Callable[[LiveStorages | None], None],
                alive: Callable[[], list[torch.Tensor]],
                probe_type: type[LiveStorages] = LiveStorages,
                running: list[Any] | None = None) -> tuple[LiveStorages, int]:
    """Run `step` twice and probe the second (by then the optimizer's states exist, as in
    every step of a run), the probe of `probe_type` starting from the tensors `alive()`
    gives after the first (and a gc), which are held through the step; the probe is in
    `running` while the step runs. Returns the probe and the bytes live as the second
    step started."""
    step(None)  # the first step creates the optimizer's states
    gc.collect()
    tensors = alive()
    with probe_type(tensors) as probe:
        if running is not None:
            running.append(probe)
        start = probe.current
        step(probe)
        if running is not None:
            running.clear()
    return probe, start


def peak_fields(probe: LiveStorages, start: int) -> dict[str, Any]:
    """A measured row's bytes: at the start of the step, at its peak, by phase."""
    return {"start_bytes": start, "peak_allocated_bytes": probe.peak,
            "peak_phase": probe.peak_phase, "peak_by_phase": probe.peak_by_phase}


def write_measured(out: Path, about: dict[str, Any], rows: list[dict[str, Any]],
                   **versions: str) -> None:
    """The data file: what was measured (`about`), the versions of torch, transformers,
    any other package (`versions`) and Python, the date, and the rows."""
    out.write_text(json.dumps({
        **about, "versions": {"torch": torch.__version__,
                              "transformers": transformers.__version__, **versions,
                              "python": platform.python_version()},
        "measured": datetime.date.today().isoformat(), "runs": rows}, indent=2) + "\n")
    print(f"wrote {out}")
