"""The one client of the orchestrator's HTTP API (async), for the PETALS client and server subclasses and tools.

``lease()`` long-polls until JFFC grants a chain; the PETALS client keeps it renewed and releases it
(the client's lease keeper), so a slot is never left behind. While the orchestrator cannot be reached (it
restarts) every call is retried with exponential backoff for ``unreachable_wait_s``; a lease request carries a
request id, the same on every retry, so the restarted orchestrator hands it the lease or the place in line it had.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import ssl
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from petals_chain import defaults
from petals_chain.protocol.auth import SECRET_HEADER
from petals_chain.protocol.messages import SHUTTING_DOWN
from petals_chain.protocol.replies import AssignmentInfo, LeaseInfo

CA_FILE_ENV = "PETALS_CHAIN_ORCH_CA"  # a CA bundle (PEM) that signed the orchestrator's TLS certificate


def tls_context(ca_file: str | None = None) -> ssl.SSLContext | None:
    """The TLS context for an https orchestrator: the CAs of ``ca_file`` (or $PETALS_CHAIN_ORCH_CA) only, or None for
    aiohttp's default (the system's CAs)."""
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    if ca_file is None:
        return None  # aiohttp's default verification against the system's CAs
    if not os.path.isfile(ca_file):
        raise FileNotFoundError(f"CA file {ca_file!r} (--orchestrator-ca / ${CA_FILE_ENV}) does not exist")
    return ssl.create_default_context(cafile=ca_file)

log = logging.getLogger(__name__)


class OrchestratorUnreachableError(ConnectionError):
    """The orchestrator's URL cannot be reached (not running, wrong port, wrong host), also after retrying."""


