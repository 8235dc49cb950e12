"""PyTorch FSDP2: a DeviceMesh and `fully_shard` snippet for your training script, and the
torchrun line; and the snippet read back (`llmpar.launch.fsdp2_read`).

The calls and keyword names follow torch's FSDP2 API (`torch.distributed.fsdp.fully_shard`,
`MixedPrecisionPolicy`, `FSDPModule.set_requires_gradient_sync`,
`torch.distributed.device_mesh.init_device_mesh`) as installed at the version recorded in
`validation/data/launch/pytorch-fsdp2.json`, against which the tests check the snippet.
The snippet covers data parallelism (FSDP2, HSDP, DDP); tensor, pipeline, context and
expert parallelism are torchtitan's (`llmpar launch --for torchtitan`).
"""

from __future__ import annotations

import attrs

from llmpar.launch.common import accumulation_steps, global_batch, steps_of, torchrun, training_only
from llmpar.launch.fsdp2_read import ACCUMULATION, MICRO_BATCH, SEQUENCE, read_snippet
from llmpar.launch.settings import Ledger
from llmpar.launch.target import Launch, LaunchFile, ReadSettings
from llmpar.spec import Spec
from llmpar.strategy import Layout

VERSION = "PyTorch 2.14 FSDP2"
TORCH_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


