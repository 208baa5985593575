#!/usr/bin/python3
"""The engine scenarios of DESIGN.md section 6 in PyTorch, timed as bench/engine_bench.cc
times gradserve's: backward only (torch.autograd.grad's call to its return), median of the
timed repetitions, each on a freshly recorded graph. Prints one JSON object per line.

Run with Debian's PyTorch: /usr/bin/python3 bench/torch_engine.py --scenario all --threads 1
--memory runs the scenario once in this fresh process and reports its peak RSS (maxrss).
On a GPU: python3 bench/torch_engine.py --device cuda --scenario chain_10k,fanin_2k,mlp,mlp_big
(the clock then waits for the GPU before it starts and before it stops).
"""

import argparse
import json
import resource
import statistics
import sys
import time

import torch


DEVICE = torch.device("cpu")


def values(shape, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1) * scale).to(DEVICE)


def chain_10k():
    x = torch.tensor([0.5], dtype=torch.float32, device=DEVICE, requires_grad=True)
    y = x
    for _ in range(10_000):
        y = torch.tanh(y * 1.0001)
    return y.sum(), [x]


def fanin_2k():
    x = values([16], 1, 3).requires_grad_()
    acc = x * 0
    for i in range(2000):
        acc = acc + torch.sin(x * (1 + i * 1e-3))
    return acc.sum(), [x]


def mlp(batch=256, width=1024, dtype=torch.float32):
    h = values([batch, width], 1, 4).to(dtype)
    weights = []
    for layer in range(4):
        w = values([width, width], 1 / width**0.5, 10 + layer).to(dtype).requires_grad_()
        weights.append(w)
        h = torch.relu(h @ w)
    return h.sum(), weights


SCENARIOS = {"chain_10k": chain_10k, "fanin_2k": fanin_2k, "mlp": mlp,
             "mlp_big": lambda: mlp(4096, 4096),
             "mlp_big_bf16": lambda: mlp(4096, 4096, torch.bfloat16)}


def synchronize():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_backward(build):
    loss, inputs = build()
    synchronize()
    start = time.perf_counter()
    torch.autograd.grad([loss], inputs)
    synchronize()
    end = time.perf_counter()
    del loss, inputs  # torn down after the clock stops
    return (end - start) * 1e3


def resident_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="all",
                        help="comma-separated names of " + ", ".join(SCENARIOS) +
                        ", or all (the first three)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda":
        # Match engine_bench: exact float32 products, no TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
    names = []
    for name in args.scenario.split(","):
        if name == "all":
            names += ["chain_10k", "fanin_2k", "mlp"]
        elif name in SCENARIOS:
            names.append(name)
        else:
            parser.error(f"unknown scenario {name}")
    for name in names:
        build = SCENARIOS[name]
        if args.memory:
            before = resident_kb()
            loss, inputs = build()
            torch.autograd.grad([loss], inputs)
            del loss, inputs
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(json.dumps({"impl": "pytorch", "scenario": name, "threads": args.threads,
                              "maxrss_kb": maxrss, "rss_before_kb": before}))
            continue
        for _ in range(args.warmup):
            time_backward(build)
        times = [time_backward(build) for _ in range(args.repeats)]
        print(json.dumps({"impl": "pytorch", "scenario": name, "device": str(DEVICE),
                          "threads": args.threads, "median_ms": round(statistics.median(times), 4),
                          "times_ms": [round(t, 4) for t in times]}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
