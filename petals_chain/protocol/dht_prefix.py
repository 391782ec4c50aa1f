"""The DHT conventions a server and the orchestrator share: multiaddrs checked alike, the model's DHT prefix.

The orchestrator starts or joins the DHT (:mod:`petals_chain.orchestrator.dht`) and tells servers its multiaddrs
and prefix in ``GET /health``; a server checks what it was given with the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from petals_chain.model import SpecError


def check_maddrs(values: Sequence[str], field: str) -> list[str]:
    """Multiaddrs, each parsed by the multiaddr library; SpecError naming the bad one."""
    from hivemind.utils.multiaddr import Multiaddr

    out = []
    for v in values:
        try:
            Multiaddr(v)
        except Exception as exc:  # the library raises several unrelated types
            raise SpecError(f"{field}: {v!r} is not a multiaddr (example: /ip4/127.0.0.1/tcp/31337): {exc}") from None
        out.append(v)
    return out


def dht_prefix_for(name: str) -> str:
    """A PETALS DHT prefix from a model name: '.' and ' ' (PETALS' delimiters) become '-'."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"DHT prefix must be a non-empty string, got {name!r}")
    return name.strip().replace(".", "-").replace(" ", "-")
