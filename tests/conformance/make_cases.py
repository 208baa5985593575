"""Writes the conformance cases (*.json here) with PyTorch's values as the expectations.

    /usr/bin/python3 tests/conformance/make_cases.py

Each case is a GradRequest in protobuf JSON ("request") and what the server must answer
("expect"): for "code": "OK", the gradients of each call by input name ({"shape", "values"}
row-major, or null for an input the roots do not reach) and the returned values, within
"tolerance" (relative, plus the same absolute); otherwise the gRPC status code name and
strings its message must contain. README.md says how each client runs them. Rerun this after
changing a case; the outputs are committed so that no client needs PyTorch to check itself.
"""

import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def tensor(values, dtype="DTYPE_FLOAT64", shape=None):
    t = torch.as_tensor(values)
    shape = list(t.shape) if shape is None else shape
    flat = t.flatten().tolist()
    key = {"DTYPE_INT64": "ints", "DTYPE_BOOL": "bools"}.get(dtype, "doubles")
    return {"dtype": dtype, "shape": [str(s) for s in shape], "values": {key: flat}}


def leaf(name, values, requires_grad=False, dtype="DTYPE_FLOAT64"):
    return {"name": name, "value": tensor(values, dtype), "requiresGrad": requires_grad}


def op(name, inputs, out, **attrs):
    def attr(v):
        if isinstance(v, bool):
            return {"b": v}
        if isinstance(v, int):
            return {"i": str(v)}
        if isinstance(v, float):
            return {"f": v}
        if isinstance(v, str):
            return {"s": v}
        return {"ints": {"values": [str(i) for i in v]}}
    m = {"op": name, "inputs": inputs, "outputs": [out]}
    if attrs:
        m["attrs"] = {k: attr(v) for k, v in attrs.items()}
    return m


def expected(t):
    if t is None:
        return None
    return {"shape": list(t.shape), "values": t.detach().flatten().tolist()}


def write(name, description, request, expect):
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"description": description, "request": request, "expect": expect}, f,
                  indent=1)
        f.write("\n")


