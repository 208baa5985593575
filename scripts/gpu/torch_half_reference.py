#!/usr/bin/env python3
"""PyTorch CUDA's values and gradients for the MLP of tests/engine/half_precision_test.cc, in
float16 and bfloat16, for CudaHalfTest.MlpMatchesPyTorchCuda to compare gradserve's with.

The leaves are the test's (its Leaf(): the same 32-bit linear congruential sequence, in
[-1, 1), rounded to the dtype); the graph is its Mlp(): h = linear(x, w) + b (broadcast),
relu_ in place, t = tanh(h), loss = sum(t * (t + h)). Writes, for float16 then bfloat16, the loss
and the gradients of x [4, 8], w [6, 8] and b [1, 6], as little-endian float32, to FILE.
Runs on the GPU machine (scripts/gpu/check), with its own PyTorch.

Usage: scripts/gpu/torch_half_reference.py FILE
"""

import sys

import numpy as np
import torch


def leaf(shape, seed, dtype):
    """The test's Leaf(shape, seed, dtype), on the GPU, requiring grad."""
    n = int(np.prod(shape))
    state = (2654435761 * (seed + 1)) % 2**32
    values = np.empty(n, np.float32)
    for i in range(n):
        state = (state * 1664525 + 1013904223) % 2**32
        values[i] = np.float32(state >> 8) / np.float32(1 << 23) - np.float32(1)
    t = torch.from_numpy(values.reshape(shape)).to(dtype).cuda()
    return t.requires_grad_()


def mlp(dtype):
    x, w, b = leaf((4, 8), 1, dtype), leaf((6, 8), 2, dtype), leaf((1, 6), 3, dtype)
    h = torch.nn.functional.linear(x, w) + b.expand(4, 6)
    h = torch.relu_(h)
    t = torch.tanh(h)
    loss = (t * (t + h)).sum()
    grads = torch.autograd.grad(loss, [x, w, b])
    return [loss] + list(grads)


def main(path):
    torch.backends.cuda.matmul.allow_tf32 = False
    parts = []
    for dtype in (torch.float16, torch.bfloat16):
        for t in mlp(dtype):
            parts.append(t.detach().float().cpu().numpy().reshape(-1))
    np.concatenate(parts).astype("<f4").tofile(path)
    print(f"wrote {path}: PyTorch {torch.__version__} on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main(sys.argv[1])
