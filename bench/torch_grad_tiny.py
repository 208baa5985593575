#!/usr/bin/python3
"""grad_tiny in PyTorch, in process, and as a request of any length: what a PyTorch user pays
to compute what one grad_tiny request asks of gradserve, and how a request's cost grows with
its ops.

grad_tiny (client/load/scenarios.cc) is nine elementwise ops on eight float32 values x and w,
then a sum, and the gradient of the sum with respect to x. --ops K takes the first K of those
nine ops, cycled (K = 9, the default, is grad_tiny; K = 0 is the sum of x alone), on the same
values (the load tool's DeterministicValues).

Modes:
  --iterations N   records the forward pass and runs torch.autograd.grad N times, as N
                   requests do: run under callgrind at two counts, the difference divided by
                   the difference of the counts is PyTorch's instructions per iteration
  --print          prints the gradient once
  --request        prints the graph as a GradRequest in protobuf JSON (the values as raw
                   float32 bytes, as the load tool sends them), for `gradserve load
                   --request_file` and `gradserve grad`
docs/benchmarks.md, "grad_tiny against ping in server instructions", has the commands.

Run with Debian's PyTorch: /usr/bin/python3 bench/torch_grad_tiny.py --iterations 1000
"""

import argparse
import base64
import json

import torch

# grad_tiny's elementwise ops in order: the op, and its inputs ("prev" is the op before's
# output, x for the first).
GRAD_TINY_OPS = [("mul", ["prev", "w"]), ("tanh", ["prev"]), ("add", ["prev", "x"]),
                 ("sin", ["prev"]), ("mul", ["prev", "w"]), ("sigmoid", ["prev"]),
                 ("sub", ["prev", "x"]), ("exp", ["prev"]), ("relu", ["prev"])]
# How a user writes each op, in the straight-line code gradient() compiles.
TORCH_SYNTAX = {"mul": "{} * {}", "add": "{} + {}", "sub": "{} - {}", "tanh": "torch.tanh({})",
                "sin": "torch.sin({})", "sigmoid": "torch.sigmoid({})", "exp": "torch.exp({})",
                "relu": "torch.relu({})"}


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


def chain(num_ops):
    """The first num_ops of grad_tiny's ops, cycled: (op, inputs, output name) each. The
    outputs are named a to i, as grad_tiny's are, then t9, t10, ..."""
    ops = []
    prev = "x"
    for k in range(num_ops):
        op, inputs = GRAD_TINY_OPS[k % len(GRAD_TINY_OPS)]
        out = chr(ord("a") + k) if k < len(GRAD_TINY_OPS) else f"t{k}"
        ops.append((op, [prev if name == "prev" else name for name in inputs], out))
        prev = out
    return ops, prev


def gradient_function(num_ops):
    """The chain as straight-line PyTorch code, as a user would write it (a loop over the ops
    would add the interpreter's work for the loop to PyTorch's count): a function of the values
    of x and of w that records the forward pass and returns the gradient of its sum with
    respect to x."""
    ops, last = chain(num_ops)
    lines = ["def gradient(x_values, w):", "    x = x_values.detach().requires_grad_(True)"]
    lines += [f"    {out} = " + TORCH_SYNTAX[op].format(*inputs) for op, inputs, out in ops]
    lines += [f"    (dx,) = torch.autograd.grad([{last}.sum()], [x])", "    return dx"]
    scope = {"torch": torch}
    exec(compile("\n".join(lines), f"<chain of {num_ops} ops>", "exec"), scope)
    return scope["gradient"]


def request(num_ops, x_values, w):
    """The chain as a GradRequest in protobuf JSON."""
    def leaf(name, values, requires_grad):
        data = base64.b64encode(values.numpy().astype("<f4").tobytes()).decode()
        return {"name": name, "requires_grad": requires_grad,
                "value": {"dtype": "DTYPE_FLOAT32", "shape": [len(values)], "data": data}}
    ops, last = chain(num_ops)
    return {"request_id": "grad_tiny" if num_ops == len(GRAD_TINY_OPS) else f"chain_{num_ops}",
            "graph": {"leaves": [leaf("x", x_values, True), leaf("w", w, False)],
                      "ops": [{"op": op, "inputs": inputs, "outputs": [out]}
                              for op, inputs, out in ops]
                      + [{"op": "sum", "inputs": [last], "outputs": ["loss"]}]},
            "calls": [{"roots": ["loss"], "inputs": ["x"]}]}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=len(GRAD_TINY_OPS),
                        help="elementwise ops before the sum (default 9: grad_tiny)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--iterations", type=int, default=1000)
    mode.add_argument("--print", action="store_true", help="print the gradient once")
    mode.add_argument("--request", action="store_true", help="print the GradRequest JSON")
    args = parser.parse_args()
    if not 0 <= args.ops <= 1000:
        parser.error("--ops must be from 0 to 1000")
    if args.iterations < 0:
        parser.error("--iterations must be at least 0")
    torch.set_num_threads(1)
    x_values = deterministic_values(8, 1.0, 1)
    w = deterministic_values(8, 1.0, 2)
    gradient = gradient_function(args.ops)
    if args.print:
        print(" ".join(f"{v:.9g}" for v in gradient(x_values, w).tolist()))
    elif args.request:
        print(json.dumps(request(args.ops, x_values, w), indent=1))
    else:
        for _ in range(args.iterations):
            gradient(x_values, w)


if __name__ == "__main__":
    main()
