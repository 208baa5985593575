"""The Chunks of ComputeGradientsStream as the bytes gRPC carries, with as few copies as can be.

A streamed request is the serialized GradRequest cut into gradserve.v1.Chunk messages (data = a
piece, total_bytes = the whole size on the first one), and the response comes back the same
way. Building each Chunk as a message copies its piece three times (slicing the payload, setting
the field, serializing the message), and reading one copies it twice more (parsing, then reading
the field) before the pieces are joined; for a 64 MiB gradient each copy is a fresh 64 MiB of
Python memory, faulted in page by page. So the client sends and receives the Chunks as bytes:
chunk_messages writes each message as protobuf would (field 1 then field 2, each left out at
its default) from a view of the payload, one copy; join_data reads the data field out of each
received message as a view and joins the views, one copy in all.

Errors: join_data raises ValueError for bytes that are no Chunk message.
Thread safety: the functions are pure.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Tuple

_DATA_TAG = b"\x0a"  # field 1, length-delimited
_TOTAL_BYTES_TAG = b"\x10"  # field 2, varint


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 as protobuf writes it: two's complement
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def chunk_messages(payload: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """Yields the serialized Chunks of payload (bytes), chunk_bytes of data each (at least one
    Chunk, empty for an empty payload); the first carries total_bytes."""
    view = memoryview(payload)
    for start in range(0, max(len(view), 1), chunk_bytes):
        piece = view[start:start + chunk_bytes]
        parts = []
        if len(piece):
            parts += [_DATA_TAG, _varint(len(piece)), piece]
        if start == 0 and len(view):
            parts += [_TOTAL_BYTES_TAG, _varint(len(view))]
        yield b"".join(parts)


def _read_varint(view: memoryview, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while shift < 70:
        if pos >= len(view):
            raise ValueError("a Chunk ends inside a varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("a Chunk has a varint longer than ten bytes")


def _data(message: bytes) -> memoryview:
    """The data field of one serialized Chunk, as a view into it (the last one, as protobuf)."""
    view = memoryview(message)
    data = view[0:0]
    pos = 0
    while pos < len(view):
        tag, pos = _read_varint(view, pos)
        wire_type = tag & 7
        if wire_type == 0:
            _, pos = _read_varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            size, pos = _read_varint(view, pos)
            if tag >> 3 == 1:
                data = view[pos:pos + size]
            pos += size
        else:
            raise ValueError(f"a Chunk has a field of wire type {wire_type}")
        if pos > len(view):
            raise ValueError("a Chunk ends inside a field")
    return data


def join_data(messages: Iterable[bytes]) -> bytes:
    """The data of the serialized Chunks in messages (an iterable of bytes), joined."""
    return b"".join([_data(m) for m in messages])
