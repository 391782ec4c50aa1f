"""The PETALS client through orchestrator leases: every inference session runs along a chain JFFC chose.

``AutoDistributedModelForCausalLM.from_pretrained(DIR, orchestrator=URL)`` loads a
petals model and swaps in two subclasses at petals' plug-in points:

* ``OrchestratedRemoteSequential.inference_session`` opens a ``LeasedInferenceSession``:
  entering it takes a lease (waiting in the orchestrator's FIFO queue while every
  chain is full), a background task renews the lease while the session lives, and
  closing it releases the lease — also when generation raised.
* ``OrchestratedSequenceManager.make_sequence`` routes a leased session exactly along
  its lease's spans (peer ids and block ranges) instead of petals' Dijkstra routing.

``model.generate()`` and ``model.inference_session()`` are unchanged for the user.
Forward passes outside a session (training, scoring) keep petals' own routing.

Failover: a leased session lets petals try each step once (``max_retries=1`` on its
view); ``OrchestratedSequenceManager.on_request_failure`` remembers the failed peer, and
``LeasedInferenceSession.step`` then closes every server session of the broken chain,
asks the orchestrator what became of that server (``GET /servers``) and either reports it
dead (``POST /lease/{id}/report-failure``: the replacement lease takes the old one's
place), takes a new lease (its chain was retired by a recomposition), or waits for it to
finish loading its span; then it replays the whole session's inputs along the (new) chain
and finishes the step, so the output stays token-identical. The old lease is never kept
and the current one is released at close. patches/0002 makes petals notice a dead server
within about a second (see patches/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from hivemind.p2p import P2PHandlerError
from petals.client.inference_session import InferenceSession
from petals.client.remote_sequential import RemoteSequential
from petals.client.routing.sequence_manager import RemoteSequenceManager
from petals.utils.misc import is_dummy

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.orchestrator.blocking import BlockingOrchestrator
from petals_chain.orchestrator.client import LeaseInfo, OrchestratorError

log = logging.getLogger("petals_chain.client")


class LeaseRouteError(RuntimeError):
    """A lease's spans do not cover the blocks a session needs, or name a server without a peer id."""


class FailoverError(RuntimeError):
    """A leased session could not be moved off a failed server (no replacement chain, or too many failovers)."""


@dataclass
class FailoverRecord:
    """One recovery of a leased session: which server failed, what the client did about it, and when.

    ``action``: 'reported' (the server is gone: the orchestrator marked it dead and gave a replacement lease),
    'moved' (a recomposition retired the chain: a new lease), 'reloading' (the server was loading its span:
    waited, same lease), 'refused' (it answered with an error on a stable chain: retried once, same lease).
    """

    server: str
    action: str
    cause: str
    from_lease: str
    from_chain: str
    to_lease: str | None = None
    to_chain: str | None = None
    replayed_tokens: int = 0
    queue_waited_s: float = 0.0  # of the recovery: time the new lease waited for a free slot (orchestrator's view)
    step_started_s: float = 0.0  # time.monotonic() when the step that failed began
    detected_s: float = 0.0  # when petals gave the failure back
    recovered_s: float | None = None  # when that step completed on the new route

    @property
    def recovery_s(self) -> float | None:
        """Failure seen → step completed on the new route (report, new lease, replay)."""
        return None if self.recovered_s is None else self.recovered_s - self.detected_s

    @property
    def stall_s(self) -> float | None:
        """Start of the failed step → its completion: what the user waited (detection included)."""
        return None if self.recovered_s is None else self.recovered_s - self.step_started_s


@dataclass
class SessionRecord:
    """What one leased session did: its chain, how long it waited for a slot and how long it was served."""

    client: str | None
    requested_s: float  # time.monotonic() when the session asked for a lease
    lease_id: str | None = None
    chain_id: str | None = None
    version: int | None = None
    spans: tuple[tuple[str, int, int], ...] = ()
    waited_s: float | None = None  # request → lease granted, as the client saw it
    queue_waited_s: float | None = None  # time in the orchestrator's queue, as the orchestrator saw it
    service_s: float | None = None  # lease granted → session closed
    error: str | None = None
    failovers: list[FailoverRecord] = field(default_factory=list)  # lease/chain/spans above: the last lease

    @property
    def response_s(self) -> float | None:
        """Waiting + service."""
        if self.waited_s is None or self.service_s is None:
            return None
        return self.waited_s + self.service_s

    def route(self) -> str:
        """'s1[0:15] -> s2[15:30]'."""
        return " -> ".join(f"{s}[{a}:{b}]" for s, a, b in self.spans)


