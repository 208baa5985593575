"""The PyTorch bridge: an nn.Module or a function, traced with torch.fx, as a gradserve graph.

    import torch
    import gradserve
    import gradserve.torch

    traced = gradserve.torch.to_graph(model_with_loss, (x, target))   # parameters are leaves
    with gradserve.Client("gpu-server:50051", timeout=60) as client:
        result = client.grad(traced.request())        # d(output)/d(every parameter)
    for name, grad in traced.gradients(result).items():
        model_with_loss.get_parameter(name).grad = grad  # torch tensors, as loss.backward() gives

to_graph runs the module once on example_inputs (torch.fx.symbolic_trace, then ShapeProp for
every value's shape and dtype) and writes each traced node as gradserve ops: placeholders and
parameters and buffers become leaves (with their current values; parameters that require grad
require grad), and nn modules (Linear, Conv2d, LayerNorm, Embedding, activations, Softmax,
Flatten, Dropout in eval mode, the losses), torch functions, Tensor methods and Python
operators become PyTorch's ops of the same names (SUPPORTED lists them). Reshapes take their
static shape from the trace, so the graph is for inputs of the example's shapes.

Errors: UnsupportedError (a ValueError) naming the node, its target and what is supported, for
anything else (data-dependent control flow fails in torch.fx itself). Needs Debian's
python3-torch; importing this module without torch raises ImportError saying so.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

try:
    import torch
    import torch.fx
    import torch.nn.functional as F
    from torch import nn
    from torch.fx.passes.shape_prop import ShapeProp
except ImportError as e:  # pragma: no cover
    raise ImportError("gradserve.torch needs PyTorch (apt-get install python3-torch)") from e

from gradserve.client import GradResult
from gradserve.graph import GraphBuilder
from gradserve.tensors import BFLOAT16, from_bfloat16, to_bfloat16


class UnsupportedError(ValueError):
    """A traced node that has no gradserve equivalent; the message names the node and target."""


def _is_tensor_node(arg: Any) -> bool:
    return isinstance(arg, torch.fx.Node)


class TracedGraph:
    """What to_graph made: builder (a GraphBuilder with the leaves and ops), outputs (the value
    names of the function's outputs, in order), parameters (qualified parameter name -> leaf
    name, for those that require grad), inputs (placeholder name -> leaf name)."""

    def __init__(self, builder: GraphBuilder, outputs: List[str], parameters: Dict[str, str],
                 inputs: Dict[str, str], requires_grad_inputs: List[str]) -> None:
        self.builder = builder
        self.outputs = outputs
        self.parameters = parameters
        self.inputs = inputs
        self._requires_grad_inputs = requires_grad_inputs

    def request(self, output: Optional[str] = None, wrt: Optional[Sequence[str]] = None,
                **call_options: Any) -> GraphBuilder:
        """The builder with one backward call appended: from output (default: the only output,
        which must have one element) with respect to wrt (leaf names; default: every parameter
        that requires grad, then every input that does). call_options: backward_call's."""
        if output is None:
            if len(self.outputs) != 1:
                raise ValueError(f"the traced function has {len(self.outputs)} outputs; name one")
            output = self.outputs[0]
        if wrt is None:
            wrt = list(self.parameters.values()) + self._requires_grad_inputs
        return self.builder.backward_call(output, inputs=list(wrt), **call_options)

    def gradients(self, result: GradResult, call: int = 0) -> Dict[str, Optional[torch.Tensor]]:
        """The gradients of backward call `call` of a GradResult, as torch tensors by qualified
        parameter name (and placeholder name for inputs); None where not connected."""
        by_leaf = result.calls[call].gradients
        out: Dict[str, Optional[torch.Tensor]] = {}
        for name, leaf in list(self.parameters.items()) + list(self.inputs.items()):
            if leaf in by_leaf:
                g = by_leaf[leaf]
                out[name] = None if g is None else _to_torch(g)
        return out


