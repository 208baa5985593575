#!/usr/bin/env python3
"""Prints the table of scripts/gpu/check: for each engine scenario on the GPU, gradserve's and
PyTorch's median backward times per round (engine_bench and torch_engine.py JSON lines, in the
order the rounds ran), the ratio of the round with the median ratio, the range of the ratios,
and whether the target (at most 1.1 x PyTorch CUDA) is met.

Usage: bench/gpu_table.py gpu_bench.jsonl
"""

import json
import statistics
import sys

TARGET = 1.1


def main(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            rows.setdefault(r["scenario"], {}).setdefault(r["impl"], []).append(r["median_ms"])
    print(f"| scenario (GPU) | gradserve ms | PyTorch ms | ratio | range | target | met |")
    print("|---|---|---|---|---|---|---|")
    for scenario, by_impl in rows.items():
        ours, theirs = by_impl.get("gradserve", []), by_impl.get("pytorch", [])
        pairs = list(zip(ours, theirs))
        if not pairs:
            continue
        ratios = [a / b for a, b in pairs]
        mid = sorted(range(len(ratios)), key=lambda i: ratios[i])[len(ratios) // 2]
        a, b = pairs[mid]
        met = "yes" if ratios[mid] <= TARGET else "NO"
        print(f"| {scenario} | {a:.3f} | {b:.3f} | {ratios[mid]:.3f} | "
              f"{min(ratios):.3f}-{max(ratios):.3f} | <= {TARGET} | {met} |")


if __name__ == "__main__":
    main(sys.argv[1])
