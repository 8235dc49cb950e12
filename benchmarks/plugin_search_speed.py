"""How fast a search runs when a third-party strategy with a fast form takes part: the
shipped offload plugin (`plugins/llmpar-offload`) against the same space without it.

    python benchmarks/plugin_search_speed.py            # 5 interleaved runs of each
    python benchmarks/plugin_search_speed.py --runs 9 gpt3-175b-1024-a100

Per case, in one process, runs interleaved (without, with, without, ...):
- "without": a session of llmpar's own strategies;
- "neutral": a session with the plugin, the spec carrying `[parallel.offload]` with
  everything off: the plugin takes part in every layout of the same space and changes
  nothing, so the best layout must be the same;
- "searched": the spec carrying an empty `[parallel.offload]` table: the search also
  varies what is offloaded (3 times the layouts); its time per layout is reported.
Medians and their ratio; the ratio is the budget (at most 1.5). Needs the plugin
installed (`pip install ./plugins/llmpar-offload`). Not a test: times depend on the
machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llmpar
from llmpar.loading.reader import read_source

SPECS = Path(__file__).resolve().parent / "specs"
CASES = ("gpt3-175b-1024-a100", "llama-3.1-405b-16384-h100")
OFF = {"optimizer": False, "gradients": False, "weights": False}


def _timed(session: llmpar.Session, table: dict[str, Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = llmpar.search(table, session=session)
    return time.perf_counter() - start, result


def measure(case: str, runs: int) -> dict[str, Any]:
    import llmpar_offload.plugin as offload

    raw, _ = read_source(SPECS / f"{case}.toml")
    parallel = dict(raw.get("parallel", {}))
    tables = {"without": raw,
              "neutral": {**raw, "parallel": {**parallel, "offload": OFF}},
              "searched": {**raw, "parallel": {**parallel, "offload": {}}}}
    sessions = {"without": llmpar.Session(load_entry_points=False),
                "neutral": llmpar.Session(load_entry_points=False, plugins=[offload]),
                "searched": llmpar.Session(load_entry_points=False, plugins=[offload])}
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    results: dict[str, Any] = {}
    for _ in range(runs):
        for name in tables:
            wall, results[name] = _timed(sessions[name], tables[name])
            seconds[name].append(wall)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    best = {name: (r.best.plan.layout, r.best.choices.get("offload.optimizer"))
            for name, r in results.items()}
    return {"case": case, "medians": medians, "results": results, "best": best,
            "ratio": medians["neutral"] / medians["without"],
            "per_layout_ratio": (medians["searched"] / results["searched"].considered)
            / (medians["without"] / results["without"].considered)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=CASES)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"llmpar search with and without the offload plugin, medians of {args.runs} "
          f"interleaved runs, Python {sys.version.split()[0]}")
    print("case | layouts without | s without | s neutral | ratio | same best | "
          "layouts searched | s searched | per-layout ratio")
    for case in args.cases:
        row = measure(case, args.runs)
        r, m = row["results"], row["medians"]
        same = row["best"]["without"][0] == row["best"]["neutral"][0]
        print(f"{case} | {r['without'].considered:,} | {m['without']:.2f} | "
              f"{m['neutral']:.2f} | {row['ratio']:.2f} | {'yes' if same else 'NO'} | "
              f"{r['searched'].considered:,} | {m['searched']:.2f} | "
              f"{row['per_layout_ratio']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
