"""A session's lease release never blocks its caller (issue 23): with the orchestrator unreachable, releasing returns
at once, the release is retried in the background and lands once the orchestrator is back.

A real orchestrator (the HTTP app over the whole-model composer of tests/orchestrator/test_restart.py) runs on its own
event-loop thread on a fixed loopback port; it is stopped (nothing listens: connections are refused, as while it
restarts) and served again on the same port. Its clock stands still, so no lease can expire: a slot that comes back
was given back by the release.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from petals_chain.client.lease import LeaseKeeper
from petals_chain.orchestrator.http.api import build_app
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.state.store import StateStore
from petals_chain.protocol.blocking import BlockingOrchestrator
from tests.orchestrator.test_restart import Clock, _free_port, registered

PROMPT_S = 1.0  # "returns at once": well under one request timeout, on a busy 2-core machine


class OrchestratorThread:
    """An orchestrator served from its own event-loop thread, which can stop listening and listen again."""

    def __init__(self, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.orch: Orchestrator = self.call(registered(Clock(), StateStore(tmp_path / "state.db")))
        self.runner: web.AppRunner | None = None

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a coroutine on the orchestrator's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def up(self) -> None:
        """Serve the orchestrator's API on the port."""

        async def start() -> web.AppRunner:
            runner = web.AppRunner(build_app(self.orch))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            return runner

        self.runner = self.call(start())

    def down(self) -> None:
        """Stop listening (the orchestrator keeps its state, as one restored after a restart)."""
        if self.runner is not None:
            self.call(self.runner.cleanup())
            self.runner = None

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    @property
    def active(self) -> int:
        """Leases held now."""
        return self.orch.leases.snapshot().active


def _wait(pred, timeout_s: float, what: str) -> None:
    """Poll a condition (20 ms) until it holds; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_release_returns_at_once_while_unreachable_and_lands_once_the_orchestrator_is_back(tmp_path: Path) -> None:
    server = OrchestratorThread(tmp_path)
    server.up()
    orch = BlockingOrchestrator(server.url, unreachable_wait_s=60.0)
    try:
        info = orch.run(lambda c: c.lease(timeout_s=5))
        keeper = LeaseKeeper(orch, info, ttl_s=60.0)
        assert server.active == 1
        server.down()

        done = threading.Event()
        t0 = time.monotonic()
        threading.Thread(target=lambda: (keeper.release(), done.set()), daemon=True).start()
        assert done.wait(PROMPT_S), "release() waited for the unreachable orchestrator"
        assert time.monotonic() - t0 < PROMPT_S
        keeper.release()  # idempotent: nothing more is sent
        _wait(lambda: orch._client is not None and orch._client.retries >= 2, 10, "the release to be retried")
        assert keeper.releasing is not None and not keeper.releasing.done()
        assert server.active == 1

        server.up()  # back: the retried release lands (the clock stands still, so it is not an expiry)
        _wait(lambda: server.active == 0, 15, "the background release to reach the orchestrator")
        keeper.releasing.result(5)
        assert server.orch.leases.counters.released == 1 and server.orch.leases.counters.expired == 0

        # closing the client while a release is still unsent waits only its short grace, then gives up (the TTL
        # frees that slot)
        second = LeaseKeeper(orch, orch.run(lambda c: c.lease(timeout_s=5)), ttl_s=60.0)
        server.down()
        second.release()
        t0 = time.monotonic()
        orch.close(background_wait_s=0.3)
        assert time.monotonic() - t0 < 0.3 + 5.0 + PROMPT_S  # the grace, then the session's own bounded close
        assert second.releasing is not None and second.releasing.done()
    finally:
        orch.close()
        server.close()
