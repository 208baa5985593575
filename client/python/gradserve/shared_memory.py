"""Shared memory with a gradserve server on the same host (the C++ client's SharedMemory).

Big tensors and their gradients pass through a POSIX shared-memory object instead of the
connection: the client creates the object, registers it with the server under a region name
(Client.register_shared_memory), writes tensors into it (put) and names ranges of it as leaf
values, seeds and gradients' destinations; the server reads the values from it and writes the
gradients into it; the client reads them back (get).

    with SharedMemory("/gradserve_me_1", 2 * x.nbytes) as shm:
        client.register_shared_memory("buf", shm, writable=True)
        g = (GraphBuilder()
             .leaf("x", shm.put("buf", 0, x), requires_grad=True)   # its bytes stay in shm
             .op("mul", ["x", "x"], out="y").op("sum", ["y"], out="loss")
             .backward_call("loss", inputs=["x"],
                            gradient_destinations={"x": shm.range("buf", x.nbytes, x.nbytes)}))
        call = client.grad(g).calls[0]
        dx = shm.get(call.in_shared_memory["x"])   # a copy of the gradient the server wrote
        client.unregister_shared_memory("buf")

The server must have shared memory on (--shared_memory_prefix, which the key must start with).
A region lives on the one server that registered it: send the calls that name it to that
server (a Client of one address; a Session's calls always reach its server).

Errors: ValueError for a bad key or size, a tensor that does not fit, a range outside the
object, or a tensor whose contents are not a range; OSError (FileExistsError, ...) when the
object cannot be created or mapped; ValueError for any use after close(). Thread safety: a
SharedMemory may be read and written from any thread; ranges that two threads (or this process
and the server) write at once are the caller's race.
"""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike

from gradserve.tensors import wire_array, wire_dtype, wire_dtype_of
from gradserve.v1 import tensor_pb2

# Where Linux (glibc's shm_open) keeps POSIX shared-memory objects.
SHM_DIR = "/dev/shm"


def _check_key(key: str) -> None:
    if not key.startswith("/") or len(key) < 2 or "/" in key[1:] or "\0" in key:
        raise ValueError(f"shared-memory key {key!r} must be '/' and a name without '/', as "
                         "shm_open names objects (e.g. '/gradserve_trainer_1')")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # unlinked by someone else: nothing left to do
        pass


def object_path(key: str) -> str:
    """The file of the POSIX shared-memory object key ("/name"): /dev/shm/name. Raises
    ValueError for a key shm_open would refuse."""
    _check_key(key)
    return SHM_DIR + key


