"""How long one exact evaluation takes in process: llmpar's `Session.evaluate` on a loaded
Spec (and from a TOML file beside it), a serving spec against a training one, and
llm-analysis 0.2.2's `LLMAnalysis.training()` on the same training cases, interleaved
in one process.

llm-analysis 0.2.2 needs transformers < 5, so the comparison has its own environment,
outside CI:

    python3 -m venv /tmp/bench && . /tmp/bench/bin/activate
    pip install . 'llm-analysis==0.2.2'
    python benchmarks/evaluate_speed.py            # 7 interleaved runs of 200 calls each
    python benchmarks/evaluate_speed.py --work     # bytecodes of one call, not times

Without llm-analysis installed it reports llmpar alone. "llmpar" is a session that has
evaluated the model and training table before (a sweep, a search, an embedder: it keeps
footprints and training facts, `session.cache`); "nothing kept" is a session that keeps
nothing. This is the speed budget every later change keeps: a training spec at least as
fast as llm-analysis, a serving spec at most 2x a training one. Not a test: times depend
on the machine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from work import work_of

import llmpar
from llmpar.evaluation.cache import EvaluationCache

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
BENCHMARKS = Path(__file__).resolve().parent / "specs"

TRAINING = {
    # GPT-3 175B on 1024 A100, TP8 PP16 DP8, sequence parallel, selective recomputation.
    "gpt3-175b-1024-a100": {
        "llmpar": EXAMPLES / "gpt3-175b-1024-a100.toml",
        "llm-analysis": dict(model="megatron-lm-175b", gpu="a100-sxm-80gb",
                             parallel=dict(tp_size=8, pp_size=16, dp_size=8),
                             training=dict(batch_size_per_gpu=1, global_batch_size=1536,
                                           seq_len=2048, recompute="SELECTIVE", zero="NONE"))},
    # Llama-2-7B on 8 H100 with FSDP (ZeRO-3), micro-batch 1, no recomputation.
    "llama-2-7b-fsdp-8-h100": {
        "llmpar": BENCHMARKS / "llama-2-7b-fsdp-8-h100.toml",
        "llm-analysis": dict(model="NousResearch_Llama-2-7b-hf", gpu="h100-sxm-80gb",
                             parallel=dict(dp_size=8),
                             training=dict(batch_size_per_gpu=1, global_batch_size=64,
                                           seq_len=4096, recompute="NONE", zero="STAGE_3"))},
}
SERVING = {"llama-2-70b-tp8-h100": EXAMPLES / "inference-llama-2-70b-h100.toml",
           "deepseek-v3-h200": EXAMPLES / "inference-deepseek-v3-h200.toml"}


def per_call(function: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls


def llm_analysis_call(case: dict[str, Any]) -> Callable[[], Any] | None:
    """`LLMAnalysis(...).training(...)` for a case, or None without llm-analysis."""
    try:
        from llm_analysis import analysis, config
    except ImportError:
        return None
    logging.getLogger("__name__").setLevel(logging.ERROR)  # llm-analysis' own logger
    training = dict(case["training"])
    recompute = analysis.ActivationRecomputation[training.pop("recompute")]
    zero = analysis.DSZeRO[training.pop("zero")]
    model = config.get_model_config_by_name(case["model"])
    gpu = config.get_gpu_config_by_name(case["gpu"])
    parallel = config.ParallelismConfig(**case["parallel"])

    def run() -> Any:
        return analysis.LLMAnalysis(model, gpu, parallelism_config=parallel,
                                    flops_efficiency=0.5, hbm_memory_efficiency=0.9).training(
            activation_recomputation=recompute, ds_zero=zero, **training)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--work", action="store_true",
                        help="count bytecodes and Python calls of one call instead of timing "
                             "(benchmarks/work.py)")
    args = parser.parse_args(argv)
    session = llmpar.Session(load_entry_points=False)
    cold = llmpar.Session(load_entry_points=False)
    cold.cache = EvaluationCache(size=0)  # keeps nothing: every footprint computed again
    timed: dict[str, Callable[[], Any]] = {}
    for name, case in TRAINING.items():
        spec = session.load_spec(case["llmpar"])
        timed[f"llmpar {name}"] = lambda spec=spec: session.evaluate(spec)
        timed[f"llmpar {name} (nothing kept)"] = lambda spec=spec: cold.evaluate(spec)
        timed[f"llmpar {name} (TOML)"] = lambda path=case["llmpar"]: session.evaluate(path)
        other = llm_analysis_call(case["llm-analysis"])
        if other is not None:
            timed[f"llm-analysis {name}"] = other
    for name, path in SERVING.items():
        spec = session.load_spec(path)
        timed[f"llmpar serving {name}"] = lambda spec=spec: session.evaluate(spec)
    for function in timed.values():
        function()  # warm up: imports, first-call caches
    if args.work:
        print_work(timed)
        return 0
    samples: dict[str, list[float]] = {label: [] for label in timed}
    for _ in range(args.runs):
        for label, function in timed.items():
            samples[label].append(per_call(function, args.calls))
    medians = {label: statistics.median(values) for label, values in samples.items()}
    print(f"median ms per call of {args.runs} interleaved runs x {args.calls} calls, "
          f"Python {sys.version.split()[0]}")
    for label, seconds in medians.items():
        print(f"{label:<48} {seconds * 1e3:8.3f} ms")
    for name in TRAINING:
        other = medians.get(f"llm-analysis {name}")
        if other is not None:
            print(f"{name}: llmpar / llm-analysis = {medians[f'llmpar {name}'] / other:.2f} "
                  f"({medians[f'llmpar {name} (nothing kept)'] / other:.2f} keeping nothing)")
    training = max(medians[f"llmpar {name}"] for name in TRAINING)
    for name in SERVING:
        print(f"serving {name} / slowest training = "
              f"{medians[f'llmpar serving {name}'] / training:.2f}")
    return 0


def print_work(timed: dict[str, Callable[[], Any]]) -> None:
    """Bytecodes and Python calls of one call of each (`benchmarks/work.py`), and each
    training case's llmpar / llm-analysis ratio of bytecodes."""
    print(f"bytecodes and Python calls of one call, Python {sys.version.split()[0]}")
    counts = {label: work_of(function) for label, function in timed.items()}
    for label, work in counts.items():
        print(f"{label:<48} {work.bytecodes:8,d} {work.calls:6,d}")
    for name in TRAINING:
        other = counts.get(f"llm-analysis {name}")
        if other is not None:
            print(f"{name}: llmpar / llm-analysis = "
                  f"{counts[f'llmpar {name}'].bytecodes / other.bytecodes:.2f} of the bytecodes")


if __name__ == "__main__":
    sys.exit(main())
