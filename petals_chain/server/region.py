"""``--region``: which region of a region-aware orchestrator a server joins, before it registers there.

docs/torta.md, "On the swarm: regions". ``--region NAME`` asks the front (POST /servers/place) to place the server in
that region; ``--region auto`` first measures the round trip to every region's anchor (GET /regions names them; a
region without one is measured at the front's ``/regions/NAME/health``) and lets the front cluster it into a region.
Either way the server then registers, heartbeats and leaves under ``/regions/REGION``, as with a single
orchestrator. An unknown region or a refused placement is an OrchestratorError (one line, exit 2), before anything
is registered anywhere.
"""

from __future__ import annotations

import statistics
import time
import urllib.request

from petals_chain import defaults
from petals_chain.protocol.blocking import BlockingOrchestrator

AUTO = "auto"  # --region auto: placed by measured RTTs
RTT_SAMPLES = 5


def measure_rtt_s(url: str, samples: int = RTT_SAMPLES, timeout_s: float = defaults.CALL_TIMEOUT_S) -> float:
    """Median round trip of an HTTP GET to ``url`` (any status counts: the answer arrived), after one warm-up."""

    def once() -> float:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                r.read()
        except urllib.error.HTTPError as exc:  # an answer all the same
            exc.read()
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(samples))


def anchor_rtts(front_url: str, regions: dict) -> dict[str, float]:
    """The measured round trip to every region's anchor (the front's region health URL where none is set)."""
    base = front_url.rstrip("/")
    return {r["name"]: measure_rtt_s(r.get("anchor") or f"{base}{r['path']}/health") for r in regions["regions"]}


def place_server(front_url: str, name: str, region: str, token: str | None = None) -> tuple[str, dict]:
    """Ask the front where server ``name`` goes (``region``: a name or ``auto``); its region's URL and the reply."""
    front = BlockingOrchestrator(front_url, token=token)
    try:
        if region == AUTO:
            rtts = anchor_rtts(front_url, front.run(lambda c: c.regions(), timeout_s=defaults.CALL_TIMEOUT_S))
            reply = front.run(lambda c: c.place(name, rtt_s=rtts), timeout_s=defaults.CALL_TIMEOUT_S)
        else:
            reply = front.run(lambda c: c.place(name, region=region), timeout_s=defaults.CALL_TIMEOUT_S)
    finally:
        front.close()
    return front_url.rstrip("/") + reply["path"], reply