class SharedMemory:
    """A POSIX shared-memory object this process created, mapped read-write.

    key: the object's shm_open name, "/" and a name without "/" (for the server: starting with
    its --shared_memory_prefix); it must not exist yet. byte_size: its size, > 0. mode: its
    permissions (the server's user must be able to read it, and write it for gradients).
    Creates, sizes and maps the object; close() (or leaving the ``with`` block) unmaps and
    unlinks it, as does garbage collection or the interpreter's exit for one never closed.
    The server keeps its own mapping until the region is unregistered or idles out.
    Raises ValueError for a bad key or size, OSError (e.g. FileExistsError) when the object
    cannot be created, sized or mapped (nothing is left behind then).
    """

    def __init__(self, key: str, byte_size: int, mode: int = 0o600) -> None:
        path = object_path(key)
        if byte_size <= 0:
            raise ValueError(f"shared memory {key}: byte_size must be positive, got {byte_size}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits of mode away
            os.ftruncate(fd, byte_size)
            self._mmap: Optional[mmap.mmap] = mmap.mmap(fd, byte_size, mmap.MAP_SHARED,
                                                        mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)  # the mapping keeps the object
        self.key = key
        self.byte_size = byte_size
        # Unlinks the object when this is collected or the interpreter exits, if not closed.
        self._unlinker = weakref.finalize(self, _unlink, path)

    @property
    def closed(self) -> bool:
        """Whether close() has run."""
        return self._mmap is None

    def buffer(self) -> memoryview:
        """A writable view of the whole object (release it before close(), which otherwise
        raises BufferError). Raises ValueError after close()."""
        return memoryview(self._mapped())

    def _mapped(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError(f"shared memory {self.key} is closed")
        return self._mmap

    def _check_range(self, offset: int, size: int, what: str) -> None:
        if offset < 0 or size < 0 or offset > self.byte_size or size > self.byte_size - offset:
            raise ValueError(f"{what} [{offset}, +{size}) is not within shared memory "
                             f"{self.key} of {self.byte_size} bytes")

    def put(self, region: str, offset: int, array: ArrayLike, device: str = ""
            ) -> tensor_pb2.Tensor:
        """Copies array's bytes (as tensors.to_tensor would send them: little-endian, C order)
        to offset and returns a Tensor message naming them as a range of the region registered
        as ``region``: dtype, shape, device and shared_memory, no data. Use it wherever the
        package takes a tensor (GraphBuilder.leaf, backward_call's seeds). Raises TypeError for
        a dtype to_tensor refuses, ValueError if the bytes do not fit (nothing is written)."""
        a = wire_array(array)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        self._check_range(offset, a.nbytes, f"a tensor of {a.nbytes} bytes at")
        if a.nbytes:
            destination = np.frombuffer(self._mapped(), dtype=np.uint8, count=a.nbytes,
                                        offset=offset)
            destination[:] = a.reshape(-1).view(np.uint8)
            del destination  # no export of the mapping outlives the call
        tensor = tensor_pb2.Tensor(dtype=wire_dtype(a.dtype), shape=a.shape, device=device)
        tensor.shared_memory.CopyFrom(self.range(region, offset, a.nbytes))
        return tensor

    @staticmethod
    def range(region: str, offset: int, byte_size: int) -> tensor_pb2.SharedMemoryRange:
        """A SharedMemoryRange message: byte_size bytes at offset of the region registered as
        ``region``, e.g. a gradient's destination (backward_call's gradient_destinations),
        which must be exactly the gradient's size in bytes."""
        return tensor_pb2.SharedMemoryRange(region=region, offset=offset, byte_size=byte_size)

    def get(self, described: tensor_pb2.Tensor) -> np.ndarray:
        """A new, writable numpy array (a copy, independent of the object) with the tensor that
        ``described`` places in this object: its dtype and shape, its bytes read from its range
        (a gradient the server wrote, CallResult.in_shared_memory[name], or a put() tensor).
        The range's region name is not checked: it must be the name this object was
        registered under. Raises ValueError if described's contents are not a range, the range
        is not within this object, or its size does not match the dtype and shape."""
        if described.WhichOneof("contents") != "shared_memory":
            raise ValueError("the tensor's contents are not in shared memory")
        r = described.shared_memory
        dtype, shape, numel = wire_dtype_of(described)
        size = r.byte_size or numel * dtype.itemsize
        self._check_range(r.offset, size, f"range of region {r.region!r}")
        if size != numel * dtype.itemsize:
            raise ValueError(f"tensor of shape {list(shape)} and dtype {dtype} needs "
                             f"{numel * dtype.itemsize} bytes, its range in region "
                             f"{r.region!r} has {size}")
        flat = np.frombuffer(self._mapped(), dtype=dtype, count=numel, offset=r.offset).copy()
        # Native byte order for the caller, whatever the host.
        return flat.astype(dtype.newbyteorder("="), copy=False).reshape(shape)

    def close(self) -> None:
        """Unmaps and unlinks the object; a second close does nothing. Raises BufferError while
        a view from buffer() is alive (the object is then left as it was)."""
        if self._mmap is None:
            return
        self._mmap.close()
        self._mmap = None
        self._unlinker()

    def __enter__(self) -> SharedMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"SharedMemory({self.key!r}, {self.byte_size}{state})"