class LeaseKeeper:
    """Holds one lease: renews it every ttl/3 on the orchestrator loop, releases it exactly once."""

    def __init__(self, orch: BlockingOrchestrator, info: LeaseInfo, ttl_s: float) -> None:
        self.orch = orch
        self.info = info
        self.ttl_s = ttl_s
        self._released = False
        self._lock = threading.Lock()
        self._renewer = orch.spawn(self._renew_loop())

    def stop(self) -> None:
        """Stop renewing without releasing: the orchestrator already ended this lease (reported failure)."""
        with self._lock:
            self._released = True
        self._renewer.cancel()

    async def _renew_loop(self) -> None:
        """Renew until cancelled; a failed renewal is logged (the lease may then expire)."""
        client = await self.orch._get_client()
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await client.renew(self.info.lease_id)
            except OrchestratorError as exc:
                log.warning("lease %s could not be renewed: %s", self.info.lease_id, exc.message)
                return
            except Exception as exc:  # orchestrator briefly unreachable: try again next period
                log.warning("renewing lease %s failed: %s", self.info.lease_id, exc)

    def release(self) -> None:
        """Stop renewing and give the slot back (idempotent; an expired lease is not an error)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._renewer.cancel()

        try:
            self.orch.run(lambda c: c.release(self.info.lease_id), timeout_s=defaults.CALL_TIMEOUT_S)
        except OrchestratorError as exc:
            if exc.status != 404:  # 404: expired or already released
                log.warning("releasing lease %s: %s", self.info.lease_id, exc.message)
        except Exception as exc:  # unreachable: the lease expires after its TTL
            log.warning("releasing lease %s failed (%s); it will expire after %g s", self.info.lease_id, exc,
                        self.ttl_s)


@dataclass
class LeaseOptions:
    """How sessions lease: wait at most timeout_s in the queue, TTL of a lease, a label for the orchestrator."""

    timeout_s: float = defaults.LEASE_WAIT_S
    ttl_s: float = defaults.LEASE_TTL_S
    client: str | None = None
    records: list[SessionRecord] = field(default_factory=list)
    keep_records: int = 10_000
    max_failovers: int = 8  # per step: more failed chains than this and the step raises FailoverError
    reload_wait_s: float = 120.0  # how long a session waits for a server of its chain to finish loading its span

    def __post_init__(self) -> None:
        for name in ("timeout_s", "ttl_s", "reload_wait_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise SpecError(f"lease option '{name}' must be > 0 seconds, got {v!r}")
        if not (isinstance(self.max_failovers, int) and self.max_failovers >= 0):
            raise SpecError(f"lease option 'max_failovers' must be an integer >= 0, got {self.max_failovers!r}")


class OrchestratedSequenceManager(RemoteSequenceManager):
    """petals' sequence manager that routes a leased session along its lease's spans."""

    lease: LeaseInfo | None = None
    failed_peer: Any = None  # the peer whose request failed last (a leased view fails over from it)

    def __init__(self, config: Any, block_uids: Any, *, orchestrator: BlockingOrchestrator,
                 options: LeaseOptions | None = None, dht: Any = None, state: Any = None) -> None:
        super().__init__(config, block_uids, dht=dht, state=state)
        self.orchestrator = orchestrator
        self.options = options or LeaseOptions()
        self.records_lock = threading.Lock()

    @classmethod
    def replacing(cls, manager: RemoteSequenceManager, orchestrator: BlockingOrchestrator,
                  options: LeaseOptions | None = None) -> OrchestratedSequenceManager:
        """A leasing manager sharing an existing manager's DHT and state (its update thread never started)."""
        new = cls(manager.config, manager.block_uids, orchestrator=orchestrator, options=options, dht=manager.dht,
                  state=manager.state)
        manager.shutdown()
        return new

    def with_lease(self, lease: LeaseInfo) -> OrchestratedSequenceManager:
        """A view of this manager (same DHT, state, threads) that routes along ``lease``; petals tries each step
        once on it, and a failure comes back to ``LeasedInferenceSession.step``, which fails over."""
        view = copy.copy(self)
        view.lease = lease
        view.failed_peer = None
        view.config = copy.copy(self.config)
        view.config.max_retries = 1
        return view

    def on_request_failure(self, peer_id: Any) -> None:
        """Remember the failed peer (for the leased session's failover), then petals' own bookkeeping."""
        if self.lease is not None:
            self.failed_peer = peer_id
        super().on_request_failure(peer_id)

    def __getitem__(self, ix: int | slice) -> OrchestratedSequenceManager:
        """A manager for a sub-sequence of blocks, still leasing (and still on this view's lease)."""
        if not isinstance(ix, slice):
            ix = slice(int(ix), int(ix) + 1, 1)
        sub = type(self)(self.config, self.block_uids[ix], orchestrator=self.orchestrator, options=self.options,
                         dht=self.dht, state=self.state[ix])
        sub.lease = self.lease
        return sub

    @property
    def block_offset(self) -> int:
        """Absolute index (in the whole model) of this manager's first block."""
        from petals.data_structures import parse_uid

        return parse_uid(self.block_uids[0])[1]

    def lease_spans(self, start_index: int, end_index: int) -> list[Any]:
        """The lease's hops clipped to blocks [start_index, end_index) of this manager, as RemoteSpanInfo."""
        from hivemind.p2p import PeerID
        from petals.data_structures import RemoteSpanInfo, ServerInfo, ServerState

        assert self.lease is not None
        off = self.block_offset
        lo, hi = start_index + off, end_index + off
        spans, pos = [], lo
        for hop in self.lease.spans:
            a, b = max(hop.start, pos), min(hop.end, hi)
            if a >= b:
                continue
            if a != pos:
                break
            if not hop.peer_id:
                raise LeaseRouteError(f"lease {self.lease.lease_id}: server {hop.server!r} has no peer id "
                                      "(it never registered itself)")
            info = ServerInfo(state=ServerState.ONLINE, throughput=1.0, start_block=hop.start, end_block=hop.end,
                              public_name=hop.server)
            spans.append(RemoteSpanInfo(PeerID.from_base58(hop.peer_id), a - off, b - off, info))
            pos = b
        if pos != hi:
            raise LeaseRouteError(f"lease {self.lease.lease_id} (chain {self.lease.chain_id}) does not cover blocks "
                                  f"{lo}:{hi}; its spans: {[(h.server, h.start, h.end) for h in self.lease.spans]}")
        return spans

    def make_sequence(self, start_index: int = 0, end_index: int | None = None, *, mode: str,
                      cache_tokens_needed: int | None = None) -> list[Any]:
        """The leased chain's spans for an inference session; petals' own routing for lease-free forward passes."""
        end_index = end_index if end_index is not None else len(self)
        if self.lease is None:
            if mode == "min_latency":
                raise LeaseRouteError("inference sessions must be opened with model.inference_session() (or "
                                      "model.generate()) so that they lease a chain from the orchestrator")
            return super().make_sequence(start_index, end_index, mode=mode, cache_tokens_needed=cache_tokens_needed)
        spans = self.lease_spans(start_index, end_index)
        if self.config.show_route is True or (mode == "min_latency" and self.config.show_route == "inference"):
            route = " => ".join(f"{s.start}:{s.end} via {s.server_info.public_name}" for s in spans)
            log.info("route of lease %s (chain %s): %s", self.lease.lease_id, self.lease.chain_id, route)
        return spans

    @property
    def rpc_info(self) -> dict:
        """Block metadata, fetched from the leased chain's first server when not known yet (no DHT wait)."""
        if self.state.rpc_info is None and self.lease is not None:
            from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
            from hivemind.proto import runtime_pb2
            from hivemind.utils.serializer import MSGPackSerializer
            from petals.server.handler import TransformerConnectionHandler

            first = self.lease_spans(0, 1)[0]
            stub = TransformerConnectionHandler.get_stub(self.state.p2p, first.peer_id)
            out = RemoteExpertWorker.run_coroutine(
                stub.rpc_info(runtime_pb2.ExpertUID(uid=self.block_uids[0]), timeout=self.config.request_timeout)
            )
            self.state.rpc_info = MSGPackSerializer.loads(out.serialized_info)
        return super().rpc_info

    def add_record(self, record: SessionRecord) -> None:
        """Keep a finished session's record (bounded)."""
        with self.records_lock:
            recs = self.options.records
            recs.append(record)
            if len(recs) > self.options.keep_records:
                del recs[: len(recs) - self.options.keep_records]


