"""Trace ids: the metadata a call's trace id travels in, and the id the server echoes back.

A call may carry a trace id (docs/operations.md, "Trace ids and JSON logs"): a W3C traceparent
("00-<32 hex>-<16 hex>-<2 hex>", lowercase, ids not all zero) is sent as `traceparent`,
anything else as `x-request-id` (1 to 128 printable ASCII bytes, no space). The server writes
it in the call's log line (trace=...) and sends it back under the same key in the call's
trailing metadata. The same rules as the C++ client's (proto/trace_context.h).
"""

from __future__ import annotations

import re
from typing import Iterable, Optional, Tuple

TRACEPARENT_KEY = "traceparent"
REQUEST_ID_KEY = "x-request-id"
MAX_REQUEST_ID_BYTES = 128

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_REQUEST_ID = re.compile(r"[!-~]{1,%d}" % MAX_REQUEST_ID_BYTES)

Metadata = Tuple[Tuple[str, str], ...]


def is_traceparent(value: str) -> bool:
    """Whether value has the W3C traceparent form the server takes."""
    m = _TRACEPARENT.fullmatch(value)
    return m is not None and m.group(1) != "0" * 32 and m.group(2) != "0" * 16


def trace_metadata(trace_id: Optional[str]) -> Metadata:
    """The metadata that sends trace_id (none for None).

    Raises ValueError for an id the server would ignore: neither a traceparent nor 1 to 128
    printable ASCII bytes without a space.
    """
    if trace_id is None:
        return ()
    if is_traceparent(trace_id):
        return ((TRACEPARENT_KEY, trace_id),)
    if not _REQUEST_ID.fullmatch(trace_id):
        raise ValueError(
            "trace_id must be a W3C traceparent or 1 to %d printable ASCII bytes without a "
            "space, got %d characters" % (MAX_REQUEST_ID_BYTES, len(trace_id)))
    return ((REQUEST_ID_KEY, trace_id),)


def echoed_trace_id(trailing_metadata: Optional[Iterable[Tuple[str, object]]]) -> Optional[str]:
    """The trace id the server echoed in a call's trailing metadata, or None."""
    for key, value in trailing_metadata or ():
        if key in (TRACEPARENT_KEY, REQUEST_ID_KEY):
            return value.decode() if isinstance(value, bytes) else str(value)
    return None
