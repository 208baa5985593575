"""Where a Client connects, and how it spreads calls over several servers.

The Python side of Note [Several replicas] (client/library/channel_target.h), which says why:
every channel gets SERVICE_CONFIG, round_robin over the target's addresses and calls that end
UNAVAILABLE (a server killed) or CANCELLED by a draining server retried (up to 4 attempts,
each picked anew, so on another server), and a target may be a comma-separated list of IP
addresses, which grpc_target turns into gRPC's ipv4: or ipv6: list. ComputeGradients is a
pure function of its request, so a retry is safe.

Threading: pure functions.
"""

from __future__ import annotations

import ipaddress
import json
from typing import List, Optional, Set, Tuple, Union

# A gRPC channel option: (name, value).
ChannelOption = Tuple[str, Union[str, int]]

# The same JSON as kServiceConfigJson in client/library/channel_target.h.
SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{"service": "gradserve.v1.GradService"}, {"service": "grpc.health.v1.Health"}],
        "retryPolicy": {
            "maxAttempts": 4,
            "initialBackoff": "0.05s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
        },
    }],
})

# The channel options that apply it, and keep DNS from replacing it.
# The request bytes gRPC keeps per call to replay it: any unary request the server takes by
# default, and never gRPC's own 256 KiB, with which a larger call that a GOAWAY turned back was
# replayed with an empty message (kRetryBufferBytes in client/library/channel_target.h).
RETRY_BUFFER_BYTES = 32 << 20

# A session's calls must reach the replica that answered its Forward (docs/sessions.md): the
# sessions' channel keeps to one connection, and retries nothing on another server.
SESSION_CHANNEL_OPTIONS: List[ChannelOption] = [
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"pick_first": {}}]})),
    ("grpc.service_config_disable_resolution", 1)]

CHANNEL_OPTIONS: List[ChannelOption] = [
    ("grpc.service_config", SERVICE_CONFIG),
    ("grpc.service_config_disable_resolution", 1),
    ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]


def _family(entry: str) -> Optional[int]:
    """4 or 6 for "A.B.C.D:PORT" or "[V6]:PORT"; None for anything else."""
    host, colon, port = entry.rpartition(":")
    if not colon or not port.isdigit() or len(port) > 5:
        return None
    try:
        if host.startswith("[") and host.endswith("]"):
            return 6 if isinstance(ipaddress.ip_address(host[1:-1]), ipaddress.IPv6Address) else None
        return 4 if isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address) else None
    except ValueError:
        return None


def grpc_target(target: str) -> str:
    """The gRPC target for target: a list of IP addresses as gRPC's "ipv4:" or "ipv6:" list,
    a single address or a gRPC target URI ("dns:///host:port") unchanged.

    Raises ValueError naming the entry for an empty target, a list entry that is not IP:PORT
    or [IPV6]:PORT (a list of names: use dns:///NAME:PORT), or a list mixing IPv4 and IPv6.
    """
    target = target.strip()
    if not target:
        raise ValueError("the target is empty")
    if "," not in target or "://" in target or target.startswith(("ipv4:", "ipv6:")):
        return target
    entries = [e.strip() for e in target.split(",")]
    families: Set[int] = set()
    for entry in entries:
        family = _family(entry)
        if family is None:
            raise ValueError(f"target list entry {entry!r} is not IP:PORT or [IPV6]:PORT; a list "
                             "holds IP addresses (for a name whose addresses are the servers, "
                             "use dns:///NAME:PORT)")
        families.add(family)
    if len(families) > 1:
        raise ValueError(f"target list {target!r} mixes IPv4 and IPv6 addresses")
    return f"ipv{families.pop()}:" + ",".join(entries)