def _to_numpy(t: torch.Tensor) -> Any:
    """A tensor's values as the array the client sends: bfloat16 as BFLOAT16 (exact)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return to_bfloat16(t.float().numpy())
    return t.numpy()


def _to_torch(a: Any) -> torch.Tensor:
    """An array from the server as a tensor: BFLOAT16 as torch.bfloat16 (exact)."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(from_bfloat16(a)).to(torch.bfloat16)
    return torch.from_numpy(a)


# Elementwise ops with one tensor input, by the callables that mean them.
_UNARY = {
    "relu": [torch.relu, F.relu, nn.ReLU],
    "tanh": [torch.tanh, nn.Tanh],
    "sigmoid": [torch.sigmoid, nn.Sigmoid],
    "exp": [torch.exp], "log": [torch.log], "sqrt": [torch.sqrt], "rsqrt": [torch.rsqrt],
    "abs": [torch.abs, operator.abs], "sin": [torch.sin], "cos": [torch.cos],
    "neg": [torch.neg, operator.neg],
}
_BINARY = {
    "add": [operator.add, torch.add, operator.iadd],
    "sub": [operator.sub, torch.sub, operator.isub],
    "mul": [operator.mul, torch.mul, operator.imul],
    "div": [operator.truediv, torch.div, torch.true_divide],
    "matmul": [operator.matmul, torch.matmul, torch.mm, torch.bmm],
    "pow": [operator.pow, torch.pow],
}
_METHODS_UNARY = {"relu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "neg"}
_METHODS_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "matmul": "matmul",
                   "pow": "pow", "__add__": "add", "__mul__": "mul"}

SUPPORTED = sorted(set(_UNARY) | set(_BINARY) | {
    "nn.Linear", "nn.Conv2d", "nn.LayerNorm", "nn.Embedding", "nn.GELU", "nn.Softplus",
    "nn.Softmax", "nn.LogSoftmax", "nn.Flatten", "nn.Dropout (eval)", "nn.Identity",
    "nn.CrossEntropyLoss", "nn.MSELoss", "F.linear", "F.conv2d", "F.layer_norm", "F.embedding",
    "F.gelu", "F.softplus", "softmax", "log_softmax", "F.cross_entropy", "F.mse_loss", "sum",
    "mean", "amax", "reshape", "view", "flatten", "transpose", "t", "permute", "unsqueeze",
    "squeeze", "cat", "stack", "clamp", "contiguous", "size/shape (static)"})


