#!/usr/bin/env python3
"""What a cross-entropy over one chunk of logits keeps and allocates, run eagerly and
compiled, for llmpar's `compiled_cross_entropy` (ground truth you can redo).

Stand-alone script: the llmpar library never imports it, and the library's tests do not
need torch. The function is torchtune's `CEWithChunkedOutputLoss.compute_cross_entropy`
(torchtune/modules/loss/ce_chunked_output_loss.py at commit 0031bfb0):
`F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")` on one
chunk of bf16 logits, which torchtune's recipes compile on its own
(`training.compile_loss`) when `compile = True`. On the CPU (torch.compile's inductor
backend, C++ kernels):

- saved for backward: every tensor autograd's saved-tensor hooks see in the forward
  (shape, dtype, and whether it is the logits' own storage);
- allocated: the buffers of inductor's generated forward and backward code
  (`empty_strided_cpu` calls, read from `torch._inductor.utils.run_and_get_code`).

Usage (in the measuring environment of validation/requirements.txt):
  python validation/measure_compiled_loss.py   # writes validation/data/compiled_loss.json
"""

from __future__ import annotations

import datetime
import json
import platform
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "compiled_loss.json"
TOKENS, VOCAB = 512, 32000
ALLOCATION = re.compile(r"empty_strided_cpu\((\([^)]*\)), \([^)]*\), torch\.(\w+)\)")


def compute_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def saved(fn) -> list[dict]:
    torch.manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))
    found = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        found.append({"shape": list(tensor.shape), "dtype": str(tensor.dtype).split(".")[1],
                      "is_the_logits": tensor.untyped_storage().data_ptr()
                      == logits.untyped_storage().data_ptr()})
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = fn(logits, labels)
    loss.backward()
    return found


def allocations(compiled) -> list[list[dict]]:
    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))

    def step() -> torch.Tensor:
        loss = compiled(logits, labels)
        loss.backward()
        return loss

    _, codes = run_and_get_code(step)
    return [[{"shape": [int(size) for size in shape.strip("()").split(",") if size.strip()],
              "dtype": dtype} for shape, dtype in ALLOCATION.findall(code)] for code in codes]


def main() -> None:
    eager = saved(compute_cross_entropy)
    compiled = torch.compile(compute_cross_entropy)
    kept = saved(compiled)
    forward, backward = allocations(torch.compile(compute_cross_entropy))
    OUT.write_text(json.dumps({
        "what": "tensors saved for backward and buffers allocated by F.cross_entropy("
                "logits.float(), labels, reduction='sum') on one chunk of bf16 logits, "
                "eager and torch.compile'd (validation/measure_compiled_loss.py)",
        "tokens": TOKENS, "vocab": VOCAB, "logits_dtype": "bfloat16",
        "eager_saved": eager, "compiled_saved": kept,
        "compiled_forward_allocations": forward, "compiled_backward_allocations": backward,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "measured": datetime.date.today().isoformat()}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
