"""The blocking faces of the async OrchestratorClient, for synchronous code.

``BlockingOrchestrator`` is for PETALS' synchronous server and client code: one daemon thread runs an asyncio loop
with one ``OrchestratorClient``; any thread calls ``run(coro_fn)`` and waits. Long-polls (a lease waiting in the
queue) do not block other calls: they are coroutines on that loop. ``request_json`` is one call, for launchers,
experiments and tests that GET or POST a route now and then: the same client code, tried once (no retry while
the orchestrator cannot be reached: their own loops poll).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from petals_chain import defaults
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorUnreachableError

T = TypeVar("T")


class BlockingOrchestrator:
    """Calls the orchestrator's HTTP API from synchronous code, through a private event-loop thread."""

    def __init__(self, url: str, *, token: str | None = None,
                 request_timeout_s: float = defaults.CALL_TIMEOUT_S,
                 unreachable_wait_s: float = defaults.UNREACHABLE_WAIT_S) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"orchestrator URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self._token = token
        self._request_timeout_s = request_timeout_s
        self._unreachable_wait_s = unreachable_wait_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="orchestrator-client", daemon=True)
        self._thread.start()
        self._client: OrchestratorClient | None = None
        self._closed = False
        self._background: set[concurrent.futures.Future] = set()  # fire-and-forget calls still running

    async def _get_client(self) -> OrchestratorClient:
        """The loop's client (created on the loop, so that aiohttp binds to it)."""
        if self._client is None:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            self._client = OrchestratorClient(self.url, token=self._token, session=session,
                                              request_timeout_s=self._request_timeout_s,
                                              unreachable_wait_s=self._unreachable_wait_s)
            self._session = session
        return self._client

    def submit(self, fn: Callable[[OrchestratorClient], Awaitable[T]]) -> concurrent.futures.Future:
        """Schedule ``fn(client)`` (a coroutine function or a lambda returning a coroutine) on the loop."""
        if self._closed or not self._thread.is_alive():
            raise RuntimeError(f"BlockingOrchestrator({self.url}) is closed")

        async def call() -> T:
            """fn on the loop's client."""
            return await fn(await self._get_client())

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    def run(self, fn: Callable[[OrchestratorClient], Awaitable[T]], timeout_s: float | None = None) -> T:
        """Run ``fn(client)`` on the loop and wait for its result; connection failures become a clear error."""
        fut = self.submit(fn)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"orchestrator {self.url} did not answer within {timeout_s:g} s") from None
        except OrchestratorUnreachableError:
            raise
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise OrchestratorUnreachableError(f"cannot reach the orchestrator at {self.url}: {exc}") from exc

    def spawn(self, coro: Awaitable[Any]) -> concurrent.futures.Future:
        """Run a coroutine (e.g. a renewal loop) on the loop in the background."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def background(self, coro: Awaitable[Any]) -> concurrent.futures.Future:
        """Run a call nobody waits for (a lease release) on the loop; :meth:`close` gives it a moment to finish.
        RuntimeError once closed."""
        if self._closed or not self._thread.is_alive():
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # never awaited: no "coroutine was never awaited" warning
            raise RuntimeError(f"BlockingOrchestrator({self.url}) is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)
        return fut

    def close(self, background_wait_s: float = defaults.BACKGROUND_WAIT_S) -> None:
        """Give background calls (lease releases) at most ``background_wait_s`` to finish, then close the HTTP session
        and stop the loop thread (what is left is cancelled: an unsent release's lease expires after its TTL)."""
        if self._closed:
            return
        self._closed = True
        pending = list(self._background)
        if pending:
            concurrent.futures.wait(pending, timeout=background_wait_s)
            for fut in pending:
                fut.cancel()

        async def shutdown() -> None:
            """Close the aiohttp session on its own loop."""
            if self._client is not None:
                await self._session.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5.0)
        except Exception:  # closing is best effort: the process may be exiting
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


def request_json(url: str, timeout_s: float = 10.0, data: dict[str, Any] | None = None,
                 token: str | None = None) -> Any:
    """GET ``url`` (or POST ``data`` to it) with an optional bearer token and return the JSON reply, from synchronous
    code. Tried once: OrchestratorUnreachableError (a ConnectionError) when it cannot be reached, TimeoutError after
    ``timeout_s``, OrchestratorError on an error status, ValueError on a reply that is not JSON.

    The call runs on a private event loop in a short-lived thread of its own, so the calling thread's loop, running
    or not (a test driving a browser through Playwright runs one), is never touched."""

    async def once() -> Any:
        """One call through a client of its own."""
        async with OrchestratorClient(url, token=token, request_timeout_s=timeout_s, unreachable_wait_s=0.0) as oc:
            return await oc.call("GET" if data is None else "POST", "", data)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-json") as pool:
        reply = pool.submit(asyncio.run, once()).result()
    if isinstance(reply, str):
        raise ValueError(f"{url} answered with text, not JSON: {reply[:200]!r}")
    return reply
