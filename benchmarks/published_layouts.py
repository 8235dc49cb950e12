"""Where published layouts rank in `llmpar.search` under the constraints their runs had.

    python benchmarks/published_layouts.py

- Megatron-LM's GPT-3 175B on 1024 A100: TP8 x PP16 x DP8 (Narayanan et al. 2021,
  arXiv:2104.04473; Korthikanti et al. 2022, arXiv:2205.05198), under the 2021 setup
  (fp16, full recomputation, no sequence parallelism, no ZeRO, the data-parallel
  all-reduce not overlapped, micro-batch 1, 1F1B or interleaved) and the 2022 one
  (sequence parallelism, selective recomputation, distributed optimizer).
- Llama 3's 405B on 16384 H100: TP8 x CP1 x PP16 x DP128 (arXiv:2407.21783, Table 4).
Both keep tensor groups inside a node and use no context parallelism.
"""

from __future__ import annotations

import sys
from pathlib import Path

import llmpar
from llmpar.search.report import layout_text, options_text

SPECS = Path(__file__).resolve().parent / "specs"
WITHIN_NODE = {"tensor_within_node": True, "max_degrees": {"context": 1}}
MEGATRON_2021 = {**WITHIN_NODE, "recompute": ["full"], "micro_batch_sizes": [1],
                 "values": {"data.zero": [0], "sequence": [False],
                            "pipeline.schedule": ["1f1b", "interleaved"]}}
FP16_NO_OVERLAP = {"precision.weights": "fp16", "precision.gradients": "fp16",
                   "precision.activations": "fp16", "parallel.data.overlap_grad_reduce": False}
MEGATRON_2022 = {**WITHIN_NODE, "recompute": ["selective"], "micro_batch_sizes": [1],
                 "values": {"data.zero": [0, 1], "sequence": [True],
                            "pipeline.schedule": ["1f1b", "interleaved"]}}
CASES = (
    ("GPT-3 175B, Megatron 2021 setup", "gpt3-175b-1024-a100", MEGATRON_2021,
     FP16_NO_OVERLAP, {"tensor": 8, "pipeline": 16, "data": 8}),
    ("GPT-3 175B, Megatron 2022 setup", "gpt3-175b-1024-a100", MEGATRON_2022, {},
     {"tensor": 8, "pipeline": 16, "data": 8}),
    ("GPT-3 175B, any options, TP in a node, no CP", "gpt3-175b-1024-a100", WITHIN_NODE, {},
     {"tensor": 8, "pipeline": 16, "data": 8}),
    ("Llama 3.1 405B, TP in a node, no CP", "llama-3.1-405b-16384-h100", WITHIN_NODE, {},
     {"tensor": 8, "pipeline": 16, "data": 128}),
)


def report(title: str, case: str, constraints: dict, overrides: dict,
           target: dict[str, int]) -> None:
    result = llmpar.search(SPECS / f"{case}.toml", overrides, top=500, constraints=constraints)
    best = result.best.plan
    print(f"\n{title}: {result.considered:,} layouts, {result.ranked:,} evaluated, valid and "
          "fitting")
    print(f"  best: {layout_text(result.best.choices)} ({options_text(result.best.choices)}), "
          f"{best.step_seconds:.2f} s, {best.total_bytes / 2**30:.1f} GiB")
    hits = [r for r in result.results
            if all(r.choices.get(f"{k}.degree", 1) == v for k, v in target.items())]
    if not hits:
        print(f"  published layout: not in the top {len(result.results)}")
        return
    hit = hits[0].plan
    print(f"  published layout ranks {hits[0].rank} of {result.ranked}: "
          f"{layout_text(hits[0].choices)} ({options_text(hits[0].choices)}), "
          f"{hit.step_seconds:.2f} s (+{hit.step_seconds / best.step_seconds - 1:.1%}), "
          f"{hit.total_bytes / 2**30:.1f} GiB")
    print(f"  best vs published: exposed communication {best.exposed_communication_seconds:.2f}"
          f" vs {hit.exposed_communication_seconds:.2f} s, bubble {best.bubble_seconds:.2f} vs "
          f"{hit.bubble_seconds:.2f} s, compute {best.compute_seconds:.2f} vs "
          f"{hit.compute_seconds:.2f} s")


def main() -> int:
    for case in CASES:
        report(*case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