class OrchestratorError(RuntimeError):
    """The orchestrator answered with an error status; ``status`` and ``message`` say which."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"orchestrator answered {status}: {message}")
        self.status = status
        self.message = message


class OrchestratorClient:
    """Talks to one orchestrator; use as ``async with OrchestratorClient(url) as oc: ...``."""

    def __init__(self, base_url: str, *, token: str | None = None, session: aiohttp.ClientSession | None = None,
                 request_timeout_s: float = defaults.CALL_TIMEOUT_S, ca_file: str | None = None,
                 unreachable_wait_s: float = defaults.UNREACHABLE_WAIT_S) -> None:
        if not (isinstance(unreachable_wait_s, (int, float)) and 0 <= unreachable_wait_s < float("inf")):
            raise ValueError(f"field 'unreachable_wait_s' must be a finite number >= 0, got {unreachable_wait_s!r}")
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.unreachable_wait_s = float(unreachable_wait_s)
        self.retries = 0  # calls repeated because the orchestrator could not be reached
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = tls_context(ca_file) if self.base_url.startswith("https://") else None
        # Each server registered through this client gets its own secret; it speaks for itself with it.
        self.server_secrets: dict[str, str] = {}
        self._session = session
        self._own_session = session is None

    async def __aenter__(self) -> OrchestratorClient:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session if this client opened it."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _as_server(self, name: str) -> dict[str, str]:
        """Headers that speak for server ``name``: its secret when it has one, else this client's token."""
        secret = self.server_secrets.get(name)
        return {"Authorization": f"Bearer {secret}"} if secret else self._headers

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   timeout_s: float | None = None) -> Any:
        """Any route: ``method`` ``path`` with JSON ``body``, retried as every call (see :meth:`_call`)."""
        return await self._call(method, path, body, timeout_s)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    timeout_s: float | None = None, headers: dict[str, str] | None = None,
                    wait_deadline_s: float | None = None) -> Any:
        """One request, repeated with exponential backoff while the orchestrator cannot be reached (at most
        unreachable_wait_s, then OrchestratorUnreachableError); JSON reply on 2xx, OrchestratorError otherwise.

        ``wait_deadline_s`` (a long poll's end, time.monotonic) shortens the body's ``timeout_s`` on each retry."""
        give_up_s = time.monotonic() + self.unreachable_wait_s
        pause_s, attempts = defaults.RETRY_FIRST_S, 0
        while True:
            attempts += 1
            if wait_deadline_s is not None and body is not None:
                body["timeout_s"] = max(0.001, wait_deadline_s - time.monotonic())
            try:
                return await self._call_once(method, path, body, timeout_s, headers)
            except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError):
                raise  # a certificate the client does not trust: waiting will not change it
            except aiohttp.ClientConnectionError as exc:  # refused, reset, closed mid-reply: it may be restarting
                last: BaseException = exc
            except OrchestratorError as exc:
                if not (exc.status == 503 and SHUTTING_DOWN in exc.message):
                    raise
                last = exc
            now = time.monotonic()
            if now + pause_s > give_up_s:
                raise OrchestratorUnreachableError(
                    f"cannot reach the orchestrator at {self.base_url} ({method} {path}): {attempts} attempts in "
                    f"{self.unreachable_wait_s:g} s; last error: {type(last).__name__}: {last}") from last
            if attempts == 1:
                log.warning("orchestrator at %s unreachable (%s: %s); retrying for up to %g s", self.base_url,
                            type(last).__name__, last, self.unreachable_wait_s)
            self.retries += 1
            await asyncio.sleep(pause_s)
            pause_s = min(2 * pause_s, defaults.RETRY_MAX_S)

    async def _call_once(self, method: str, path: str, body: dict[str, Any] | None = None,
                         timeout_s: float | None = None, headers: dict[str, str] | None = None) -> Any:
        """One request; JSON reply on 2xx, OrchestratorError otherwise."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        kw: dict[str, Any] = {} if self._ssl is None else {"ssl": self._ssl}
        async with self._session.request(method, self.base_url + path, json=body,
                                         headers=self._headers if headers is None else headers,
                                         timeout=timeout, **kw) as resp:
            if resp.content_type == "application/json":
                data = await resp.json()
            else:
                data = await resp.text()
            if resp.status >= 400:
                message = data.get("error", str(data)) if isinstance(data, dict) else str(data)
                raise OrchestratorError(resp.status, message)
            return data

    # ---- leases ---------------------------------------------------------------------------------

    async def lease(self, *, timeout_s: float = defaults.LEASE_WAIT_S, ttl_s: float | None = None,
                    client: str | None = None, request_id: str | None = None,
                    k_max: int | None = None) -> LeaseInfo:
        """Wait (long-poll, at most timeout_s) for a chain; 503 OrchestratorError if none frees up. With ``k_max``
        (speculative decoding, at most k_max positions per step) the reply's ``width`` is the one to use.

        Retries (an orchestrator restarting) carry the same ``request_id`` (a fresh random one by default)."""
        body: dict[str, Any] = {"timeout_s": timeout_s, "request_id": request_id or secrets.token_hex(16)}
        if k_max is not None:
            body["k_max"] = k_max
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if client is not None:
            body["client"] = client
        deadline = time.monotonic() + timeout_s
        return LeaseInfo.from_json(await self._call("POST", "/lease", body, timeout_s + 30.0, wait_deadline_s=deadline))

    async def renew(self, lease_id: str, ttl_s: float | None = None) -> LeaseInfo:
        """Keep a lease alive for another TTL."""
        body = {"ttl_s": ttl_s} if ttl_s is not None else None
        return LeaseInfo.from_json(await self._call("POST", f"/lease/{lease_id}/renew", body))

    async def width(self, policy: str | None = None, arrival_rate: float | None = None) -> dict[str, Any]:
        """GET /width (the width rule's state), or with ``policy`` POST it (operator: switch, measure afresh)."""
        if policy is None:
            return await self._call("GET", "/width")
        body: dict[str, Any] = {"policy": policy}
        if arrival_rate is not None:
            body["arrival_rate"] = arrival_rate
        return await self._call("POST", "/width", body)

    async def release(self, lease_id: str) -> dict[str, Any]:
        """Give the slot back (the next waiting request gets it)."""
        return await self._call("POST", f"/lease/{lease_id}/release")

    async def migrated(self, lease_id: str, mode: str | None = None, seconds: float | None = None) -> LeaseInfo:
        """The session of ``lease_id`` now runs on the lease it was offered: the old one ends. ``mode`` and
        ``seconds`` (how long the move held the session) go to the orchestrator's metrics."""
        body = {k: v for k, v in (("mode", mode), ("seconds", seconds)) if v is not None}
        return LeaseInfo.from_json(await self._call("POST", f"/lease/{lease_id}/migrated", body or None))

    async def migration_failed(self, lease_id: str, mode: str | None = None) -> LeaseInfo:
        """The session of ``lease_id`` could not move (in ``mode``): it keeps this lease, the reservation ends."""
        body = {"mode": mode} if mode is not None else None
        return LeaseInfo.from_json(await self._call("POST", f"/lease/{lease_id}/migration-failed", body))

    async def report_failure(self, lease_id: str, server: str, *,
                             timeout_s: float = defaults.LEASE_WAIT_S) -> LeaseInfo:
        """Tell the orchestrator ``server`` failed under this lease; returns the replacement lease."""
        body = {"server": server, "timeout_s": timeout_s}
        return LeaseInfo.from_json(await self._call("POST", f"/lease/{lease_id}/report-failure", body, timeout_s + 30))

    # ---- servers --------------------------------------------------------------------------------

    async def register(self, name: str, *, memory_bytes: float, tau_p_s: float, tau_c_s: float,
                       peer_id: str | None = None, address: str | None = None,
                       max_batch_sessions: int = defaults.MAX_BATCH_SESSIONS,
                       batch_slowdown: Sequence[float] | None = None,
                       device: str | None = None) -> AssignmentInfo | None:
        """Register a server with its memory budget, measured times and what it enforces (the most sessions it
        batches, its g(b) where known, the device it emulates); returns its assignment."""
        body: dict[str, Any] = {"name": name, "memory_bytes": memory_bytes, "tau_p_s": tau_p_s, "tau_c_s": tau_c_s,
                                "max_batch_sessions": max_batch_sessions}
        if batch_slowdown is not None:
            body["batch_slowdown"] = [float(g) for g in batch_slowdown]
        if device is not None:
            body["device"] = device
        if peer_id is not None:
            body["peer_id"] = peer_id
        if address is not None:
            body["address"] = address
        headers = dict(self._headers)
        if name in self.server_secrets:
            headers[SECRET_HEADER] = self.server_secrets[name]
        reply = await self._call("POST", "/servers/register", body, headers=headers)
        if reply.get("secret"):
            self.server_secrets[name] = reply["secret"]
        return AssignmentInfo.from_reply(reply)

    async def heartbeat(self, name: str, *, serving: tuple[int, int] | None = None, tau_p_s: float | None = None,
                        tau_c_s: float | None = None) -> AssignmentInfo | None:
        """Report liveness (and the span served now, as (start, end)); returns the current assignment."""
        body: dict[str, Any] = {"name": name}
        if serving is not None:
            body["serving"] = {"start": serving[0], "end": serving[1]}  # the orchestrator checks the values
        if tau_p_s is not None:
            body["tau_p_s"] = tau_p_s
        if tau_c_s is not None:
            body["tau_c_s"] = tau_c_s
        return AssignmentInfo.from_reply(await self._call("POST", "/servers/heartbeat", body,
                                                          headers=self._as_server(name)))

    async def leave(self, name: str, reason: str = "shutting down") -> dict[str, Any]:
        """Tell the orchestrator this server is going away (it is marked dead and its chains retired)."""
        return await self._call("POST", f"/servers/{name}/leave", {"reason": reason}, headers=self._as_server(name))

    async def drain(self, name: str, *, wait_s: float = 0.0, timeout_s: float | None = None) -> dict[str, Any]:
        """Move every session off server ``name``, then it leaves; waits at most wait_s for that to end. Sent with
        ``name``'s own secret when this client registered it (a server draining itself, which holds no operator
        token), else with this client's token (the operator's)."""
        body: dict[str, Any] = {"wait_s": float(wait_s)}
        if timeout_s is not None:
            body["timeout_s"] = float(timeout_s)
        return await self._call("POST", f"/servers/{name}/drain", body, wait_s + self.request_timeout_s,
                                headers=self._as_server(name))

    async def assignment(self, name: str) -> AssignmentInfo | None:
        """The blocks the orchestrator wants ``name`` to hold."""
        return AssignmentInfo.from_reply(await self._call("GET", f"/servers/{name}/assignment",
                                                          headers=self._as_server(name)))

    async def evict(self, name: str, reason: str = "evicted") -> dict[str, Any]:
        """(operator) Mark ``name`` dead and revoke its secret."""
        return await self._call("POST", f"/servers/{name}/evict", {"reason": reason})

    async def cordon(self, name: str, reason: str = "cordoned", *, resume: bool = False) -> dict[str, Any]:
        """(operator) Stop new leases through ``name`` (``resume``: start them again)."""
        return await self._call("POST", f"/servers/{name}/cordon", {"reason": reason, "resume": resume})

    # ---- views ----------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """Liveness and a summary of composition and load."""
        return await self._call("GET", "/health")

    async def swarm(self) -> dict[str, Any]:
        """GET /swarm: the DHT's initial peers and prefix, and the model the swarm serves."""
        return await self._call("GET", "/swarm")

    async def regions(self) -> dict[str, Any]:
        """GET /regions at a region-aware front: the regions, their anchors and servers."""
        return await self._call("GET", "/regions")

    async def place(self, name: str, *, region: str | None = None,
                    rtt_s: dict[str, float] | None = None) -> dict[str, Any]:
        """POST /servers/place at a region-aware front: the region this server joins and its URL prefix."""
        body: dict[str, Any] = {"name": name}
        if region is not None:
            body["region"] = region
        if rtt_s is not None:
            body["rtt_s"] = rtt_s
        return await self._call("POST", "/servers/place", body)

    async def chains(self) -> dict[str, Any]:
        """The offered chains with capacity and occupancy."""
        return await self._call("GET", "/chains")

    async def servers(self) -> dict[str, Any]:
        """Every registry record (alive or dead) and the composition version."""
        return await self._call("GET", "/servers")

    async def queue(self) -> dict[str, Any]:
        """Length and head of the central queue."""
        return await self._call("GET", "/queue")

    async def metrics(self) -> str:
        """The Prometheus text."""
        return await self._call("GET", "/metrics")