class LeasedInferenceSession(InferenceSession):
    """A petals InferenceSession that holds an orchestrator lease from __enter__ to close()."""

    def __init__(self, sequence_manager: OrchestratedSequenceManager, max_length: int) -> None:
        self._keeper: LeaseKeeper | None = None
        self.record: SessionRecord | None = None
        self._granted_s: float | None = None
        self._base_manager = sequence_manager
        self._history: torch.Tensor | None = None  # every input stepped so far: replayed on a replacement chain
        self._refusals = 0
        super().__init__(sequence_manager, max_length)

    @property
    def lease(self) -> LeaseInfo | None:
        """The lease this session runs on (None before __enter__ / after a failed wait)."""
        return self._keeper.info if self._keeper is not None else None

    def __enter__(self) -> LeasedInferenceSession:
        """Take a lease (waits in the orchestrator's FIFO queue while every chain is full)."""
        super().__enter__()
        base = self._base_manager
        opts = base.options
        self.record = SessionRecord(client=opts.client, requested_s=time.monotonic())

        try:
            info = base.orchestrator.run(
                lambda c: c.lease(timeout_s=opts.timeout_s, ttl_s=opts.ttl_s, client=opts.client),
                timeout_s=opts.timeout_s + 60.0,
            )
        except BaseException as exc:
            self.record.error = f"{type(exc).__name__}: {exc}"
            base.add_record(self.record)
            self._closed = True
            raise
        self._granted_s = time.monotonic()
        self._use_lease(info)
        r = self.record
        r.waited_s, r.queue_waited_s = self._granted_s - r.requested_s, info.waited_s
        return self

    def _use_lease(self, info: LeaseInfo) -> LeaseKeeper | None:
        """Hold ``info`` from now on (renewed, released at close) and route along it; returns the previous keeper."""
        base = self._base_manager
        old, self._keeper = self._keeper, LeaseKeeper(base.orchestrator, info, base.options.ttl_s)
        self._sequence_manager = base.with_lease(info)
        r = self.record
        if r is not None:
            r.lease_id, r.chain_id, r.version = info.lease_id, info.chain_id, info.version
            r.spans = tuple((s.server, s.start, s.end) for s in info.spans)
        return old

    # ---- failover ---------------------------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, prompts: torch.Tensor | None = None,
             hypo_ids: torch.Tensor | None = None) -> torch.Tensor:
        """petals' step; when a server of the leased chain fails, move to a working chain, replay the session's
        inputs there and finish the step (the outputs are the ones the old chain would have given)."""
        if self._keeper is None:
            return super().step(inputs, prompts, hypo_ids)
        prefix = self._history
        if prefix is not None and hypo_ids is not None and not is_dummy(hypo_ids):
            prefix = prefix[hypo_ids.cpu()]  # the servers reorder their caches by hypo_ids before this step
        new = inputs.detach().cpu()
        full = new if prefix is None else torch.cat([prefix, new.to(prefix.dtype)], dim=1)
        started_s = time.monotonic()
        step_inputs, step_hypo_ids = inputs, hypo_ids
        recoveries: list[FailoverRecord] = []
        while True:
            manager = self._sequence_manager
            manager.failed_peer = None
            try:
                outputs = super().step(step_inputs, prompts, step_hypo_ids)
                break
            except Exception as exc:
                rec = self._fail_over(manager.failed_peer, exc, started_s, len(recoveries))
                if rec is None:
                    raise
                rec.replayed_tokens = full.shape[1] - new.shape[1]
                recoveries.append(rec)
                step_inputs, step_hypo_ids = full, None  # from block 0 on fresh server sessions
                self._position = 0
        done_s = time.monotonic()
        for rec in recoveries:
            rec.recovered_s = done_s
        if recoveries:
            log.warning("lease %s: session recovered on chain %s in %.2f s (%d tokens replayed)",
                        self.lease.lease_id, self.lease.chain_id, done_s - recoveries[0].detected_s,
                        recoveries[-1].replayed_tokens)
        self._history = full
        return outputs[:, -new.shape[1]:].to(inputs.device)

    def _fail_over(self, peer_id: Any, exc: BaseException, step_started_s: float,
                   attempt: int) -> FailoverRecord | None:
        """Get the session off the failed server ``peer_id``; None when the failure is not one to fail over
        from (no server of the lease named, or a stable server refusing the request again)."""
        lease, base = self.lease, self._base_manager
        hop = None
        if peer_id is not None and lease is not None:
            hop = next((s for s in lease.spans if s.peer_id == peer_id.to_base58()), None)
        if hop is None:
            return None
        if attempt >= base.options.max_failovers:
            raise FailoverError(f"lease {lease.lease_id}: gave up after {attempt} failovers in one step; last one "
                                f"at server {hop.server!r}: {exc!r}") from exc
        rec = FailoverRecord(hop.server, "", f"{type(exc).__name__}: {exc}"[:500], lease.lease_id, lease.chain_id,
                             step_started_s=step_started_s, detected_s=time.monotonic())
        self._drop_server_sessions()
        rec.action = self._diagnose(hop, exc)
        log.warning("lease %s (chain %s): server %s failed (%s); %s", lease.lease_id, lease.chain_id, hop.server,
                    rec.cause, rec.action)
        if rec.action == "refused":
            self._refusals += 1
            if self._refusals > 1:
                return None
        elif rec.action == "reloading":
            self._wait_until_serving(hop)
        elif rec.action == "moved":
            self._use_lease(self._new_lease()).release()  # the old chain is no longer offered
        else:
            self._report(lease, hop.server)
        rec.to_lease, rec.to_chain = self.lease.lease_id, self.lease.chain_id
        rec.queue_waited_s = self.lease.waited_s if rec.to_lease != rec.from_lease else 0.0
        if self.record is not None:
            self.record.failovers.append(rec)
        return rec

    def _drop_server_sessions(self) -> None:
        """Close every server session of the broken route (frees their caches); the next step opens new ones."""
        self._exit_server_sessions(self._server_sessions)
        self._server_sessions.clear()

    def _server_record(self, name: str) -> dict[str, Any] | None:
        """The orchestrator's record of server ``name`` (None if unknown or the orchestrator cannot answer)."""
        try:
            servers = self._base_manager.orchestrator.run(lambda c: c.servers(), timeout_s=defaults.CALL_TIMEOUT_S)
        except Exception as exc:  # cannot ask: the caller falls back to reporting
            log.warning("GET /servers failed: %s", exc)
            return None
        return next((r for r in servers.get("servers", ()) if r.get("name") == name), None)

    @staticmethod
    def _covers(span: Any, start: int, end: int) -> bool:
        """Whether a [a, b] list/dict span holds blocks start:end."""
        if isinstance(span, dict):
            span = (span.get("start"), span.get("end"))
        return bool(span) and span[0] is not None and span[0] <= start and end <= span[1]

    def _diagnose(self, hop: Any, exc: BaseException) -> str:
        """What became of a failed hop's server, as the orchestrator sees it: 'reported' (gone, or alive on paper
        but unreachable), 'moved' (assigned other blocks), 'reloading' (loading its span), 'refused'."""
        rec = self._server_record(hop.server)
        if rec is None or not rec.get("alive"):
            return "reported"
        if not self._covers(rec.get("assignment"), hop.start, hop.end):
            return "moved"
        if not self._covers(rec.get("serving"), hop.start, hop.end):
            return "reloading"
        return "refused" if isinstance(exc, P2PHandlerError) else "reported"

    def _wait_until_serving(self, hop: Any) -> None:
        """Wait until the hop's server serves its blocks (or stops being assigned them); FailoverError on timeout."""
        deadline = time.monotonic() + self._base_manager.options.reload_wait_s
        while time.monotonic() < deadline:
            rec = self._server_record(hop.server)
            if rec is None or not rec.get("alive") or not self._covers(rec.get("assignment"), hop.start, hop.end):
                return  # it died or moved: the next failure on it says which
            if self._covers(rec.get("serving"), hop.start, hop.end):
                return
            time.sleep(0.25)
        raise FailoverError(f"server {hop.server!r} did not serve blocks {hop.start}:{hop.end} within "
                            f"{self._base_manager.options.reload_wait_s:g} s")

    def _new_lease(self) -> LeaseInfo:
        """A fresh lease (waits in the orchestrator's queue like any new session)."""
        opts = self._base_manager.options
        return self._base_manager.orchestrator.run(
            lambda c: c.lease(timeout_s=opts.timeout_s, ttl_s=opts.ttl_s, client=opts.client),
            timeout_s=opts.timeout_s + 60.0,
        )

    def _report(self, lease: LeaseInfo, server: str) -> None:
        """Report ``server`` dead under ``lease``; the replacement lease (JFFC, FIFO) takes the old one's place."""
        opts = self._base_manager.options
        try:
            info = self._base_manager.orchestrator.run(
                lambda c: c.report_failure(lease.lease_id, server, timeout_s=opts.timeout_s),
                timeout_s=opts.timeout_s + 60.0,
            )
        except OrchestratorError as exc:
            if exc.status != 404:  # 404: our lease expired meanwhile; anything else is a real refusal
                raise FailoverError(f"lease {lease.lease_id}: reporting server {server!r} failed: {exc.message}") \
                    from exc
            info = self._new_lease()
            self._use_lease(info).release()
            return
        self._use_lease(info).stop()  # the orchestrator ended the old lease when it granted this one

    def _exit_server_sessions(self, server_sessions: list[Any]) -> None:
        """Close each server session, and mark it closed even when closing failed.

        petals leaves a server session whose close raised still "open"; its ``__del__`` then calls
        ``RemoteExpertWorker.run_coroutine``, which deadlocks the whole client when the garbage
        collector happens to run it on that worker's own event-loop thread.
        """
        for session in reversed(server_sessions):
            try:
                session.__exit__(None, None, None)
            except Exception as exc:  # the server may already have ended the stream
                log.debug("closing the session on %s failed: %r", session.span.server_info.public_name, exc)
            finally:
                session._outputs_stream = session._inputs_queue = None

    def close(self, *exc_details: Any) -> None:
        """Close the server sessions, then release the lease (always, even if closing raised)."""
        was_closed = self._closed
        try:
            super().close(*exc_details)
        finally:
            keeper, self._keeper = self._keeper, None
            if keeper is not None:
                keeper.release()
                if self.record is not None and not was_closed:
                    self.record.service_s = time.monotonic() - (self._granted_s or time.monotonic())
                    if exc_details and exc_details[0] is not None:
                        self.record.error = f"{exc_details[0].__name__}: {exc_details[1]}"
                    self._base_manager.add_record(self.record)

    def __exit__(self, *exc_details: Any) -> None:
        self.close(*exc_details)