class _Writer:
    """Turns the nodes of one traced GraphModule into ops of builder."""

    def __init__(self, gm: torch.fx.GraphModule, builder: GraphBuilder) -> None:
        self.gm = gm
        self.b = builder
        self.names: Dict[torch.fx.Node, Any] = {}  # node -> value name, or a Python value
        self.leaves: Dict[str, str] = {}  # qualified name of a parameter/buffer -> leaf name
        self.parameters: Dict[str, str] = {}
        self.counter = 0

    # Values -------------------------------------------------------------------------------

    def fresh(self, node: torch.fx.Node, what: str) -> str:
        self.counter += 1
        return f"{node.name}.{what}{self.counter}"

    def leaf_for(self, qualified: str, tensor: torch.Tensor) -> str:
        if qualified not in self.leaves:
            requires = isinstance(tensor, nn.Parameter) and tensor.requires_grad
            self.b.leaf(qualified, _to_numpy(tensor), requires_grad=requires)
            self.leaves[qualified] = qualified
            if requires:
                self.parameters[qualified] = qualified
        return self.leaves[qualified]

    def value(self, arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            return self.names[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def op(self, node: torch.fx.Node, op: str, inputs: Sequence[str], out: Optional[str] = None,
           **attrs: Any) -> str:
        out = out or self.fresh(node, op)
        self.b.op(op, list(inputs), out=out, **{k: v for k, v in attrs.items() if v is not None})
        return out

    @staticmethod
    def shape(node: torch.fx.Node) -> List[int]:
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise UnsupportedError(f"gradserve.torch: {node.format_node()}: its output is not "
                                   "one tensor (no static shape)")
        return [int(s) for s in meta.shape]

    # Nodes --------------------------------------------------------------------------------

    def unsupported(self, node: torch.fx.Node, target: Any) -> UnsupportedError:
        name = getattr(target, "__name__", None) or type(target).__name__
        return UnsupportedError(
            f"gradserve.torch: node {node.name} ({node.op} {name}) has no gradserve op; "
            f"supported: {', '.join(SUPPORTED)}")

    def binary(self, node: torch.fx.Node, op: str, a: Any, b: Any) -> str:
        av, bv = self.value(a), self.value(b)
        if isinstance(av, str) and isinstance(bv, str):
            return self.op(node, op, [av, bv], out=node.name)
        if isinstance(av, str) and isinstance(bv, (int, float)):
            if op == "matmul":
                raise self.unsupported(node, node.target)
            if op == "pow":
                return self.op(node, "pow", [av], out=node.name, exponent=float(bv))
            return self.op(node, op, [av], out=node.name, other=float(bv))
        if isinstance(bv, str) and isinstance(av, (int, float)):
            if op in ("add", "mul"):
                return self.op(node, op, [bv], out=node.name, other=float(av))
            if op == "sub":  # c - x
                n = self.op(node, "neg", [bv])
                return self.op(node, "add", [n], out=node.name, other=float(av))
            if op == "div":  # c / x
                r = self.op(node, "pow", [bv], exponent=-1.0)
                return self.op(node, "mul", [r], out=node.name, other=float(av))
        raise self.unsupported(node, node.target)

    def write(self, node: torch.fx.Node) -> Any:
        t = node.target
        args, kwargs = node.args, node.kwargs
        if node.op == "get_attr":
            obj: Any = self.gm
            for part in t.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor):
                return self.leaf_for(t, obj)
            return obj
        if node.op == "call_module":
            return self.module(node, self.gm.get_submodule(t))
        if node.op == "call_method":
            return self.method(node, t, args, kwargs)
        if node.op == "call_function":
            return self.function(node, t, args, kwargs)
        raise self.unsupported(node, t)

    def module(self, node: torch.fx.Node, m: nn.Module) -> Any:
        x = self.value(node.args[0]) if node.args else None
        prefix = node.target
        if isinstance(m, nn.Linear):
            return self.linear(node, x, self.leaf_for(f"{prefix}.weight", m.weight),
                               None if m.bias is None else self.leaf_for(f"{prefix}.bias", m.bias))
        if isinstance(m, nn.Conv2d):
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise UnsupportedError(f"gradserve.torch: node {node.name}: Conv2d with padding "
                                       f"{m.padding!r}, padding_mode {m.padding_mode!r}")
            inputs = [x, self.leaf_for(f"{prefix}.weight", m.weight)]
            if m.bias is not None:
                inputs.append(self.leaf_for(f"{prefix}.bias", m.bias))
            return self.op(node, "conv2d", inputs, out=node.name, stride=list(m.stride),
                           padding=list(m.padding), dilation=list(m.dilation), groups=m.groups)
        if isinstance(m, nn.LayerNorm):
            inputs = [x]
            if m.weight is not None:
                inputs.append(self.leaf_for(f"{prefix}.weight", m.weight))
                if m.bias is not None:
                    inputs.append(self.leaf_for(f"{prefix}.bias", m.bias))
            return self.op(node, "layer_norm", inputs, out=node.name,
                           normalized_shape=list(m.normalized_shape), eps=float(m.eps))
        if isinstance(m, nn.Embedding):
            return self.op(node, "embedding", [self.leaf_for(f"{prefix}.weight", m.weight), x],
                           out=node.name, padding_idx=m.padding_idx)
        for op, callables in _UNARY.items():
            if type(m) in callables:
                return self.op(node, op, [x], out=node.name)
        if isinstance(m, nn.GELU):
            return self.op(node, "gelu", [x], out=node.name, approximate=m.approximate)
        if isinstance(m, nn.Softplus):
            return self.op(node, "softplus", [x], out=node.name, beta=float(m.beta),
                           threshold=float(m.threshold))
        if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
            op = "softmax" if isinstance(m, nn.Softmax) else "log_softmax"
            return self.op(node, op, [x], out=node.name, dim=m.dim)
        if isinstance(m, nn.Flatten):
            return self.op(node, "reshape", [x], out=node.name, shape=self.shape(node))
        if isinstance(m, nn.Identity) or (isinstance(m, nn.Dropout) and (not m.training or m.p == 0)):
            return x
        if isinstance(m, nn.CrossEntropyLoss):
            return self.cross_entropy(node, x, self.value(node.args[1]), m.reduction,
                                      m.ignore_index, m.label_smoothing, m.weight)
        if isinstance(m, nn.MSELoss):
            return self.op(node, "mse_loss", [x, self.value(node.args[1])], out=node.name,
                           reduction=m.reduction)
        raise self.unsupported(node, type(m))

    def linear(self, node: torch.fx.Node, x: str, w: str, b: Optional[str]) -> str:
        wt = self.op(node, "transpose", [w], dim0=0, dim1=1)
        if b is None:
            return self.op(node, "matmul", [x, wt], out=node.name)
        y = self.op(node, "matmul", [x, wt])
        return self.op(node, "add", [y, b], out=node.name)

    def cross_entropy(self, node: torch.fx.Node, x: str, target: str, reduction: str = "mean",
                      ignore_index: int = -100, label_smoothing: float = 0.0,
                      weight: Optional[str] = None) -> str:
        inputs = [x, target]
        if weight is not None:
            inputs.append(self.value(weight) if isinstance(weight, torch.fx.Node)
                          else self.leaf_for(f"{node.name}.weight", weight))
        return self.op(node, "cross_entropy", inputs, out=node.name, reduction=reduction,
                       ignore_index=ignore_index, label_smoothing=float(label_smoothing))

    @staticmethod
    def _dims(dim: Any) -> Optional[List[int]]:
        if dim is None:
            return None
        return [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]

    def reduction(self, node: torch.fx.Node, op: str, x: str, dim: Any = None,
                  keepdim: bool = False, dtype: Any = None) -> str:
        if dtype is not None:
            raise UnsupportedError(f"gradserve.torch: node {node.name}: {op} with a dtype")
        return self.op(node, op, [x], out=node.name, dim=self._dims(dim), keepdim=bool(keepdim))

    def common(self, node: torch.fx.Node, name: str, x: Any, rest: Tuple, kw: Dict) -> Any:
        """Ops shared by torch functions and Tensor methods, by name; None if unknown."""
        def arg(i: int, key: str, default: Any = None) -> Any:
            return rest[i] if len(rest) > i else kw.get(key, default)

        if name in ("sum", "mean", "amax"):
            return self.reduction(node, name, x, arg(0, "dim"), arg(1, "keepdim", False),
                                  kw.get("dtype"))
        if name in ("softmax", "log_softmax"):
            return self.op(node, name, [x], out=node.name, dim=int(arg(0, "dim")))
        if name in ("reshape", "view", "flatten"):
            return self.op(node, "reshape", [x], out=node.name, shape=self.shape(node))
        if name == "transpose":
            return self.op(node, "transpose", [x], out=node.name, dim0=int(arg(0, "dim0")),
                           dim1=int(arg(1, "dim1")))
        if name == "t":
            return self.op(node, "transpose", [x], out=node.name, dim0=0, dim1=1)
        if name == "permute":
            dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
            return self.op(node, "permute", [x], out=node.name,
                           dims=[int(d) for d in (dims or kw["dims"])])
        if name in ("unsqueeze", "squeeze"):
            dim = arg(0, "dim")
            return self.op(node, name, [x], out=node.name, dim=None if dim is None else int(dim))
        if name == "clamp":
            lo, hi = arg(0, "min"), arg(1, "max")
            return self.op(node, "clamp", [x], out=node.name,
                           min=None if lo is None else float(lo), max=None if hi is None else float(hi))
        if name == "contiguous":
            return x
        if name in _METHODS_UNARY:
            return self.op(node, name, [x], out=node.name)
        return None

    def method(self, node: torch.fx.Node, name: str, args: Tuple, kwargs: Dict) -> Any:
        x = self.value(args[0])
        if name in ("size", "dim") or not isinstance(x, str):
            return None  # a static size (x.size(0)), used only by reshapes, whose shape is static
        if name in _METHODS_BINARY:
            return self.binary(node, _METHODS_BINARY[name], args[0], args[1])
        rest = tuple(self.value(a) for a in args[1:])
        kw = {k: self.value(v) for k, v in kwargs.items()}
        out = self.common(node, name, x, rest, kw)
        if out is None:
            raise self.unsupported(node, name)
        return out

    def function(self, node: torch.fx.Node, fn: Any, args: Tuple, kwargs: Dict) -> Any:
        for op, callables in _BINARY.items():
            if fn in callables:
                if kwargs.get("alpha", 1) != 1:
                    raise UnsupportedError(f"gradserve.torch: node {node.name}: {op} with alpha")
                return self.binary(node, op, args[0], args[1] if len(args) > 1 else kwargs["other"])
        for op, callables in _UNARY.items():
            if fn in callables:
                return self.op(node, op, [self.value(args[0])], out=node.name)
        if fn is getattr and args[1] == "shape" or fn is operator.getitem and not isinstance(
                self.value(args[0]), str):
            # Static sizes (x.shape, x.shape[0]): only used by reshapes, whose shape is static.
            return None
        x = self.value(args[0]) if args else None
        rest = tuple(self.value(a) for a in args[1:])
        kw = {k: self.value(v) for k, v in kwargs.items()}
        if fn is F.gelu:
            return self.op(node, "gelu", [x], out=node.name, approximate=kw.get("approximate", "none"))
        if fn is F.softplus:
            return self.op(node, "softplus", [x], out=node.name, beta=float(kw.get("beta", 1)),
                           threshold=float(kw.get("threshold", 20)))
        if fn is F.linear:
            w = rest[0] if rest else kw["weight"]
            b = rest[1] if len(rest) > 1 else kw.get("bias")
            return self.linear(node, x, w, b)
        if fn is F.cross_entropy:
            return self.cross_entropy(node, x, rest[0] if rest else kw["target"],
                                      kw.get("reduction", "mean"), kw.get("ignore_index", -100),
                                      kw.get("label_smoothing", 0.0), kwargs.get("weight"))
        if fn is F.mse_loss:
            return self.op(node, "mse_loss", [x, rest[0] if rest else kw["target"]], out=node.name,
                           reduction=kw.get("reduction", "mean"))
        if fn is F.layer_norm:
            shape = rest[0] if rest else kw["normalized_shape"]
            inputs = [x] + [v for v in (kw.get("weight", rest[1] if len(rest) > 1 else None),
                                        kw.get("bias", rest[2] if len(rest) > 2 else None))
                            if v is not None]
            return self.op(node, "layer_norm", inputs, out=node.name,
                           normalized_shape=[int(s) for s in shape],
                           eps=float(kw.get("eps", rest[3] if len(rest) > 3 else 1e-5)))
        if fn is F.conv2d:
            inputs = [x, rest[0] if rest else kw["weight"]]
            bias = rest[1] if len(rest) > 1 else kw.get("bias")
            if bias is not None:
                inputs.append(bias)

            def pair(v: Any) -> List[int]:
                return [int(v), int(v)] if isinstance(v, int) else [int(s) for s in v]
            return self.op(node, "conv2d", inputs, out=node.name,
                           stride=pair(kw.get("stride", rest[2] if len(rest) > 2 else 1)),
                           padding=pair(kw.get("padding", rest[3] if len(rest) > 3 else 0)),
                           dilation=pair(kw.get("dilation", rest[4] if len(rest) > 4 else 1)),
                           groups=int(kw.get("groups", rest[5] if len(rest) > 5 else 1)))
        if fn is F.embedding:
            return self.op(node, "embedding", [rest[0] if rest else kw["weight"], x], out=node.name,
                           padding_idx=kw.get("padding_idx"))
        if fn is F.dropout and not kw.get("training", True) or fn is F.dropout and kw.get("p") == 0:
            return x
        if fn in (torch.cat, torch.stack):
            tensors = list(x)
            dim = rest[0] if rest else kw.get("dim", 0)
            return self.op(node, "cat" if fn is torch.cat else "stack", tensors, out=node.name,
                           dim=int(dim))
        name = {torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.softmax: "softmax",
                F.softmax: "softmax", torch.log_softmax: "log_softmax",
                F.log_softmax: "log_softmax", torch.reshape: "reshape", torch.flatten: "flatten",
                torch.transpose: "transpose", torch.permute: "permute", torch.t: "t",
                torch.unsqueeze: "unsqueeze", torch.squeeze: "squeeze",
                torch.clamp: "clamp"}.get(fn)
        if name is not None and isinstance(x, str):
            kw.pop("_stacklevel", None)
            out = self.common(node, name, x, rest, kw)
            if out is not None:
                return out
        raise self.unsupported(node, fn)


def to_graph(module: Union[nn.Module, Callable], example_inputs: Sequence[Any]) -> TracedGraph:
    """Traces module (an nn.Module, or a function of tensors) on example_inputs (a tuple of its
    positional arguments) and writes it as a gradserve graph; see the module docstring.

    Inputs become leaves named after the function's parameters, with the example values; an
    example tensor that requires grad makes its leaf require grad. Parameters become leaves
    named by their qualified names ("fc1.weight"). Raises UnsupportedError naming a node that
    has no gradserve op.
    """
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    gm = torch.fx.symbolic_trace(module)
    with torch.no_grad():
        ShapeProp(gm).propagate(*[x.detach() if isinstance(x, torch.Tensor) else x
                                  for x in example_inputs])
    builder = GraphBuilder()
    writer = _Writer(gm, builder)
    inputs: Dict[str, str] = {}
    requires_grad_inputs: List[str] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ValueError(f"the traced function takes {len(placeholders)} inputs, "
                         f"{len(example_inputs)} examples were given")
    outputs: List[str] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            example = example_inputs[placeholders.index(node)]
            if not isinstance(example, torch.Tensor):
                raise UnsupportedError(f"gradserve.torch: input {node.name} is a "
                                       f"{type(example).__name__}, not a tensor")
            builder.leaf(node.name, _to_numpy(example),
                         requires_grad=example.requires_grad)
            writer.names[node] = inputs[node.name] = node.name
            if example.requires_grad:
                requires_grad_inputs.append(node.name)
        elif node.op == "output":
            result = node.args[0]
            for r in (result if isinstance(result, (tuple, list)) else (result,)):
                name = writer.value(r)
                if not isinstance(name, str):
                    raise UnsupportedError(f"gradserve.torch: output {r!r} is not a tensor")
                outputs.append(name)
        else:
            writer.names[node] = writer.write(node)
    return TracedGraph(builder, outputs, writer.parameters, inputs, requires_grad_inputs)


__all__ = ["SUPPORTED", "TracedGraph", "UnsupportedError", "to_graph"]
