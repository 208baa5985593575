"""Conversion between numpy arrays and gradserve.v1.Tensor messages.

Tensors travel as raw little-endian, row-major bytes (tensor.proto). Six dtypes exist:
float32, float64, float16, bfloat16, int64 and bool. numpy has no bfloat16, so a bfloat16 array
is one of dtype ``BFLOAT16``, whose elements are the 16 bits of each value: make one with
``to_bfloat16`` and read it with ``from_bfloat16``. Conversion never changes a dtype silently:
an array of any other dtype is a TypeError (cast it first, e.g. ``a.astype(np.int64)``). Where a
tensor is taken, a Tensor message may stand for the array: one whose bytes lie in shared memory
(SharedMemory.put, gradserve/shared_memory.py) is sent as it is.

Thread safety: the functions are pure; call them from any thread.
"""

from __future__ import annotations

from typing import Dict, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

from gradserve.v1 import tensor_pb2

# bfloat16 in numpy: a record of one field, the value's 16 bits (the upper half of its float32).
BFLOAT16 = np.dtype([("bfloat16", "<u2")])

# numpy dtype (little-endian) <-> wire dtype.
_TO_WIRE: Dict[np.dtype, int] = {
    np.dtype("<f4"): tensor_pb2.DTYPE_FLOAT32,
    np.dtype("<f8"): tensor_pb2.DTYPE_FLOAT64,
    np.dtype("<f2"): tensor_pb2.DTYPE_FLOAT16,
    BFLOAT16: tensor_pb2.DTYPE_BFLOAT16,
    np.dtype("<i8"): tensor_pb2.DTYPE_INT64,
    np.dtype("bool"): tensor_pb2.DTYPE_BOOL,
}
_FROM_WIRE: Dict[int, np.dtype] = {wire: dtype for dtype, wire in _TO_WIRE.items()}

# What the package takes where it needs a tensor: an array, or a Tensor message (such as
# SharedMemory.put's, whose bytes are in shared memory), sent as it is.
TensorInput = Union[ArrayLike, tensor_pb2.Tensor]


def to_bfloat16(array: ArrayLike) -> np.ndarray:
    """``array`` (any floating values) rounded to bfloat16, as an array of dtype BFLOAT16:
    through float32, to nearest with ties to even, NaN kept a NaN, as torch.bfloat16 rounds."""
    bits = np.ascontiguousarray(np.asarray(array, dtype=np.float32)).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16
    upper = np.where(nan, (bits >> 16) | 0x0040, rounded).astype("<u2")
    return upper.view(BFLOAT16)


def from_bfloat16(array: np.ndarray) -> np.ndarray:
    """The float32 values of a BFLOAT16 array (exact)."""
    bits = np.ascontiguousarray(array).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(array.shape)


def to_tensor(array: ArrayLike, device: str = "") -> tensor_pb2.Tensor:
    """A Tensor message holding a copy of ``array``.

    array: a numpy array, or anything np.asarray accepts (Python floats become float64, ints
      int64, bools bool). Big-endian arrays are byte-swapped; any memory layout is sent in C order.
    device: where the tensor should live on the server ("" means cpu).
    Raises TypeError for a dtype other than float32, float64, float16, BFLOAT16, int64 or bool.
    """
    return fill_tensor(tensor_pb2.Tensor(), array, device)


def wire_array(array: ArrayLike) -> np.ndarray:
    """``array`` as a numpy array of a wire dtype, little-endian (not copied if it is one
    already). Raises TypeError as to_tensor does."""
    a = np.asarray(array)
    wire = _TO_WIRE.get(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype)
    if wire is None:
        raise TypeError(
            f"gradserve tensors are float32, float64, float16, bfloat16 (BFLOAT16), int64 or "
            f"bool; got {a.dtype} (cast it with astype, or to_bfloat16, first)")
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
        flat = (to_bfloat16(list(source)) if dtype == BFLOAT16 else
                np.array(list(source), dtype=dtype))
    else:
        if len(tensor.data) != numel * dtype.itemsize:
            raise ValueError(f"tensor of shape {list(shape)} and dtype {dtype} needs "
                             f"{numel * dtype.itemsize} bytes, has {len(tensor.data)}")
        flat = np.frombuffer(tensor.data, dtype=dtype).copy()
    if flat.size != numel:
        raise ValueError(f"tensor of shape {list(shape)} has {flat.size} values")
    # Native byte order for the caller, whatever the host (BFLOAT16 stays as it is).
    if dtype == BFLOAT16:
        return flat.reshape(shape)
    return flat.astype(dtype.newbyteorder("="), copy=False).reshape(shape)
