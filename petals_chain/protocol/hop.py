"""One hop of a chain on the wire: a server and the PETALS blocks start:end it serves (0-indexed, end exclusive).

The one hop type of the live side. The orchestrator's offered chains are tuples of hops (server and blocks; it
fills in ``peer_id`` and ``address`` from its registry when it hands a chain out), a lease reply lists its hops, and
the client routes a session, or moves its KV cache, along them. A named tuple: immutable, hashable and the cheapest
record to build, which matters because the orchestrator builds one per hop of every lease reply; the reply models
that hold hops validate them on the reader's side (:mod:`petals_chain.protocol.replies`). The algorithm's chain
(:class:`petals_chain.model.Chain`, blocks per server index) stays in ``model.py``.
"""

from __future__ import annotations

from typing import NamedTuple


class Hop(NamedTuple):
    """Server ``server`` serves blocks ``start:end``; ``peer_id`` (base58) and ``address`` once the server told them."""

    server: str
    start: int
    end: int
    peer_id: str | None = None
    address: str | None = None
