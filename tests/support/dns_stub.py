"""A DNS server stub on 127.0.0.1 (UDP) that answers A queries from a fixed table.

It stands in for Docker's embedded DNS, which gives a compose service's name one
A record per replica: ``async with running_dns_stub({"intake": ["127.0.0.1",
"127.0.0.2"]}) as address:`` then point a resolver at ``address`` ("127.0.0.1:PORT").
Other names get NXDOMAIN, other types (AAAA) an empty answer. Only what a resolver
asking for A records needs: one question per query, no compression in questions.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import trio

_A, _IN = 1, 1


def answer(query: bytes, table: Mapping[str, Sequence[str]]) -> bytes | None:
    """The response to one DNS ``query`` (None for something that is not one)."""
    if len(query) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", query[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, offset = [], 12
    while offset < len(query) and query[offset] != 0:
        length = query[offset]
        labels.append(query[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    offset += 1
    if offset + 4 > len(query):
        return None
    qtype, qclass = struct.unpack("!HH", query[offset : offset + 4])
    question = query[12 : offset + 4]
    name = ".".join(labels).lower().rstrip(".")
    addresses = table.get(name)
    records = b""
    count = 0
    if addresses is not None and qtype == _A and qclass == _IN:
        for address in addresses:
            # a pointer to the name in the question (offset 12), A, IN, TTL 1 s, 4 bytes
            records += struct.pack("!HHHIH", 0xC00C, _A, _IN, 1, 4) + socket.inet_aton(address)
            count += 1
    rcode = 0 if addresses is not None else 3  # NXDOMAIN
    header = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, count, 0, 0)
    return header + question + records


@asynccontextmanager
async def running_dns_stub(table: Mapping[str, Sequence[str]]) -> AsyncIterator[str]:
    """Serve ``table`` (name → IPv4 addresses) on 127.0.0.1; yield "127.0.0.1:PORT"."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

        async def serve() -> None:
            while True:
                query, peer = await sock.recvfrom(2048)
                response = answer(query, table)
                if response is not None:
                    await sock.sendto(response, peer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            try:
                yield f"127.0.0.1:{port}"
            finally:
                nursery.cancel_scope.cancel()
