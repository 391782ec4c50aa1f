"""The orchestrator checks servers itself, through its own DHT node, instead of taking their word.

Three questions, each answered from the swarm rather than from what a caller says (docs/trust.md, "Seeing is
believing"): is a peer id present (it answers a DHT ping sent to that id, which only the holder of the id's key can
answer), does it announce the blocks it was assigned (PETALS' module records in the DHT list the peer as online
for every block of its span) and does it serve them (it answers PETALS' ``rpc_info`` for its first block, over a
connection authenticated as that peer id). :class:`PeerVerifier` is the protocol the orchestrator uses;
:class:`DhtVerifier` answers it with hivemind and petals.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0  # a DHT ping or rpc_info that takes longer counts as no answer


class PeerVerifier(Protocol):
    """What the orchestrator asks about a peer before it believes a server (every answer False on doubt)."""

    async def present(self, peer_id: str) -> bool:
        """The peer answers a direct DHT ping under this peer id."""
        ...

    async def announces(self, peer_id: str, start: int, end: int) -> bool:
        """The DHT lists the peer as online for every block start..end-1."""
        ...

    async def serves(self, peer_id: str, start: int, end: int) -> bool:
        """The peer answers rpc_info for block ``start`` directly (it hosts it)."""
        ...


async def _ping(_dht: Any, node: Any, peer_id: str, timeout_s: float) -> bool:
    """Inside the DHT process: a direct DHT ping to peer_id."""
    from hivemind.p2p import PeerID

    try:
        peer = PeerID.from_base58(peer_id)
    except Exception:  # not a peer id at all
        return False
    try:
        return await asyncio.wait_for(node.protocol.call_ping(peer), timeout_s) is not None
    except Exception:  # timeout, unreachable: no answer
        return False


async def _rpc_info(_dht: Any, node: Any, peer_id: str, uid: str, timeout_s: float) -> bool:
    """Inside the DHT process: PETALS' rpc_info for ``uid`` sent straight to peer_id."""
    from hivemind.p2p import PeerID
    from hivemind.proto import runtime_pb2
    from petals.server.handler import TransformerConnectionHandler

    try:
        peer = PeerID.from_base58(peer_id)
    except Exception:
        return False
    try:
        stub = TransformerConnectionHandler.get_stub(node.p2p, peer)
        await asyncio.wait_for(stub.rpc_info(runtime_pb2.ExpertUID(uid=uid)), timeout_s)
        return True
    except Exception:  # no such peer, no such block there, timeout
        return False


class DhtVerifier:
    """Answers :class:`PeerVerifier` from a running hivemind DHT node (the orchestrator's own)."""

    def __init__(self, dht: Any, dht_prefix: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.dht = dht
        self.prefix = dht_prefix
        self.timeout_s = timeout_s

    def _uid(self, block: int) -> str:
        """PETALS' module uid of a block: ``{prefix}.{index}``."""
        return f"{self.prefix}.{block}"

    async def _in_dht(self, fn: Any) -> Any:
        """Run ``fn(dht, node)`` in the DHT process without blocking the event loop."""
        future = self.dht.run_coroutine(fn, return_future=True)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(future.result, self.timeout_s * 2))

    async def present(self, peer_id: str) -> bool:
        """A direct DHT ping to the peer id answers."""
        try:
            return bool(await self._in_dht(functools.partial(_ping, peer_id=peer_id, timeout_s=self.timeout_s)))
        except Exception as exc:  # the DHT node itself failed: no belief either way, so no
            log.warning("DHT ping of %s failed: %s: %s", peer_id, type(exc).__name__, exc)
            return False

    async def announces(self, peer_id: str, start: int, end: int) -> bool:
        """Every block of start:end lists the peer as ONLINE in the DHT (PETALS' module records)."""
        if end <= start:
            return False
        from petals.data_structures import ServerState
        from petals.utils.dht import get_remote_module_infos

        uids = [self._uid(b) for b in range(start, end)]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.run_in_executor(
                None, functools.partial(get_remote_module_infos, self.dht, uids, latest=True)), self.timeout_s * 2)
        except Exception as exc:
            log.warning("reading the DHT records of %s..%s failed: %s: %s", uids[0], uids[-1], type(exc).__name__, exc)
            return False
        for info in infos:
            entry = next((s for p, s in info.servers.items() if p.to_base58() == peer_id), None)
            if entry is None or entry.state != ServerState.ONLINE:
                return False
        return True

    async def serves(self, peer_id: str, start: int, end: int) -> bool:
        """rpc_info for block ``start`` answered by the peer itself."""
        if end <= start:
            return False
        fn = functools.partial(_rpc_info, peer_id=peer_id, uid=self._uid(start), timeout_s=self.timeout_s)
        try:
            return bool(await self._in_dht(fn))
        except Exception as exc:
            log.warning("rpc_info to %s failed: %s: %s", peer_id, type(exc).__name__, exc)
            return False
