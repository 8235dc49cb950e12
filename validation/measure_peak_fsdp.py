#!/usr/bin/env python3
"""Measure the allocated memory peak of one real FSDP2 training step on the CPU, on every
rank, for llmpar's `training.memory_peak` under the pytorch-fsdp2 and torchtitan
profiles (ground truth you can redo).

Stand-alone script: the llmpar library never imports it, and the library's tests do not
need torch. The model is validation/measure_peak.py's small Llama-like transformers model
(`CONFIG`, random weights, nothing downloaded), its weights in fp32, sharded with FSDP2
(`torch.distributed.fsdp.fully_shard`) over 2 or 4 processes on the gloo backend
(`torch.multiprocessing.spawn`, a file store on local disk), under
`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`, torchtitan's default
(training.mixed_precision_param / mixed_precision_reduce): the sharded fp32 weights are cast
to bf16 before the all-gather, forward and backward run in bf16, the gradients are
reduce-scattered in fp32 into fp32 sharded gradients. Two ways of wrapping (`WRAPPINGS`):

- "root" (the pytorch-fsdp2 profile): `fully_shard` on each decoder layer, then on the
  model, whose own parameters (embeddings, final norm, output layer) are the root unit's
  (fully_shard's docstring; torch/distributed/fsdp/_fully_shard/_fsdp_state.py).
- "separate" (the torchtitan profile): `fully_shard` on the embeddings, on each decoder
  layer, on [final norm, output layer] with reshard_after_forward only under the "always"
  policy, then on the model, which holds no parameter (torchtitan/models/llama3/
  parallelize.py apply_fsdp at commit ae3bea9; torchtitan 0.2.x).

Each layer's reshard_after_forward is the run's (true: FSDP2's default and torchtitan's
"default" policy without pipeline parallelism; false: "never"); the model's is left unset,
so the root unit is not resharded after forward (torch 2.13's FSDPState._lazy_init, where
the argument is left unset: `_auto_reshard_after_forward`). Full activation
checkpointing wraps each decoder layer before fully_shard, as torchtitan's apply_ac does
(torch.distributed.algorithms._checkpoint.checkpoint_wrapper, non-reentrant, here through
transformers' gradient checkpointing with use_reentrant=False, the same
torch.utils.checkpoint). Each step, per micro-batch: the model's forward to the logits
(bf16), then the loss outside the model as torchtitan computes it
(`cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`,
torchtitan/components/loss.py; under both wrappings), so the root's post-forward has run
(and freed the last all-gather's output, _fsdp_state.py FSDPState._post_forward) before the
loss; backward; then torch.optim.AdamW (foreach=True: the pytorch-fsdp2 profile's kernel;
fused=True: torchtitan's optimizer.implementation default) and zero_grad(set_to_none=True).
Two steps; the second is measured.

The probe is measure_peak.py's `LiveStorages` (validation/peak_probe.py: a
TorchDispatchMode summing the live tensor storages after every operator), with three
changes FSDP2 needs: sharded parameters, gradients and optimizer states are DTensors,
whose local tensor is counted; a storage is known by its StorageImpl (`_cdata`), not its
data pointer; and FSDP2 allocates and frees each unsharded parameter by resizing its
storage (alloc_storage / free_storage in
torch/distributed/fsdp/_fully_shard/_fsdp_param.py), which no operator sees, so both are
wrapped to report the new size. The probe starts from every CPU tensor alive after the
first step (gc), which includes FSDP2's padded shards, the optimizer's states and the
input ids.

What the CPU run does differently from CUDA (torch 2.13, same files): the device handle is
torch.cpu, whose streams and events are no-ops, so FSDP2's all-gather copy-in and
reduce-scatter run in line on the one stream and nothing waits on an event; FSDP2 never calls
record_stream on either device, and frees its all-gather output and reduce-scatter input by
dropping references held in `all_gather_state` / `reduce_scatter_state` at the same points of
the Python program on both (FSDPParamGroup.wait_for_unshard, foreach_reduce), so the
allocated bytes seen here follow the same lifetimes a CUDA run's `max_memory_allocated()`
sees. What gloo allocates inside a collective (its own staging), and any operator's scratch,
is not seen; NCCL writes into the tensors FSDP2 hands it. The caching allocator's rounding
(reserved memory) does not exist on the CPU.

Usage:
  python validation/measure_peak_fsdp.py       # writes validation/data/memory_peak_fsdp.json
See validation/README.md.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peak_probe  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "memory_peak_fsdp.json"
WRAPPINGS = {"root": "pytorch-fsdp2", "separate": "torchtitan"}
"""How fully_shard wraps the model, and the framework profile that wrapping stands for."""
OPTIMIZERS = {"root": "foreach", "separate": "fused"}
"""Each profile's torch.optim.AdamW kernel (specs/frameworks/)."""
BASE = {"micro_batch_size": 2, "sequence_length": 320}
RUNS = tuple(
    {**BASE, "world_size": 2, "wrapping": wrapping, "recompute": recompute,
     "reshard_after_forward": reshard, "micro_batches": micro_batches}
    for wrapping in WRAPPINGS for recompute in ("none", "full") for reshard in (True, False)
    for micro_batches in (1, 2)) + tuple(
    {"world_size": 4, "wrapping": wrapping, "recompute": recompute,
     "reshard_after_forward": True, "micro_batches": 2, "micro_batch_size": 1,
     "sequence_length": 768}
    for wrapping in WRAPPINGS for recompute in ("none", "full")) + tuple(
    {"world_size": 2, "wrapping": wrapping, "recompute": "none",
     "reshard_after_forward": True, "micro_batches": micro_batches, "micro_batch_size": 1,
     "sequence_length": 64}
    for wrapping in WRAPPINGS for micro_batches in (1, 2))
