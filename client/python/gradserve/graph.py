"""A small builder for GradRequest messages: leaves, ops, sub-graphs and backward calls.

    g = GraphBuilder()
    g.leaf("x", np.array([1.0, 2.0]), requires_grad=True)
    g.leaf("w", np.array([3.0, 4.0]), requires_grad=True)
    g.op("mul", ["x", "w"], out="h")
    g.op("sum", ["h"], out="loss", dim=[0])
    g.backward_call(["loss"], inputs=["x", "w"])
    request = g.request()

Leaf values and seeds are numpy arrays, or Tensor messages such as SharedMemory.put's (bytes in
a shared-memory region); backward_call's gradient_destinations has the gradients written into
ranges of a region (gradserve/shared_memory.py).

Attribute values map to AttrValue by Python type: bool -> b, int -> i, float -> f, str -> s,
and sequences of those -> ints / floats / strings (an empty sequence is an empty int list).
numpy scalars count as their Python kind.

Errors: TypeError for an attribute value of no known kind; ValueError for a value name that is
empty or already defined in this graph (the server checks the rest). Thread safety: a builder is
not thread-safe; build a request in one thread, then send it from any.
"""

from __future__ import annotations

import numbers
from typing import List, Mapping, Optional, Sequence, Set, Union

import numpy as np

from gradserve.tensors import TensorInput, fill_tensor, wire_array
from gradserve.v1 import gradserve_pb2, graph_pb2, tensor_pb2

# What attr_value takes: a Python or numpy scalar, a sequence of them, or an AttrValue.
AttrInput = Union[bool, int, float, str, np.generic, Sequence[Union[bool, int, float, str]],
                  graph_pb2.AttrValue]


def attr_value(value: AttrInput) -> graph_pb2.AttrValue:
    """The AttrValue message for a Python value; see the module docstring for the mapping."""
    if isinstance(value, graph_pb2.AttrValue):
        return value
    if isinstance(value, (bool, np.bool_)):
        return graph_pb2.AttrValue(b=bool(value))
    if isinstance(value, numbers.Integral):
        return graph_pb2.AttrValue(i=int(value))
    if isinstance(value, numbers.Real):
        return graph_pb2.AttrValue(f=float(value))
    if isinstance(value, str):
        return graph_pb2.AttrValue(s=value)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, str) for v in items) and items:
            return graph_pb2.AttrValue(strings=graph_pb2.StringList(values=items))
        if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items):
            return graph_pb2.AttrValue(ints=graph_pb2.IntList(values=[int(v) for v in items]))
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items):
            return graph_pb2.AttrValue(floats=graph_pb2.FloatList(values=[float(v) for v in items]))
    raise TypeError(f"attribute value {value!r} is not a bool, int, float, str or a list of one "
                    "of int, float, str")


def backward_call(roots: Union[str, Sequence[str]],
                  seeds: Optional[Mapping[str, TensorInput]] = None, inputs: Sequence[str] = (),
                  *, accumulate_grad: bool = False, retain_graph: bool = False,
                  create_graph: bool = False, allow_unused: bool = False,
                  materialize_grads: bool = False, detect_anomaly: bool = False,
                  gradient_destinations: Optional[
                      Mapping[str, tensor_pb2.SharedMemoryRange]] = None
                  ) -> gradserve_pb2.BackwardCall:
    """A BackwardCall message (the fields of gradserve.proto's BackwardCall).

    roots: a name or a list of names; seeds: {root name: array or Tensor message (e.g.
    SharedMemory.put's)}, roots left out must have one element and are seeded with ones;
    inputs: what to return gradients for. gradient_destinations: {input name:
    SharedMemoryRange (SharedMemory.range) of a writable registered region, exactly the
    gradient's byte size}: the server writes that gradient there, and the CallResult lists it
    in in_shared_memory instead of gradients.
    """
    call = gradserve_pb2.BackwardCall(
        roots=[roots] if isinstance(roots, str) else list(roots), inputs=list(inputs),
        accumulate_grad=accumulate_grad, retain_graph=retain_graph, create_graph=create_graph,
        allow_unused=allow_unused, materialize_grads=materialize_grads,
        detect_anomaly=detect_anomaly)
    for name, array in (seeds or {}).items():
        fill_tensor(call.seeds[name], array)
    for name, destination in (gradient_destinations or {}).items():
        call.gradient_destinations[name].CopyFrom(destination)
    return call