class OrchestratedRemoteSequential(RemoteSequential):
    """petals' RemoteSequential whose inference sessions lease a chain from the orchestrator."""

    sequence_manager: OrchestratedSequenceManager

    @contextlib.contextmanager
    def inference_session(self, **kwargs: Any):
        """Like petals' inference_session(max_length=...), but the session holds a lease while open."""
        with LeasedInferenceSession(self.sequence_manager, **kwargs) as session, self.use_session(session):
            yield session

    def open_session(self, max_length: int) -> LeasedInferenceSession:
        """A session already holding its lease but not made active: pass it to ``generate(session=...)`` and
        ``close()`` it in any order (for many concurrent sessions in one thread)."""
        return LeasedInferenceSession(self.sequence_manager, max_length=max_length).__enter__()

    def __getitem__(self, ix: int | slice) -> OrchestratedRemoteSequential:
        """A sub-sequence of blocks whose sessions still lease."""
        return OrchestratedRemoteSequential(self.config, sequence_manager=self.sequence_manager[ix])


def orchestrator_health(orch: BlockingOrchestrator) -> dict[str, Any]:
    """GET /health of the orchestrator."""

    return orch.run(lambda c: c.health(), timeout_s=defaults.CALL_TIMEOUT_S)


def use_orchestrator(model: Any, orchestrator: BlockingOrchestrator, options: LeaseOptions | None = None) -> Any:
    """Make a loaded petals model lease every inference session from ``orchestrator``; returns the model."""
    transformer = model.transformer if hasattr(model, "transformer") else model
    for attr, child in list(transformer.named_children()):
        if isinstance(child, RemoteSequential):
            manager = OrchestratedSequenceManager.replacing(child.sequence_manager, orchestrator, options)
            setattr(transformer, attr, OrchestratedRemoteSequential(child.config, sequence_manager=manager))
            model.orchestrator = orchestrator
            model.session_records = manager.options.records
            return model
    raise TypeError(f"{type(model).__name__} has no petals RemoteSequential to route through the orchestrator")