def main():
    torch.manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    h = torch.tanh(x @ w + b)
    loss = (h * h).mean()
    gw, gb = torch.autograd.grad(loss, [w, b])
    write("ok_layer_float64", "loss = mean(tanh(x W + b)^2): grad semantics, a returned value",
          {"requestId": "conformance", "graph": {
              "leaves": [leaf("x", x), leaf("W", w.detach(), True), leaf("b", b.detach(), True)],
              "ops": [op("matmul", ["x", "W"], "xw"), op("add", ["xw", "b"], "pre"),
                      op("tanh", ["pre"], "h"), op("mul", ["h", "h"], "sq"),
                      op("mean", ["sq"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["W", "b"]}], "returnValues": ["loss"]},
          {"code": "OK", "tolerance": 1e-10, "calls": [{"W": expected(gw), "b": expected(gb)}],
           "values": {"loss": expected(loss)}})

    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float32, requires_grad=True)
    s = torch.exp(a).sum(dim=1)
    (ga,) = torch.autograd.grad(s, [a], grad_outputs=torch.tensor([1.0, 2.0]))
    write("ok_float32_seed_unused", "float32, a seed for a non-scalar root, an unused input "
          "with allow_unused (null: not connected)",
          {"graph": {"leaves": [leaf("a", a.detach(), True, "DTYPE_FLOAT32"),
                                leaf("u", [5.0], True, "DTYPE_FLOAT32")],
                     "ops": [op("exp", ["a"], "e"), op("sum", ["e"], "s", dim=[1])]},
           "calls": [{"roots": ["s"], "seeds": {"s": tensor([1.0, 2.0], "DTYPE_FLOAT32")},
                      "inputs": ["a", "u"], "allowUnused": True}]},
          {"code": "OK", "tolerance": 1e-5, "calls": [{"a": expected(ga), "u": None}]})

    v = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64, requires_grad=True)
    out = (torch.sin(v) * v).sum()
    out.backward(retain_graph=True)
    first = v.grad.clone()
    out.backward()
    write("ok_backward_accumulates", "backward() semantics twice through a retained graph: "
          ".grad sums across calls",
          {"graph": {"leaves": [leaf("v", v.detach(), True)],
                     "ops": [op("sin", ["v"], "s"), op("mul", ["s", "v"], "p"),
                             op("sum", ["p"], "out")]},
           "calls": [{"roots": ["out"], "accumulateGrad": True, "retainGraph": True},
                     {"roots": ["out"], "accumulateGrad": True}]},
          {"code": "OK", "tolerance": 1e-12,
           "calls": [{"v": expected(first)}, {"v": expected(v.grad)}]})

    # bfloat16 times float16 promotes to float32; each gradient comes back in its leaf's dtype.
    # The values are exact in both 16-bit types.
    x16 = torch.tensor([[0.5, -1.25, 2.0], [0.75, 1.5, -0.375]], dtype=torch.bfloat16,
                       requires_grad=True)
    w16 = torch.tensor([1.5, -0.5, 0.25], dtype=torch.float16, requires_grad=True)
    p16 = torch.tanh(x16 * w16).sum()
    gx16, gw16 = torch.autograd.grad(p16, [x16, w16])
    write("ok_mixed_16bit", "a bfloat16 and a float16 leaf: their product promotes to float32, "
          "each gradient comes back in its leaf's dtype",
          {"graph": {"leaves": [leaf("x", x16.detach().float(), True, "DTYPE_BFLOAT16"),
                                leaf("w", w16.detach().float(), True, "DTYPE_FLOAT16")],
                     "ops": [op("mul", ["x", "w"], "p"), op("tanh", ["p"], "t"),
                             op("sum", ["t"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["x", "w"]}], "returnValues": ["loss"]},
          {"code": "OK", "tolerance": 1e-2,
           "calls": [{"x": expected(gx16.float()), "w": expected(gw16.float())}],
           "values": {"loss": expected(p16)}})

    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, 0, 3])
    ce = torch.nn.functional.cross_entropy(logits, target)
    (gl,) = torch.autograd.grad(ce, [logits])
    write("ok_cross_entropy_int64", "cross_entropy with an int64 target",
          {"graph": {"leaves": [leaf("logits", logits.detach(), True),
                                leaf("target", target, False, "DTYPE_INT64")],
                     "ops": [op("cross_entropy", ["logits", "target"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["logits"]}], "returnValues": ["loss"]},
          {"code": "OK", "tolerance": 1e-10, "calls": [{"logits": expected(gl)}],
           "values": {"loss": expected(ce)}})

    three = [leaf("x", [1.0, 2.0, 3.0], True)]
    write("invalid_argument_unknown_op", "an op the server does not know",
          {"graph": {"leaves": three, "ops": [op("frobnicate", ["x"], "y")]},
           "calls": [{"roots": ["y"], "inputs": ["x"]}]},
          {"code": "INVALID_ARGUMENT", "message_contains": ["frobnicate"]})
    write("invalid_argument_broadcast", "shapes that do not broadcast",
          {"graph": {"leaves": three + [leaf("y", [1.0, 2.0])],
                     "ops": [op("add", ["x", "y"], "z"), op("sum", ["z"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["x"]}]},
          {"code": "INVALID_ARGUMENT", "message_contains": ["add", "[3]", "[2]"]})
    write("invalid_argument_anomaly_nan", "detect_anomaly names the node that made NaN",
          {"graph": {"leaves": [leaf("x", [-1.0], True)],
                     "ops": [op("sqrt", ["x"], "s"), op("sum", ["s"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["x"], "detectAnomaly": True}]},
          {"code": "INVALID_ARGUMENT", "message_contains": ["SqrtBackward0", "NaN"]})
    write("failed_precondition_freed", "a second backward through freed saved tensors",
          {"graph": {"leaves": three, "ops": [op("exp", ["x"], "e"), op("sum", ["e"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["x"]}, {"roots": ["loss"], "inputs": ["x"]}]},
          {"code": "FAILED_PRECONDITION", "message_contains": ["ExpBackward0", "second time"]})
    write("resource_exhausted_backward_calls", "more backward calls than the default limit (64)",
          {"graph": {"leaves": three, "ops": [op("sum", ["x"], "loss")]},
           "calls": [{"roots": ["loss"], "inputs": ["x"], "retainGraph": True}] * 65},
          {"code": "RESOURCE_EXHAUSTED", "message_contains": ["max_backward_calls"]})


if __name__ == "__main__":
    main()
