"""A lean load generator for the orchestrator benchmark: lease + release round trips over plain HTTP/1.1
keep-alive connections, one per worker, with the requests' bytes built by hand and the replies parsed no further
than the status line, Content-Length and (for a lease) the lease id.

Why: the protocol's own client (:class:`petals_chain.protocol.http_client.OrchestratorClient` on aiohttp) spends
about as much CPU per round trip as the orchestrator itself (results/bench/orchestrator-profile.txt: 241 µs). On a
machine whose two cores the generator shares with the orchestrator, that caps the measured rate near 1e6 /
(generator + orchestrator µs) whatever the orchestrator does. Real clients run elsewhere; a generator that costs a
fraction of that measures the orchestrator, as wrk or h2load would (neither can chain a release to the lease id of
the reply before it without scripting). The requests are the ones the protocol client sends: ``POST /lease`` with a
fresh ``request_id`` and ``timeout_s``, then ``POST /lease/{id}/release``; any reply but 200 is an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = ["RawLeaseClient", "round_trips"]


class RawLeaseClient:
    """One keep-alive connection to the orchestrator at ``url`` (http only) that takes and returns leases."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the raw client speaks plain http to host:port, got {url!r}")
        self.host, self.port, self.timeout_s = parts.hostname, parts.port, timeout_s
        self._head = f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection (once)."""
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        """Close the connection."""
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()

    async def _post(self, path: str, body: bytes) -> bytes:
        """POST ``body`` to ``path``; the reply's body (RuntimeError on any status but 200)."""
        assert self.writer is not None and self.reader is not None, "connect() first"
        self.writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\n" + self._head
                          + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        data = await self.reader.readexactly(length) if length else b""
        if status != b"200":
            raise RuntimeError(f"POST {path}: HTTP {status.decode()}: {data[:200].decode(errors='replace')}")
        return data

    async def lease(self) -> str:
        """A lease's id (waits at most timeout_s for a slot)."""
        body = b'{"timeout_s": %g, "request_id": "%s"}' % (self.timeout_s, os.urandom(16).hex().encode())
        return json.loads(await self._post("/lease", body))["lease_id"]

    async def release(self, lease_id: str) -> None:
        """Give the lease's slot back."""
        await self._post(f"/lease/{lease_id}/release", b"{}")


async def round_trips(url: str, concurrency: int, requests: int, warmup: int,
                      on_done: Callable[[], None] | None = None) -> tuple[list[float], float]:
    """``requests`` lease + release round trips from ``concurrency`` workers, each on its own connection, after
    ``warmup`` on one; (every round trip's seconds, the elapsed seconds of the measured part)."""
    clients = [RawLeaseClient(url) for _ in range(concurrency)]
    await asyncio.gather(*(c.connect() for c in clients))
    try:
        for _ in range(warmup):
            await clients[0].release(await clients[0].lease())
        latencies: list[float] = []
        remaining = [requests]

        async def worker(client: RawLeaseClient) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                t0 = time.perf_counter()
                await client.release(await client.lease())
                latencies.append(time.perf_counter() - t0)
                if on_done is not None:
                    on_done()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients))
        return latencies, time.perf_counter() - t0
    finally:
        await asyncio.gather(*(c.close() for c in clients))
