"""Predicted against published NCCL measurements: writes docs/validation-collectives.md.

    python validation/collective_bandwidth.py > docs/validation-collectives.md

Reads the published rows in validation/published/collectives/*.toml (each file cites its
source; every number in it is copied from that source), builds for each row the
collective llmpar would cost (operation, buffer, group of `gpus` ranks at stride 1, on the
row's cluster preset), and prints the measured time against llmpar's
`llmpar.communication.collectives.call_seconds` (the ring model, and NCCL's model of
`llmpar.communication.nccl` beside it), with bus bandwidths and the ratio
predicted / measured per row, grouped by source, and a summary per system that says what
collective_efficiency and per-step latency the rows imply. The large-message rows are a
test (tests/test_collectives_measured.py).

Conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md): nccl-tests' `size` is the buffer each
rank all-reduces, the whole array an all-gather produces or a reduce-scatter consumes, the
whole send buffer of one rank in an all-to-all, and what one rank sends in a sendrecv: the
same as llmpar's `Collective.buffer_bytes` (llmpar/strategy.py). algbw = size / time;
busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (all-gather, reduce-scatter, all-to-all),
x 1 (sendrecv). GB/s here is 10^9 bytes per second, as nccl-tests prints it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import llmpar
from llmpar.communication.collectives import (
    call_seconds,
    link_of,
    nccl_choice,
    traffic_and_steps,
)
from llmpar.strategy import Collective

PUBLISHED = Path(__file__).resolve().parent / "published" / "collectives"

LARGE_BYTES = 64 * 2**20
"""Rows at or above this size measure bandwidth (the summary's and the test's "large")."""
SMALL_BYTES = 64 * 2**10
"""Rows at or below this size measure latency (the summary's "small")."""

OPERATIONS = {
    # nccl-tests name: (llmpar operation, busbw / algbw as a function of ranks)
    "all_reduce": ("all-reduce", lambda n: 2 * (n - 1) / n),
    "all_gather": ("all-gather", lambda n: (n - 1) / n),
    "reduce_scatter": ("reduce-scatter", lambda n: (n - 1) / n),
    "alltoall": ("all-to-all", lambda n: (n - 1) / n),
    "sendrecv": ("send-recv", lambda n: 1.0),
}


def sources() -> list[tuple[Path, dict]]:
    return [(path, tomllib.loads(path.read_text())) for path in sorted(PUBLISHED.glob("*.toml"))]


def rows(data: dict):
    """Each measured row with its sweep's fields (a row's own fields win)."""
    for sweep in data["sweeps"]:
        base = {key: value for key, value in sweep.items() if key != "rows"}
        for row in sweep["rows"]:
            yield base | row


@functools.cache
def _hardware(cluster: str, gpus: int, overrides: tuple):
    spec = llmpar.load_spec({"model": {"parameters": 1e9},
                             "hardware": {"cluster": cluster, "num_gpus": gpus,
                                          "collective_algorithms": "ring",
                                          **dict(overrides)}})
    return spec.hardware


def hardware(row: dict):
    """The row's cluster preset, sized to its GPUs, with the row's stated overrides."""
    return _hardware(row["cluster"], row["gpus"], tuple(sorted(row.get("hardware", {}).items())))


FORCED = {"ring": ("ring",), "nvls": ("nvls",), "nvlstree": ("nvls-tree",)}
"""The rows' `algorithm` that name one algorithm the benchmark forced (NCCL_ALGO, or a
report's column per algorithm), as NCCL's model names it."""


def forced_algorithms(row: dict) -> tuple[str, ...] | None:
    """The algorithms NCCL could choose from for the row: the one it was forced to run,
    or None (all) where the row states NCCL's own choice or none."""
    name = row.get("algorithm", "").lower()
    if "nccl_algo=ring" in name:
        return ("ring",)
    return FORCED.get(name)


def collective(row: dict) -> Collective:
    return Collective(strategy="nccl-tests", name=row["operation"],
                      operation=OPERATIONS[row["operation"]][0], buffer_bytes=row["size"],
                      group_size=row["gpus"], group_stride=1)


def busbw_factor(row: dict) -> float:
    return OPERATIONS[row["operation"]][1](row["gpus"])


def measured_seconds(row: dict) -> float:
    """The source's time; where it prints none, size / algbw, or factor x size / busbw."""
    if "time_us" in row:
        return row["time_us"] * 1e-6
    if "algbw" in row:
        return row["size"] / (row["algbw"] * 1e9)
    return busbw_factor(row) * row["size"] / (row["busbw"] * 1e9)


def measured_busbw(row: dict) -> float:
    if "busbw" in row:
        return row["busbw"]
    return busbw_factor(row) * row["size"] / measured_seconds(row) / 1e9


def compare(row: dict) -> dict:
    """llmpar's time for the row's collective, and what the measurement implies."""
    hw = hardware(row)
    item = collective(row)
    predicted, tier = call_seconds(item, hw)
    measured = measured_seconds(row)
    link = link_of(item, hw)
    sent, steps = traffic_and_steps(item.operation, item.buffer_bytes, item.group_size)
    bandwidth_term = sent / (link.bandwidth_bytes_per_s * hw.collective_efficiency)
    if item.operation in ("all-reduce", "all-gather", "reduce-scatter"):
        modelled, algorithm = nccl_choice(item, hw, algorithms=forced_algorithms(row))
    else:  # point-to-point: NCCL's model is the ring model's
        modelled, algorithm = predicted, "point-to-point"
    return {
        "nccl_s": modelled,
        "nccl_ratio": modelled / measured,
        "nccl_algorithm": algorithm,
        "measured_s": measured,
        "predicted_s": predicted,
        "ratio": predicted / measured,
        "tier": tier,
        "measured_busbw": measured_busbw(row),
        "predicted_busbw": busbw_factor(row) * row["size"] / predicted / 1e9,
        "link_GBps": link.bandwidth_bytes_per_s / 1e9,
        "steps": steps,
        # What the row says of llmpar's two knobs: busbw over the link llmpar uses, and the
        # time left per ring step once llmpar's own bandwidth term is taken out.
        "implied_efficiency": measured_busbw(row) / (link.bandwidth_bytes_per_s / 1e9),
        "implied_step_latency_s": (measured - bandwidth_term) / steps,
        # Across nodes: busbw over what all of a node's NICs carry together (the group's
        # GPUs in one node, each with its NIC), the bound of a ring that crosses the network
        # only between nodes.
        "node_network_efficiency": (
            measured_busbw(row) / (min(row["gpus"], hw.gpus_per_node)
                                   * hw.inter_node_bandwidth_bytes_per_s / 1e9)
            if tier == "inter-node" else None),
    }


def expected(row: dict) -> tuple[float, float] | None:
    """The documented range of predicted / measured for a row llmpar is known to miss."""
    bounds = row.get("expected_ratio")
    return None if bounds is None else (bounds[0], bounds[1])


def is_large(row: dict) -> bool:
    return row["size"] >= LARGE_BYTES


def is_small(row: dict) -> bool:
    return row["size"] <= SMALL_BYTES


def algorithm_class(row: dict) -> str:
    name = row.get("algorithm", "").lower()
    if "nvls" in name or "tree" in name:
        return "NVLS/tree"
    if "ring" in name:
        return "ring"
    if "point" in name:
        return "point-to-point"
    return "default (unstated)"


def _size(value: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


def _us(seconds: float) -> str:
    value = seconds * 1e6
    return f"{value:,.1f}" if value < 1e4 else f"{value:,.0f}"


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (n={len(values)})" if values else "-"


def main() -> int:
    print("# Predicted against measured NCCL collectives\n")
    print("Generated by `python validation/collective_bandwidth.py` with llmpar "
          f"{importlib.metadata.version('llmpar')} from the published rows in "
          "`validation/published/collectives/` (each file cites its source; the numbers are "
          "copied from it, and the file's comments say what the source states and what is "
          "assumed). The same rows are a test: `tests/test_collectives_measured.py`.\n")
    print("For each row llmpar costs the collective the benchmark ran: the operation on a "
          "buffer of the benchmark's `size` (nccl-tests' `size` is llmpar's `buffer_bytes`: "
          "the all-reduced buffer, the whole all-gathered or reduce-scattered array), over a "
          "group of all the benchmark's GPUs at stride 1, on the row's cluster preset, with "
          "`llmpar.communication.collectives.call_seconds`: traffic per GPU / (link "
          "bandwidth x `collective_efficiency`) + steps x link latency, a ring (Thakur et al. "
          "2005). The presets' `collective_efficiency` (0.8) and latencies (2 us NVLink, "
          "5 us network, per ring step) are assumptions; these rows test them.\n")
    print("*predicted / measured* above 1: llmpar is slower than the hardware (pessimistic); "
          "below 1: optimistic. At large messages (>= 64 MiB) the time is bandwidth, so the "
          "ratio checks `collective_efficiency` and the link llmpar picks; at small messages "
          "(<= 64 KiB) it is latency, so the ratio checks the per-step latencies. Busbw "
          "follows nccl-tests (doc/PERFORMANCE.md); *predicted busbw* is the busbw llmpar's "
          "time implies. Rows marked † are discrepancies the data file documents (with its "
          "reason, printed under the table): the test pins them to a stated range instead "
          "of the tolerance.\n")
    print("The last three columns price the same row with NCCL's own tuning model "
          "(`[hardware] collective_algorithms = \"nccl\"`, `llmpar.communication.nccl`, "
          "NCCL v2.30.7 src/graph/tuning.cc): the least time over the algorithms and protocols "
          "NCCL considers, on the same links, with NCCL's latencies and bandwidth factors, and "
          "the one it chose. Where the benchmark forced one algorithm (NCCL_ALGO=RING, or a "
          "report's column per algorithm) only that one competes. NCCL's model prices the "
          "kernel: it leaves out the harness (one process driving 8 GPUs, PyTorch) and a "
          "network's latency beyond InfiniBand's (its IB plugin reports none; AWS EFA's is "
          "larger), which shows at small messages. The test of these columns is "
          "`tests/test_nccl_model.py`.\n")

    groups: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for path, data in sources():
        print(f"## {data['title']}\n")
        print(f"Source: {data['citation']} (data: `validation/published/collectives/"
              f"{path.name}`).\n")
        notes: dict[str, str] = {}
        for sweep in data["sweeps"]:
            for reason in [sweep.get("expected_reason")] + [
                    r.get("expected_reason") for r in sweep["rows"]]:
                if reason and reason not in notes:
                    notes[reason] = f"†{len(notes) + 1}"
        print("| system | op | GPUs | nodes | NCCL | algorithm | size | measured us | "
              "predicted us | predicted / measured | busbw GB/s | predicted busbw | tier | "
              "NCCL model us | NCCL model / measured | NCCL model's choice |")
        print("|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
        for row in rows(data):
            result = compare(row)
            mark = f" {notes[row['expected_reason']]}" if "expected_reason" in row else ""
            derived = "" if "time_us" in row else "*"
            print(f"| {row['system']} | {row['operation']} | {row['gpus']} | {row['nodes']} | "
                  f"{row['nccl']} | {row['algorithm']} | {_size(row['size'])} | "
                  f"{_us(result['measured_s'])}{derived} | {_us(result['predicted_s'])} | "
                  f"{result['ratio']:.2f}{mark} | {result['measured_busbw']:.2f} | "
                  f"{result['predicted_busbw']:.2f} | {result['tier']} | "
                  f"{_us(result['nccl_s'])} | {result['nccl_ratio']:.2f} | "
                  f"{result['nccl_algorithm']} |")
            scope = "1 node" if row["nodes"] == 1 else "multi-node"
            groups[(row["system"], scope, row["operation"], algorithm_class(row))].append(
                (row, result))
        print()
        harnesses = sorted({s["harness"] for s in data["sweeps"]})
        print(f"Harness: {'; '.join(harnesses)}.", end="")
        if any("time_us" not in r for r in rows(data)):
            print(" *: the source prints no time; it is derived from its bandwidth "
                  "(the data file says how).", end="")
        print("\n")
        for reason, mark in notes.items():
            print(f"{mark}: {reason}\n")

    print("## Summary per system\n")
    print("Median predicted / measured over the rows at large (>= 64 MiB) and small "
          "(<= 64 KiB) messages. *Implied efficiency*: median measured busbw / the link "
          "bandwidth llmpar uses for the row (what `collective_efficiency` would have to be "
          "for the large rows to match). *Implied step latency*: median over the small rows of "
          "(measured time - llmpar's bandwidth term) / ring steps (what the tier's latency "
          "would have to be). *busbw / node's NICs* (rows across nodes): median measured busbw "
          "/ (the group's GPUs per node x one GPU's network bandwidth), the bound of a ring "
          "that crosses the network only between nodes.\n")
    print("How to read it. Inside a node, with the ring algorithm, the bandwidth side of "
          "llmpar's model holds: the large-message ratios sit near 1 and the implied "
          "efficiency near the 0.8 assumed. NCCL's default all-reduce on these NVSwitch "
          "systems (NVLink SHARP, NVLS) is not a ring and reaches a higher busbw, so llmpar "
          "is pessimistic there. Across nodes a ring collective runs one ring per NIC, so a "
          "group with k GPUs in each node has k NICs to share its traffic: llmpar's "
          "inter-node link is k x one GPU's network bandwidth, at most the NVLink figure "
          "(`llmpar.communication.collectives.link_of`; the column *busbw / node's NICs* is "
          "the measured busbw over that bound). With it the multi-node ring rows are within "
          "25%; on 2 nodes NCCL may pick a tree (NVIDIA/nccl-tests issue #196), which goes "
          "above the node's NICs, and llmpar stays pessimistic there. A group at stride >= "
          "GPUs per node (one GPU per node) has one NIC per GPU; no "
"row here measures one. At small messages NCCL chooses among algorithms and "
          "protocols (the H200 source names Ring with the LL protocol below 2 MiB) and the "
          "time depends on the harness (one process per GPU, one process driving 8 GPUs, "
          "or PyTorch), so the implied per-step latencies are orders of magnitude, not "
          "fits.\n")

    print("| system | scope | op | algorithm | large: predicted / measured | implied efficiency "
          "| link GB/s | large: busbw / node's NICs | small: predicted / measured "
          "| implied step latency us | large: NCCL model / measured "
          "| small: NCCL model / measured |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (system, scope, operation, algo), items in groups.items():
        large = [r for row, r in items if is_large(row)]
        small = [r for row, r in items if is_small(row)]
        link = sorted({r["link_GBps"] for _, r in items})
        latency = ([f"{statistics.median([r['implied_step_latency_s'] for r in small]) * 1e6:.2f}"]
                   if small else ["-"])
        efficiency = (f"{statistics.median([r['implied_efficiency'] for r in large]):.2f}"
                      if large else "-")
        node = [r["node_network_efficiency"] for r in large
                if r["node_network_efficiency"] is not None]
        node_efficiency = f"{statistics.median(node):.2f}" if node else "-"
        print(f"| {system} | {scope} | {operation} | {algo} | "
              f"{_median([r['ratio'] for r in large])} | "
              f"{efficiency} | {', '.join(f'{v:g}' for v in link)} | {node_efficiency} | "
              f"{_median([r['ratio'] for r in small])} | {latency[0]} | "
              f"{_median([r['nccl_ratio'] for r in large])} | "
              f"{_median([r['nccl_ratio'] for r in small])} |")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