class GraphBuilder:
    """Builds a Graph (and, for a top-level graph, a GradRequest) in forward order.

    inputs: for a checkpoint body only, its formal input names, bound in order to the
      checkpoint op's inputs.
    Every method returns the builder, so calls chain.
    """

    def __init__(self, inputs: Sequence[str] = ()) -> None:
        self._graph = graph_pb2.Graph(inputs=list(inputs))
        self._names: Set[str] = set(self._graph.inputs)
        self._calls: List[gradserve_pb2.BackwardCall] = []
        self._return_values: List[str] = []
        self._allow_tf32 = False

    def _define(self, name: str) -> None:
        if not name:
            raise ValueError("value names must not be empty")
        if name in self._names:
            raise ValueError(f"value {name!r} is already defined in this graph")
        self._names.add(name)

    def leaf(self, name: str, array: TensorInput, requires_grad: bool = False,
             device: str = "") -> GraphBuilder:
        """Adds a leaf tensor: a numpy array (see tensors.to_tensor for the accepted dtypes),
        or a Tensor message sent as it is, e.g. SharedMemory.put's (its bytes stay in shared
        memory; device, if given, replaces its device)."""
        if not isinstance(array, tensor_pb2.Tensor):
            array = wire_array(array)  # a bad dtype raises before anything is added
        self._define(name)
        leaf = self._graph.leaves.add(name=name, requires_grad=requires_grad)
        fill_tensor(leaf.value, array, device)  # in place: a copy of a big array fewer
        return self

    def op(self, op: str, inputs: Sequence[str], /, out: Union[str, Sequence[str]], *,
           no_grad: bool = False, body: Optional[GraphBuilder] = None, **attrs: AttrInput
           ) -> GraphBuilder:
        """Adds an op.

        op: the op's name ("mul", "grad", "checkpoint", ...); inputs: value names in the op's
        argument order; out: the output name, or a list of names (empty for "hook", and
        allowed empty for an in-place op such as "add_", whose first input's name then refers
        to the written tensor);
        no_grad: run with grad mode off; body: a GraphBuilder for checkpoint's sub-graph;
        attrs: the op's attributes by name.
        """
        outputs = [out] if isinstance(out, str) else list(out)
        for name in outputs:
            self._define(name)
        message = self._graph.ops.add(op=op, inputs=list(inputs), outputs=outputs,
                                      no_grad=no_grad)
        for key, value in attrs.items():
            message.attrs[key].CopyFrom(attr_value(value))
        if body is not None:
            message.body.CopyFrom(body.graph())
        return self

    def outputs(self, *names: str) -> GraphBuilder:
        """Sets a checkpoint body's outputs, bound in order to the checkpoint op's outputs."""
        self._graph.outputs[:] = list(names)
        return self

    def backward_call(self, roots: Union[str, Sequence[str]],
                      seeds: Optional[Mapping[str, TensorInput]] = None,
                      inputs: Sequence[str] = (), *,
                      gradient_destinations: Optional[
                          Mapping[str, tensor_pb2.SharedMemoryRange]] = None,
                      **options: bool) -> GraphBuilder:
        """Appends a BackwardCall: backward_call(roots, seeds, inputs, gradient_destinations=,
        **options)."""
        self._calls.append(backward_call(roots, seeds, inputs,
                                         gradient_destinations=gradient_destinations, **options))
        return self

    def return_values(self, *names: str) -> GraphBuilder:
        """Asks for these forward values in the response."""
        self._return_values.extend(names)
        return self

    def allow_tf32(self, allow: bool = True) -> GraphBuilder:
        """Lets float32 matrix products on a GPU use TF32 tensor cores
        (torch.backends.cuda.matmul.allow_tf32); off unless asked."""
        self._allow_tf32 = allow
        return self

    def graph(self) -> graph_pb2.Graph:
        """A copy of the Graph message built so far."""
        copy = graph_pb2.Graph()
        copy.CopyFrom(self._graph)
        return copy

    def request(self, request_id: str = "") -> gradserve_pb2.GradRequest:
        """A GradRequest with this graph, its backward calls and return values."""
        return gradserve_pb2.GradRequest(request_id=request_id, graph=self._graph,
                                         calls=self._calls, return_values=self._return_values,
                                         allow_tf32=self._allow_tf32)