"""2 ranks: every wrapping, checkpointing, reshard_after_forward and 1 or 2 micro-batches;
4 ranks: each wrapping at its default resharding; a few tokens (1 x 64), where the loss's
fp32 tensors are small beside the weights and the peak moves to the gradients'
reduce-scatter or the optimizer step. Tokens per micro-batch (640, 768) differ
from the hidden size (512), so that no tokens x vocabulary tensor has the size of a
hidden x vocabulary weight."""


class ShardedLiveStorages(peak_probe.LiveStorages):
    """LiveStorages for FSDP2: DTensors counted by their local tensor, storages known by
    their StorageImpl, and FSDP2's storage resizes counted. Storages that first appear
    while a collective runs (gloo's own staging: its reduce-scatter allocates a buffer the
    size of the input, ProcessGroupGloo; NCCL reduces from the input into the output) are
    counted apart (`staging`, `peak_with_staging`), not in the peak."""

    def __init__(self, tensors):
        self.staging, self.peak_with_staging = 0, 0
        self.staged: dict[int, tuple[StorageWeakRef, int]] = {}
        self.in_collective = False
        super().__init__(tensors)

    def _track(self, tensor) -> None:
        if isinstance(tensor, DTensor):
            tensor = tensor._local_tensor
        if tensor.device.type != "cpu":
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live and not self.live[key][0].expired():
            return
        if self.in_collective:
            if key not in self.staged or self.staged[key][0].expired():
                self.staged[key] = (StorageWeakRef(storage), storage.nbytes())
            return
        self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.current += storage.nbytes()

    def _sweep(self) -> None:
        super()._sweep()
        for key in [k for k, (ref, _) in self.staged.items() if ref.expired()]:
            del self.staged[key]
        self.staging = sum(size for _, size in self.staged.values())

    def _record(self) -> None:
        super()._record()
        self.peak_with_staging = max(self.peak_with_staging, self.current + self.staging)

    def resized(self, tensor) -> None:
        """A storage FSDP2 resized in place: its new size replaces the one counted."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.live or self.live[key][0].expired():
            self._track(tensor)
        else:
            ref, old = self.live[key]
            self.live[key] = (ref, storage.nbytes())
            self.current += storage.nbytes() - old
        self._record()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for leaf in torch.utils._pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        self._record()
        return out


PROBE: list[ShardedLiveStorages] = []
"""The probe running in this process (at most one), told of FSDP2's storage resizes."""


def _reporting(resize):
    @functools.wraps(resize)
    def wrapped(tensor):
        resize(tensor)
        if PROBE:
            PROBE[0].resized(tensor)
    return wrapped


def _collective(call):
    @functools.wraps(call)
    def wrapped(*args, **kwargs):
        if not PROBE:
            return call(*args, **kwargs)
        PROBE[0].in_collective = True
        try:
            return call(*args, **kwargs)
        finally:
            PROBE[0].in_collective = False
    return wrapped


def _patch_resizes() -> None:
    """alloc_storage / free_storage resize a storage in place, which no operator shows;
    the collectives FSDP2 calls (_fsdp_collectives.py DefaultAllGather /
    DefaultReduceScatter) are marked so that the backend's staging is counted apart."""
    for module in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            if hasattr(module, name):
                setattr(module, name, _reporting(getattr(module, name)))
    for name in ("all_gather_single", "reduce_scatter_single"):
        setattr(dist, name, _collective(getattr(dist, name)))


def build(run: dict):
    config, model = peak_probe.llama("sdpa")  # fp32 weights
    model.train()
    if run["recompute"] == "full":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = run["reshard_after_forward"]
    if run["wrapping"] == "separate":
        fully_shard(model.model.embed_tokens, mp_policy=policy, reshard_after_forward=reshard)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    if run["wrapping"] == "separate":
        # torchtitan: [norm, output] resharded after forward under the "always" policy only
        fully_shard([model.model.norm, model.lm_head], mp_policy=policy,
                    reshard_after_forward=False)
    # reshard_after_forward left unset (None): FSDP2 does not reshard the root after
    # forward (FSDPState._lazy_init, _auto_reshard_after_forward), as torchtitan calls it
    fully_shard(model, mp_policy=policy)
    kernel = {OPTIMIZERS[run["wrapping"]]: True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kernel)
    return config, model, optimizer


