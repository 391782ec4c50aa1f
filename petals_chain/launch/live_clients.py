"""The clients of the live methods: one real ``generate()`` per request, timed as the replay records it.

:class:`PetalsClient` is the plain PETALS client (its own routing and retries; only timestamps are
added); :class:`LeasingClient` leases a chain from the orchestrator (JFFC or WS-RR) before each session.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from petals_chain import defaults
from petals_chain.launch.live_setup import ModelSetup


@dataclass
class RequestTiming:
    """What one request saw (time.monotonic() seconds): service start, end, its route, failed attempts, error."""

    start_s: float | None = None
    end_s: float | None = None
    first_step_s: float | None = None
    route: str = ""
    failed_attempts: int = 0
    tokens: int = 0
    error: str | None = None


def _petals_session_class() -> type:
    """A petals InferenceSession that only timestamps its routing attempts (behaviour unchanged)."""
    from petals.client.inference_session import InferenceSession

    class RecordingInferenceSession(InferenceSession):
        """petals' InferenceSession, recording when each (re)routing happened and when the first step ended."""

        def __init__(self, sequence_manager: Any, max_length: int) -> None:
            super().__init__(sequence_manager, max_length)
            self.route_times: list[float] = []
            self.first_step_s: float | None = None
            self.spans: list[Any] = []

        def _update_sequence(self, server_idx: int, block_idx: int, attempt_no: int) -> int:
            """Timestamp, then petals' own re-routing."""
            self.route_times.append(time.monotonic())
            out = super()._update_sequence(server_idx, block_idx, attempt_no)
            self.spans = [s.span for s in self._server_sessions]
            return out

        def step(self, *args: Any, **kwargs: Any) -> Any:
            """petals' step; the end of the first one is when the job surely holds its cache everywhere."""
            out = super().step(*args, **kwargs)
            if self.first_step_s is None:
                self.first_step_s = time.monotonic()
            return out

    return RecordingInferenceSession


class PetalsClient:
    """The plain PETALS client (its own routing and retries) for all requests of a replay."""

    def __init__(self, setup: ModelSetup, initial_peers: Sequence[str], time_dilation: float = 1.0) -> None:
        import petals

        self.setup = setup
        timing = {}
        if time_dilation != 1.0:  # a dilated testbed: PETALS' own waits (timeouts, backoff, bans) × k as well
            from petals.client.config import ClientConfig

            timing = {f: getattr(ClientConfig, f) * time_dilation
                      for f in ("request_timeout", "update_period", "min_backoff", "max_backoff", "ban_timeout")}
        self.model = petals.AutoDistributedModelForCausalLM.from_pretrained(
            str(setup.model_dir), initial_peers=list(initial_peers), dht_prefix=setup.dht_prefix, show_route=False,
            **timing)
        self._session_cls = _petals_session_class()
        self.names: dict[str, str] = {}

    def serve(self, prompt: Any, new_tokens: int) -> RequestTiming:
        """One request: a session reserving the static job length, greedy generation of exactly new_tokens."""
        out = RequestTiming()
        sess = self._session_cls(self.model.transformer.h.sequence_manager, max_length=self.setup.max_length)
        try:
            with sess:
                ids = self.model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False, session=sess)
                out.tokens = int(ids.shape[1] - prompt.shape[1])
        except Exception as exc:  # recorded per request; the replay goes on
            out.error = f"{type(exc).__name__}: {exc}"
        out.end_s = time.monotonic()
        out.first_step_s = sess.first_step_s
        if sess.first_step_s is not None:
            before = [t for t in sess.route_times if t <= sess.first_step_s]
            out.start_s = before[-1] if before else sess.first_step_s
            out.failed_attempts = max(0, len(before) - 1)
        out.route = " -> ".join(f"{self.names.get(s.peer_id.to_base58(), str(s.peer_id)[-6:])}[{s.start}:{s.end}]"
                                for s in sess.spans)
        return out

    def close(self) -> None:
        """Stop the client's routing thread and its DHT node."""
        manager = self.model.transformer.h.sequence_manager
        with contextlib.suppress(Exception):
            manager.shutdown()
        with contextlib.suppress(Exception):
            manager.dht.shutdown()


class LeasingClient:
    """The orchestrated client: every session leases a chain (JFFC or WS-RR) before it starts."""

    def __init__(self, setup: ModelSetup, url: str, lease_timeout_s: float = 3600.0) -> None:
        from petals_chain.client.model import AutoDistributedModelForCausalLM

        self.setup = setup
        self.model = AutoDistributedModelForCausalLM.from_pretrained(
            str(setup.model_dir), orchestrator=url, lease_timeout_s=lease_timeout_s, lease_ttl_s=defaults.LEASE_TTL_S,
            show_route=False)

    def serve(self, prompt: Any, new_tokens: int) -> RequestTiming:
        """One request: lease (waits in the orchestrator's queue), generate exactly new_tokens, release."""
        out = RequestTiming()
        sess = None
        try:
            sess = self.model.transformer.h.open_session(max_length=self.setup.max_length)
            out.start_s = time.monotonic()
            out.route = sess.record.route() if sess.record is not None else ""
            ids = self.model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      session=sess)
            out.tokens = int(ids.shape[1] - prompt.shape[1])
        except Exception as exc:  # recorded per request; the replay goes on
            out.error = f"{type(exc).__name__}: {exc}"
        finally:
            if sess is not None:
                sess.close()
        out.end_s = time.monotonic()
        return out

    def close(self) -> None:
        """Close the orchestrator connection and the client's DHT node."""
        manager = self.model.transformer.h.sequence_manager
        with contextlib.suppress(Exception):
            self.model.orchestrator.close()
        with contextlib.suppress(Exception):
            manager.shutdown()
        with contextlib.suppress(Exception):
            manager.dht.shutdown()
