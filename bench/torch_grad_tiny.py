#!/usr/bin/python3
"""grad_tiny in PyTorch, in process: what a PyTorch user pays to compute what one grad_tiny
request asks of gradserve (client/load/scenarios.cc: the same ten ops on the same eight float32
values, and the gradient of the sum with respect to x).

Each iteration records the forward pass and runs torch.autograd.grad, as a request does. Run it
under callgrind at two counts and divide the difference by the difference of the counts: that
is PyTorch's instructions per iteration, the start-up cancelled out (docs/benchmarks.md, "grad_tiny
against ping in server instructions"). With --print, prints the gradient once and exits.

Run with Debian's PyTorch: /usr/bin/python3 bench/torch_grad_tiny.py --iterations 1000
"""

import argparse

import torch


def deterministic_values(n, scale, seed):
    """client/load/scenarios.cc's DeterministicValues: n floats in [-scale, scale)."""
    mask = (1 << 64) - 1
    a, c = 6364136223846793005, 1442695040888963407
    state = (seed * a + c) & mask
    values = []
    for _ in range(n):
        state = (state * a + c) & mask
        unit = (state >> 11) * 2.0**-53
        values.append((2 * unit - 1) * scale)
    return torch.tensor(values, dtype=torch.float32)


def grad_tiny(x_values, w):
    x = x_values.detach().requires_grad_(True)
    a = x * w
    b = torch.tanh(a)
    c = b + x
    d = torch.sin(c)
    e = d * w
    f = torch.sigmoid(e)
    g = f - x
    h = torch.exp(g)
    i = torch.relu(h)
    loss = i.sum()
    (dx,) = torch.autograd.grad([loss], [x])
    return dx


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--print", action="store_true", help="print the gradient once and exit")
    args = parser.parse_args()
    if args.iterations < 0:
        parser.error("--iterations must be at least 0")
    torch.set_num_threads(1)
    x_values = deterministic_values(8, 1.0, 1)
    w = deterministic_values(8, 1.0, 2)
    if args.print:
        print(" ".join(f"{v:.9g}" for v in grad_tiny(x_values, w).tolist()))
        return
    for _ in range(args.iterations):
        grad_tiny(x_values, w)


if __name__ == "__main__":
    main()
