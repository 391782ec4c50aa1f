"""The names the KV-cache transfer between PETALS servers is keyed by, shared by the moving client and the servers.

A client that moves a session (:mod:`petals_chain.client.kv_migrate`) opens it on the new servers with
:data:`KV_IMPORT_KEY` in its first request's metadata; the server's handler (:mod:`petals_chain.server.kv_handler`)
reads it there. Both address blocks by the number at the end of petals' module uid (:func:`block_index`).
"""

from __future__ import annotations

from petals.data_structures import UID_DELIMITER

KV_IMPORT_KEY = "kv_import"  # metadata of a session's first request: where to take its cache from


def block_index(uid: str) -> int:
    """The block number at the end of a petals module uid ('prefix.17' -> 17)."""
    return int(uid.rsplit(UID_DELIMITER, 1)[1])
