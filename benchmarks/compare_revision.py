"""How much faster (or slower) exact evaluation is than at another git revision, both
measured in one process: the speed budget's check for a change, where the ratio to
llm-analysis (`evaluate_speed.py`) moves by about 5% between runs of the same code.

    python benchmarks/compare_revision.py HEAD~3          # 15 interleaved runs
    python benchmarks/compare_revision.py main --runs 21 --calls 300

The revision's `llmpar/` and `specs/` are written to a temporary folder with the package
renamed (`llmpar` -> `llmpar_at_revision`, in its imports and its own module names), so
that both copies load side by side; each evaluates the same loaded specs (the training
cases of `evaluate_speed.py` and its serving cases), and blocks of calls alternate between
the two (in turn first) with the garbage collector off. The plans must agree (the
revision's module names read as llmpar's); where they do not, the numbers differ and the
script says which. Each run's two blocks run back to back, so the ratio reported is the
median of the runs' ratios, with its quartiles. The same code against itself (`HEAD` with
a clean tree) reads a median within about 2% of 1 and quartiles within about 8% on a
shared machine: a smaller difference is not a measurement. Not a test: times depend on
the machine.

    python benchmarks/compare_revision.py HEAD --work     # bytecodes, not times

With `--work` it counts instead of timing: the bytecodes and Python calls one
evaluation of each case runs in either copy (`benchmarks/work.py`), the same on every run
of one Python version, so a change of 1% shows; `--top N` adds the N functions whose
bytecodes changed most.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from work import work_of

import llmpar

ROOT = Path(__file__).resolve().parent.parent
RENAMED = "llmpar_at_revision"
CASES = (ROOT / "benchmarks" / "specs" / "llama-2-7b-fsdp-8-h100.toml",
         ROOT / "specs" / "examples" / "gpt3-175b-1024-a100.toml",
         ROOT / "specs" / "examples" / "inference-llama-2-70b-h100.toml",
         ROOT / "specs" / "examples" / "inference-deepseek-v3-h200.toml")
# `llmpar.x`, `import llmpar`, `from llmpar import`: the package's own name in its sources
NAME = re.compile(r"\bllmpar(?=\.[a-z_])|(?<=import )llmpar\b|(?<=\bfrom )llmpar(?= import)")


def revision_copy(revision: str, into: Path) -> None:
    """`llmpar/` and `specs/` at `revision`, the package renamed (`RENAMED`)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision,
                              "llmpar", "specs"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        try:
            tar.extractall(into, filter="data")
        except TypeError:  # Python before 3.11.4: no filters (the archive is this repository's)
            tar.extractall(into)
    (into / "llmpar").rename(into / RENAMED)
    for path in (into / RENAMED).rglob("*.py"):
        path.write_text(NAME.sub(RENAMED, path.read_text()))


def plan_text(plan: Any) -> str:
    """A plan as JSON, module names read as llmpar's."""
    return json.dumps(plan.to_dict(), sort_keys=True, default=repr).replace(RENAMED, "llmpar")


def timed_calls(function: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="a git revision of this repository (HEAD~1, main...)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--work", action="store_true",
                        help="count bytecodes and Python calls instead of timing")
    parser.add_argument("--top", type=int, default=0,
                        help="with --work: the functions whose bytecodes changed most")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        revision_copy(args.revision, Path(folder))
        sys.path.insert(0, folder)
        other = importlib.import_module(RENAMED)
        sessions = {"revision": other.Session(load_entry_points=False),
                    "this tree": llmpar.Session(load_entry_points=False)}
        timed: dict[tuple[str, str], Callable[[], Any]] = {}
        for case in CASES:
            plans = {}
            for label, session in sessions.items():
                spec = session.load_spec(case)
                timed[(case.stem, label)] = lambda s=session, spec=spec: s.evaluate(spec)
                plans[label] = plan_text(session.evaluate(spec))
            if plans["revision"] != plans["this tree"]:
                print(f"{case.stem}: the plans differ (the copies compute different numbers, "
                      "so their times and counts compare different work)")
        for function in timed.values():
            timed_calls(function, args.calls // 4)  # warm up: first-call caches
        if args.work:
            print_work(timed, folder, args.revision, args.top)
            return 0
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in timed}
        gc.collect()
        gc.disable()  # collections land in either copy's blocks at random
        try:
            order = list(timed.items())
            for _ in range(args.runs):
                for key, function in order:
                    samples[key].append(timed_calls(function, args.calls))
                order.reverse()  # neither copy always runs first
        finally:
            gc.enable()
    print(f"median us per call of {args.runs} interleaved runs x {args.calls} calls, "
          f"revision {args.revision} against this tree, Python {sys.version.split()[0]}")
    print(f"{'case':<36} {'revision':>8} {'tree':>8}  tree / revision: median of the runs' "
          "ratios [quartiles]")
    for case in CASES:
        before, after = samples[(case.stem, "revision")], samples[(case.stem, "this tree")]
        # each run's two blocks ran back to back: their ratio leaves out slower drifts
        low, middle, high = statistics.quantiles([a / b for a, b in zip(after, before)], n=4)
        print(f"{case.stem:<36} {statistics.median(before) * 1e6:8.1f} "
              f"{statistics.median(after) * 1e6:8.1f}  {middle:.3f} [{low:.3f}, {high:.3f}]")
    return 0


def print_work(evaluations: dict[tuple[str, str], Callable[[], Any]], folder: str,
               revision: str, top: int) -> None:
    """Bytecodes and Python calls of one evaluation of each case, in either copy."""
    print(f"bytecodes and Python calls of one evaluation, revision {revision} against this "
          f"tree, Python {sys.version.split()[0]}")
    print(f"{'case':<36} {'revision':>9} {'tree':>9} {'ratio':>6} {'calls':>6} {'calls':>6}")
    for case in CASES:
        roots = (f"{folder}/", f"{ROOT}/")
        before = work_of(evaluations[(case.stem, "revision")], roots)
        after = work_of(evaluations[(case.stem, "this tree")], roots)
        print(f"{case.stem:<36} {before.bytecodes:9,d} {after.bytecodes:9,d} "
              f"{after.bytecodes / before.bytecodes:6.3f} {before.calls:6,d} {after.calls:6,d}")
        if top:
            # by file and name (a changed function's first line moves), the revision's
            # under llmpar's name
            changes = _by_name(after.by_function)
            changes.subtract(_by_name(before.by_function))
            for key, change in sorted(changes.items(), key=lambda item: -abs(item[1]))[:top]:
                if change:
                    print(f"    {change:+7,d}  {key}")


def _by_name(by_function: Counter[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for key, count in by_function.items():
        path, _, rest = key.replace(RENAMED, "llmpar").partition(":")
        found[f"{path} {rest.partition('(')[2].rstrip(')')}"] += count
    return found


if __name__ == "__main__":
    sys.exit(main())