def measure(rank: int, run: dict) -> dict:
    config, model, optimizer = build(run)
    b, s = run["micro_batch_size"], run["sequence_length"]
    generator = torch.Generator().manual_seed(peak_probe.SEED + rank)
    ids = torch.randint(0, config.vocab_size, (b, s), generator=generator)

    def loss() -> torch.Tensor:
        logits = model(input_ids=ids, use_cache=False).logits
        return torch.nn.functional.cross_entropy(  # torchtitan's cross_entropy_loss
            logits.flatten(0, 1).float(), ids.flatten(0, 1))

    def step(probe: peak_probe.LiveStorages | None) -> None:
        peak_probe.train_step(model, optimizer, run["micro_batches"], loss, probe)

    def alive() -> list[torch.Tensor]:
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
        tensors += [p.to_local() for p in model.parameters()]
        return tensors + peak_probe.optimizer_states(optimizer)

    probe, start = peak_probe.second_step(step, alive, ShardedLiveStorages, PROBE)
    sharded = sum(p.to_local().numel() for p in model.parameters())
    parameters = sum(p.numel() for p in model.parameters())
    return {"rank": rank, "parameters": parameters, "parameters_on_rank": sharded,
            "start_bytes": start, "peak_allocated_bytes": probe.peak,
            "peak_with_backend_staging_bytes": probe.peak_with_staging,
            "peak_phase": probe.peak_phase, "peak_by_phase": probe.peak_by_phase}


def worker(rank: int, world_size: int, store: str, runs: list[dict], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)
    _patch_resizes()
    found = []
    for run in runs:
        found.append(measure(rank, run))
        dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps(found))
    dist.destroy_process_group()


def measure_all(world_size: int, runs: list[dict]) -> list[list[dict]]:
    """Every run of `runs` on `world_size` processes: per run, each rank's result."""
    with tempfile.TemporaryDirectory() as folder:
        store, out = os.path.join(folder, "store"), os.path.join(folder, "out")
        mp.spawn(worker, args=(world_size, store, runs, out), nprocs=world_size, join=True)
        ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world_size)]
    return [[ranks[rank][i] for rank in range(world_size)] for i in range(len(runs))]


def main() -> None:
    rows = []
    for world_size in sorted({run["world_size"] for run in RUNS}):
        runs = [run for run in RUNS if run["world_size"] == world_size]
        for run, ranks in zip(runs, measure_all(world_size, runs)):
            peak = max(ranks, key=lambda r: r["peak_allocated_bytes"])
            row = {**run, "profile": WRAPPINGS[run["wrapping"]],
                   "optimizer": OPTIMIZERS[run["wrapping"]], "dtype": "fp32",
                   "parameters": peak["parameters"],
                   "peak_allocated_bytes": peak["peak_allocated_bytes"],
                   "peak_phase": peak["peak_phase"], "peak_rank": peak["rank"],
                   "peak_with_backend_staging_bytes": max(
                       r["peak_with_backend_staging_bytes"] for r in ranks),
                   "ranks": ranks}
            rows.append(row)
            print(f"{row['profile']} ({run['wrapping']}) world={world_size} "
                  f"b={run['micro_batch_size']} s={run['sequence_length']} "
                  f"micro-batches={run['micro_batches']} recompute={run['recompute']} "
                  f"reshard_after_forward={run['reshard_after_forward']}: peak "
                  f"{row['peak_allocated_bytes'] / 2**20:,.2f} MiB in {row['peak_phase']} "
                  f"(rank {row['peak_rank']}; start "
                  f"{min(r['start_bytes'] for r in ranks) / 2**20:,.2f} MiB)", flush=True)
    peak_probe.write_measured(OUT, {
        "what": "allocated memory peak of one FSDP2 training step (the second) on each rank, "
                "live tensor storages counted after every operator and FSDP2 storage resize "
                "(validation/measure_peak_fsdp.py); peak_allocated_bytes is the largest rank's",
        "config": peak_probe.CONFIG,
        "dtype": "fp32 sharded weights, bf16 all-gathers and compute (MixedPrecisionPolicy("
        "param_dtype=bfloat16, reduce_dtype=float32)), fp32 sharded gradients and AdamW "
        "states", "backend": "gloo on the CPU, torch.multiprocessing.spawn",
        "optimizer": "torch.optim.AdamW(foreach=True) under the root wrapping (pytorch-fsdp2), "
        "fused=True under the separate wrapping (torchtitan)",
        "attention": "sdpa", "loss": "torch.nn.functional.cross_entropy(logits.flatten(0, 1)"
        ".float(), labels.flatten(0, 1)) outside the model (torchtitan/components/loss.py)"},
        rows)


if __name__ == "__main__":
    main()
