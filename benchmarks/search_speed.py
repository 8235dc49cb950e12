"""How fast `llmpar.search` is on large clusters: wall and CPU seconds (median of
several runs), layouts considered, valid layouts evaluated, and rates.

    python benchmarks/search_speed.py            # every case, 5 runs each, one process
    python benchmarks/search_speed.py --runs 3 --jobs 0 gpt3-175b-1024-a100

Cases are the specs in benchmarks/specs/. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import llmpar

SPECS = Path(__file__).resolve().parent / "specs"
CASES = ("gpt3-175b-1024-a100", "gpt-1t-3072-a100", "llama-3.1-405b-16384-h100",
         "deepseek-v3-2048-h800")


def measure(case: str, runs: int, jobs: int) -> dict[str, object]:
    walls, cpus = [], []
    result = None
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = llmpar.search(SPECS / f"{case}.toml", jobs=jobs)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    assert result is not None
    wall = statistics.median(walls)
    best = result.best
    return {"case": case, "considered": result.considered, "evaluated": result.evaluated,
            "ranked": result.ranked, "wall_s": wall, "wall_min_s": min(walls),
            "cpu_s": statistics.median(cpus), "considered_per_s": result.considered / wall,
            "evaluated_per_s": result.evaluated / wall, "best": best.plan.layout,
            "best_step_s": best.plan.step_seconds, "pareto": len(result.pareto)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=CASES)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes; 0: every core when the space is large")
    args = parser.parse_args(argv)
    jobs = args.jobs
    llmpar.default_session()  # plugin loading is not part of a search
    print(f"llmpar search, median of {args.runs} runs, jobs = {jobs}, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    header = ("case", "considered", "evaluated", "wall s", "min s", "CPU s", "considered/s",
              "evaluated/s", "best layout", "step s")
    print(" | ".join(header))
    for case in args.cases:
        row = measure(case, args.runs, jobs)
        print(f"{row['case']} | {row['considered']:,} | {row['evaluated']:,} | "
              f"{row['wall_s']:.2f} | {row['wall_min_s']:.2f} | {row['cpu_s']:.2f} | "
              f"{row['considered_per_s']:,.0f} | {row['evaluated_per_s']:,.0f} | "
              f"{row['best']} | {row['best_step_s']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