def close_client(model: Any) -> None:
    """Release what a leasing model holds: its orchestrator connection, its p2p client and its DHT node
    (closing them here avoids hivemind's 'no current event loop' noise at interpreter exit)."""
    from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker

    orch = getattr(model, "orchestrator", None)
    if orch is not None:
        orch.close()
    transformer = model.transformer if hasattr(model, "transformer") else model
    for child in transformer.children():
        if isinstance(child, RemoteSequential):
            manager = child.sequence_manager
            manager.shutdown()
            p2p = manager.state.p2p
            if p2p is not None:
                with contextlib.suppress(Exception):
                    RemoteExpertWorker.run_coroutine(p2p.shutdown())
            with contextlib.suppress(Exception):
                manager.dht.shutdown()


class AutoDistributedModelForCausalLM:
    """petals' AutoDistributedModelForCausalLM, plus ``orchestrator=URL``: sessions lease chains via JFFC."""

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path: str,
        *args: Any,
        orchestrator: str | None = None,
        orchestrator_token: str | None = None,
        lease_timeout_s: float = defaults.LEASE_WAIT_S,
        lease_ttl_s: float = defaults.LEASE_TTL_S,
        client_label: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Load the client-side model; with ``orchestrator``, the DHT and prefix default to the orchestrator's."""
        from pathlib import Path

        import petals

        if orchestrator is None:
            return petals.AutoDistributedModelForCausalLM.from_pretrained(model_name_or_path, *args, **kwargs)
        if isinstance(model_name_or_path, (str, Path)) and (
            str(model_name_or_path).startswith((".", "/", "~")) or Path(model_name_or_path).exists()
        ):
            from petals_chain.checkpoint.sizing import check_model_dir

            check_model_dir(Path(model_name_or_path).expanduser())
        options = LeaseOptions(lease_timeout_s, lease_ttl_s, client_label)
        orch = BlockingOrchestrator(orchestrator, token=orchestrator_token)
        try:
            health = orchestrator_health(orch)
            dht = health.get("dht") or {}
            if "initial_peers" not in kwargs:
                if not dht.get("initial_peers"):
                    raise SpecError(f"the orchestrator at {orchestrator} runs no DHT; pass initial_peers=[...]")
                kwargs["initial_peers"] = dht["initial_peers"]
            if "dht_prefix" not in kwargs and dht.get("dht_prefix"):
                kwargs["dht_prefix"] = dht["dht_prefix"]
            model = petals.AutoDistributedModelForCausalLM.from_pretrained(model_name_or_path, *args, **kwargs)
            expected = (health.get("model") or {}).get("num_blocks")
            if expected is not None and model.config.num_hidden_layers != expected:
                raise SpecError(f"{model_name_or_path} has {model.config.num_hidden_layers} blocks but the "
                                f"orchestrator composes for {expected}")
            return use_orchestrator(model, orch, options)
        except BaseException:
            orch.close()
            raise
