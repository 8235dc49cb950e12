"""Checks llmpar's queueing closed form for TTFT under a request rate by simulation.

llmpar.inference.continuous treats each replica's prefill budget as an M/D/1 queue
(Poisson arrivals at rate lambda, a deterministic service S per prompt): the mean wait is
Pollaczek-Khinchine's rho S / (2 (1 - rho)), and its percentiles come from the exponential
tail P(W > t) = rho exp(-rho t / W). This script simulates the queue by Lindley's
recursion, W_{n+1} = max(0, W_n + S - A_{n+1}) (Lindley 1952, Proc. Cambridge Phil. Soc.
48(2)), and prints the simulated mean, p90 and p99 waits beside the closed forms, in units
of S.

    python validation/queueing_md1.py [--customers 400000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random


def simulate(rho: float, customers: int, seed: int) -> list[float]:
    """Waits of `customers` arrivals at utilisation rho, service 1."""
    rng = random.Random(seed)
    wait, waits = 0.0, []
    for _ in range(customers):
        waits.append(wait)
        wait = max(0.0, wait + 1.0 - rng.expovariate(rho))
    return waits


def closed_form(rho: float) -> tuple[float, float, float]:
    """Mean, p90 and p99 waits of llmpar's closed form, service 1."""
    mean = rho / (2 * (1 - rho))

    def tail(p: float) -> float:
        miss = 1 - p
        return 0.0 if rho <= miss else mean / rho * math.log(rho / miss)

    return mean, tail(0.90), tail(0.99)


def quantile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("| rho | mean (sim) | mean (P-K) | p90 (sim) | p90 (closed) | p99 (sim) | p99 (closed) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rho in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95):
        waits = simulate(rho, args.customers, args.seed)[args.customers // 10:]
        mean, p90, p99 = closed_form(rho)
        print(f"| {rho} | {sum(waits) / len(waits):.3f} | {mean:.3f} | "
              f"{quantile(waits, 0.90):.3f} | {p90:.3f} | {quantile(waits, 0.99):.3f} | "
              f"{p99:.3f} |")


if __name__ == "__main__":
    main()