@attrs.frozen
class Fsdp2Target:
    """A PyTorch FSDP2 setup snippet (`fully_shard` over a DeviceMesh)."""

    name: str = "pytorch-fsdp2"
    aliases: tuple[str, ...] = ("fsdp2", "fsdp")
    description: str = "a PyTorch FSDP2 + DeviceMesh snippet and the torchrun line"

    def read(self, text: str, source: str, base: Spec | None = None) -> ReadSettings:
        return read_snippet(text, source, base)

    def launch(self, spec: Spec, layout: Layout) -> Launch:
        training_only(spec, self.name)
        ledger = Ledger(spec, "PyTorch FSDP2")
        notes: list[str] = []
        d = layout.degree("data")
        data = spec.parallel.get("data")
        stage = 0 if data is None else data.stage
        ledger.take("parallel.data.degree", "parallel.data.zero", "parallel.data.fsdp",
                    "hardware.num_gpus", "hardware.gpus_per_node", "model",
                    "training.micro_batch_size", "training.global_batch_size",
                    "training.sequence_length", "training.tokens",
                    "training.tokens_per_parameter", "optimizer", "precision")
        for name in ("tensor", "pipeline", "context", "expert"):
            if layout.degree(name) > 1:
                ledger.cannot(f"parallel.{name}", "this snippet shards data only: "
                              "`llmpar launch --for torchtitan` writes the other strategies",
                              layout.degree(name))
            elif name in spec.parallel:
                ledger.take(f"parallel.{name}")
        if "sequence" in spec.parallel and layout.degree("tensor") == 1:
            ledger.take("parallel.sequence")
        compute = TORCH_DTYPES.get(spec.precision.compute, "torch.bfloat16")
        if spec.precision.compute not in TORCH_DTYPES:
            ledger.cannot("precision.compute", "MixedPrecisionPolicy computes in bf16, fp16 "
                          "or fp32 (fp8 products are torchao's: `--for torchtitan`); "
                          "written as bf16", spec.precision.compute)
        formats = {"linear": spec.precision.linear_format,
                   "attention": spec.precision.attention_format,
                   "weight_gather": spec.precision.weight_gather_under(spec.training.profile)}
        for key, stated in formats.items():
            if stated not in TORCH_DTYPES:
                ledger.cannot(f"precision.{key}", "this snippet computes and gathers in "
                              "MixedPrecisionPolicy's param_dtype (fp8 is torchao's: "
                              "`--for torchtitan`)", stated)
        lines = ["import torch",
                 "from torch.distributed.device_mesh import init_device_mesh",
                 "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard", ""]
        if stage == 3 and data is not None:
            shard = data.shard_degree or d
            ledger.take("parallel.data.shard_degree", "parallel.data.reshard_after_forward",
                        "parallel.data.gradient_sync", "parallel.data.reduce_dtype",
                        "parallel.data.overlap_grad_reduce", "parallel.data.overlap_param_gather")
            if shard != d:  # HSDP: replicate across groups, shard within each
                lines.append(f'mesh = init_device_mesh("cuda", ({d // shard}, {shard}), '
                             'mesh_dim_names=("replicate", "shard"))')
            else:
                lines.append(f'mesh = init_device_mesh("cuda", ({d},), '
                             'mesh_dim_names=("shard",))')
            reduce = {"fp32": "torch.float32", "bf16": "torch.bfloat16",
                      "fp16": "torch.float16"}.get(data.reduce_dtype, "None")
            lines += [f"policy = MixedPrecisionPolicy(param_dtype={compute}, "
                      f"reduce_dtype={reduce})",
                      "for block in model.layers:  # your model's transformer blocks",
                      "    fully_shard(block, mesh=mesh, reshard_after_forward="
                      f"{data.reshard_after_forward}, mp_policy=policy)",
                      "fully_shard(model, mesh=mesh, mp_policy=policy)"]
            for field in ("overlap_grad_reduce", "overlap_param_gather"):
                if not getattr(data, field):
                    ledger.cannot(f"parallel.data.{field}", "FSDP2 always overlaps its "
                                  "collectives", False)
        else:
            if stage in (1, 2):
                ledger.cannot("parallel.data.zero", "FSDP2 shards all states or none "
                              "(DDP): no ZeRO-1/2", stage)
            lines += ["from torch.nn.parallel import DistributedDataParallel",
                      "model = DistributedDataParallel(model)"]
            if data is not None:
                ledger.take("parallel.data")
        m = accumulation_steps(spec, layout)
        micro = spec.training.micro_batch_size
        lines += ["", f"# {global_batch(spec, layout)} sequences of "
                      f"{spec.training.sequence_length} tokens per step: {m} micro-batches "
                      f"of {micro} on each of {d} data ranks"]
        last_only = data is not None and stage == 3 and data.gradient_sync == "last-micro-batch"
        lines += [f"for i, batch in enumerate(micro_batches):  # {ACCUMULATION} per step"]
        if last_only:
            lines.append(f"    model.set_requires_gradient_sync(i == {ACCUMULATION} - 1)")
        lines += ["    loss = model(batch).loss", "    loss.backward()",
                  "optimizer.step()", "optimizer.zero_grad()"]
        training = spec.training
        ledger.take("training.recompute")
        if training.recompute == "full" and training.recompute_layers is None:
            lines[3:3] = ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper "
                          "import apply_activation_checkpointing", ""]
            lines.insert(lines.index("for block in model.layers:  # your model's "
                                     "transformer blocks") if stage == 3 else 5,
                         "apply_activation_checkpointing(model, check_fn=lambda m: m in "
                         "set(model.layers))")
        elif training.recompute != "none":
            ledger.cannot("training.recompute", "this snippet checkpoints whole blocks "
                          "(full) only", training.recompute)
        ledger.cannot("training.recompute_layers", "not mapped")
        # The batch as constants the script uses and `llmpar import` reads back, after
        # the imports.
        lines[lines.index(""):lines.index("") + 1] = [
            "", f"{MICRO_BATCH} = {micro}", f"{SEQUENCE} = {spec.training.sequence_length}",
            f"{ACCUMULATION} = {m}", ""]
        if training.activation_offload_layers is not None:
            ledger.cannot("training.activation_offload_layers", "wrap the first blocks' "
                          "forward in torch.autograd.graph.save_on_cpu (not written)")
        if (steps := steps_of(spec, layout)) is not None:
            notes.append(f"the run is {steps} optimizer steps")
        notes.append("model, optimizer and micro_batches are your script's")
        snippet = "\n".join(lines) + "\n"
        launcher = torchrun(spec, "train.py")
        return Launch(target=self.name, framework_version=VERSION,
                      files=(LaunchFile("fsdp2_setup.py", snippet, "the setup to paste into "
                                        "train.py, after the model is built"),
                             LaunchFile("launch.sh", f"#!/bin/sh\n{launcher}\n",
                                        "the launcher line", in_command=True)),
                      command=launcher, unmapped=ledger.unmapped(), notes=tuple(notes))
