"""Conversion between numpy arrays and gradserve.v1.Tensor messages.

Tensors travel as raw little-endian, row-major bytes (tensor.proto). Four dtypes exist:
float32, float64, int64 and bool. Conversion never changes a dtype silently: an array of any
other dtype is a TypeError (cast it first, e.g. ``a.astype(np.int64)``). Where a tensor is
taken, a Tensor message may stand for the array: one whose bytes lie in shared memory
(SharedMemory.put, gradserve/shared_memory.py) is sent as it is.

Thread safety: the functions are pure; call them from any thread.
"""

from __future__ import annotations

from typing import Dict, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

from gradserve.v1 import tensor_pb2

# numpy dtype (little-endian) <-> wire dtype.
_TO_WIRE: Dict[np.dtype, int] = {
    np.dtype("<f4"): tensor_pb2.DTYPE_FLOAT32,
    np.dtype("<f8"): tensor_pb2.DTYPE_FLOAT64,
    np.dtype("<i8"): tensor_pb2.DTYPE_INT64,
    np.dtype("bool"): tensor_pb2.DTYPE_BOOL,
}
_FROM_WIRE: Dict[int, np.dtype] = {wire: dtype for dtype, wire in _TO_WIRE.items()}

# What the package takes where it needs a tensor: an array, or a Tensor message (such as
# SharedMemory.put's, whose bytes are in shared memory), sent as it is.
TensorInput = Union[ArrayLike, tensor_pb2.Tensor]


def to_tensor(array: ArrayLike, device: str = "") -> tensor_pb2.Tensor:
    """A Tensor message holding a copy of ``array``.

    array: a numpy array, or anything np.asarray accepts (Python floats become float64, ints
      int64, bools bool). Big-endian arrays are byte-swapped; any memory layout is sent in C order.
    device: where the tensor should live on the server ("" means cpu).
    Raises TypeError for a dtype other than float32, float64, int64 or bool.
    """
    return fill_tensor(tensor_pb2.Tensor(), array, device)


def wire_array(array: ArrayLike) -> np.ndarray:
    """``array`` as a numpy array of a wire dtype, little-endian (not copied if it is one
    already). Raises TypeError as to_tensor does."""
    a = np.asarray(array)
    wire = _TO_WIRE.get(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype)
    if wire is None:
        raise TypeError(
            f"gradserve tensors are float32, float64, int64 or bool; got {a.dtype} "
            "(cast it with astype first)")
    return a.astype(_FROM_WIRE[wire], copy=False)


def wire_dtype(dtype: np.dtype) -> int:
    """The wire DType of a numpy dtype; TypeError as to_tensor's for one of no wire dtype."""
    return _TO_WIRE[wire_array(np.empty(0, dtype)).dtype]


def wire_dtype_of(tensor: tensor_pb2.Tensor) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """The numpy dtype (little-endian), shape and element count of a Tensor message. Raises
    ValueError if its dtype is unspecified or unknown."""
    dtype = _FROM_WIRE.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"tensor has no valid dtype ({tensor.dtype})")
    shape = tuple(int(d) for d in tensor.shape)
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return dtype, shape, numel


def fill_tensor(tensor: tensor_pb2.Tensor, array: TensorInput, device: str = ""
                ) -> tensor_pb2.Tensor:
    """Sets the Tensor message ``tensor`` (in place, e.g. a field of a bigger message, so that
    its bytes are not copied again into it) to hold a copy of ``array``, as to_tensor does;
    returns it. ``array`` may also be a Tensor message (e.g. SharedMemory.put's), copied as it
    is (device, if given, replaces its device). Raises TypeError, with ``tensor`` untouched,
    as to_tensor does."""
    if isinstance(array, tensor_pb2.Tensor):
        tensor.CopyFrom(array)
        if device:
            tensor.device = device
        return tensor
    a = wire_array(array)
    wire = _TO_WIRE[a.dtype]  # tobytes below writes C order
    tensor.Clear()
    tensor.dtype = wire
    tensor.shape.extend(a.shape)
    tensor.data = a.tobytes(order="C")
    tensor.device = device
    return tensor


def from_tensor(tensor: tensor_pb2.Tensor) -> np.ndarray:
    """A new, writable numpy array with the contents of a Tensor message.

    Accepts raw ``data`` and hand-written ``values``. Raises ValueError if the dtype is
    unspecified or unknown, if the contents do not match the shape, or if they lie in shared
    memory (read those with SharedMemory.get).
    """
    dtype, shape, numel = wire_dtype_of(tensor)
    contents = tensor.WhichOneof("contents")
    if contents == "shared_memory":
        r = tensor.shared_memory
        raise ValueError(f"the tensor's bytes are in shared-memory region {r.region!r} at "
                         f"offset {r.offset}: read them with SharedMemory.get")
    if contents == "values":
        v = tensor.values
        source = v.bools if dtype == np.bool_ else v.ints if dtype == np.int64 else v.doubles
        flat = np.array(list(source), dtype=dtype)
    else:
        if len(tensor.data) != numel * dtype.itemsize:
            raise ValueError(f"tensor of shape {list(shape)} and dtype {dtype} needs "
                             f"{numel * dtype.itemsize} bytes, has {len(tensor.data)}")
        flat = np.frombuffer(tensor.data, dtype=dtype).copy()
    if flat.size != numel:
        raise ValueError(f"tensor of shape {list(shape)} has {flat.size} values")
    # Native byte order for the caller, whatever the host.
    return flat.astype(dtype.newbyteorder("="), copy=False).reshape(shape)
