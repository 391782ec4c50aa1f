"""The leased inference session: a petals InferenceSession that holds an orchestrator lease while it is open.

Entering it takes a lease (waiting in the orchestrator's FIFO queue while every chain is full), a background task
renews the lease while the session lives, and closing it releases the lease, also when generation raised.

Failover: a leased session lets petals try each step once (``max_retries=1`` on its view of the sequence manager);
``OrchestratedSequenceManager.on_request_failure`` remembers the failed peer, and ``LeasedInferenceSession.step``
then closes every server session of the broken chain, asks the orchestrator what became of that server
(``GET /servers``) and either reports it dead (``POST /lease/{id}/report-failure``: the replacement lease takes the
old one's place), takes a new lease (its chain was retired by a recomposition), or waits for it to finish loading
its span; then it replays the whole session's inputs along the (new) chain and finishes the step, so the output
stays token-identical. The old lease is never kept and the current one is released at close. patches/0002 makes
petals notice a dead server within about a second (see patches/README.md).

Migration: at a step boundary the session asks (a renew, at most every ``move_check_s``) whether the orchestrator
offers a move; if so a :class:`~petals_chain.client.migration.Migrator` (KV transfer or token replay, as the adaptive
division picks) builds its state on the new chain, the old server sessions are closed, and the orchestrator is told
(mode and seconds taken) (docs/migration.md, "Protocol").
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from hivemind.p2p import P2PHandlerError
from petals.client.inference_session import InferenceSession
from petals.utils.misc import is_dummy

from petals_chain import defaults
from petals_chain.client.lease import LeaseKeeper
from petals_chain.client.migration import MigrationError, choose_mode, kv_bytes_per_token, migrator_for
from petals_chain.client.records import FailoverRecord, MigrationRecord, SessionRecord
from petals_chain.client.sequence_manager import OrchestratedSequenceManager
from petals_chain.protocol.http_client import OrchestratorError
from petals_chain.protocol.replies import LeaseInfo

log = logging.getLogger(__name__)


class FailoverError(RuntimeError):
    """A leased session could not be moved off a failed server (no replacement chain, or too many failovers)."""


class LeasedInferenceSession(InferenceSession):
    """A petals InferenceSession that holds an orchestrator lease from __enter__ to close()."""

    def __init__(self, sequence_manager: OrchestratedSequenceManager, max_length: int) -> None:
        self._keeper: LeaseKeeper | None = None
        self.record: SessionRecord | None = None
        self._granted_s: float | None = None
        self._base_manager = sequence_manager
        self._history: torch.Tensor | None = None  # every input stepped so far: replayed on a replacement chain
        self._refusals = 0
        self._refused_moves: set[str] = set()  # reserved leases this session could not move to: never tried again
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
                lambda c: c.lease(timeout_s=opts.timeout_s, ttl_s=opts.ttl_s, client=opts.client, k_max=opts.k_max),
                timeout_s=opts.timeout_s + 60.0,
            )
        except BaseException as exc:
            self.record.error = f"{type(exc).__name__}: {exc}"
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

    @property
    def history(self) -> torch.Tensor | None:
        """Every input stepped so far (batch × tokens × hidden), what a replay sends again."""
        return self._history

    # ---- migration --------------------------------------------------------------------------------------------

    def _maybe_move(self) -> None:
        """At a step boundary: if the orchestrator offered a move (asked by a renew at most every move_check_s),
        carry it out; a move that fails leaves the session on its old chain and the orchestrator is told."""
        keeper, opts = self._keeper, self._base_manager.options
        target = keeper.move_to
        if target is None and time.monotonic() - keeper.checked_s >= opts.move_check_s:
            target = keeper.check()
        if target is None or target.lease_id in self._refused_moves:
            return
        mode = choose_mode(self._position, kv_bytes_per_token(self._sequence_manager.config), opts.move_link_bytes,
                           opts.move_prefill_tokens, opts.move_rule, opts.move_speeds)
        migrator = migrator_for(mode)
        if migrator is None:
            return  # deferred: the offer stands, the next boundary asks again
        keeper.move_to = None
        old, orch = keeper.info, self._base_manager.orchestrator
        rec = MigrationRecord(old.lease_id, old.chain_id, target.lease_id, target.chain_id, migrator.mode.value,
                              self._position, time.monotonic())
        if self.record is not None:
            self.record.migrations.append(rec)
        try:
            switch = migrator.migrate(self, target)
        except MigrationError as exc:
            self._refused_moves.add(target.lease_id)
            rec.error = str(exc)[:500]
            log.warning("lease %s: could not move to chain %s; staying on chain %s: %s", old.lease_id,
                        target.chain_id, old.chain_id, exc)
            try:
                orch.run(lambda c: c.migration_failed(old.lease_id, rec.mode), timeout_s=defaults.CALL_TIMEOUT_S)
            except Exception as exc2:  # the reservation then expires with the lease, or goes when it ends
                log.warning("telling the orchestrator that lease %s stays failed: %s", old.lease_id, exc2)
            return
        switch.commit()  # the old caches are freed before the orchestrator frees their slot (as at close)
        self._use_lease(target).stop()  # the orchestrator ends the old lease when told below
        moved_s = time.monotonic() - rec.started_s
        try:
            orch.run(lambda c: c.migrated(old.lease_id, rec.mode, moved_s), timeout_s=defaults.CALL_TIMEOUT_S)
        except Exception as exc:  # the old lease expired meanwhile (its reservation with it): as any expired lease
            rec.error = f"moved, but the orchestrator did not take the move: {exc}"[:500]
            log.warning("lease %s: the orchestrator did not take the move to %s: %s", old.lease_id, target.lease_id,
                        exc)
        rec.done_s = time.monotonic()
        log.info("lease %s moved to chain %s (%s, %d tokens) in %.3f s", old.lease_id, target.chain_id,
                 rec.mode, rec.tokens, rec.downtime_s)

    # ---- failover ---------------------------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, prompts: torch.Tensor | None = None,
             hypo_ids: torch.Tensor | None = None) -> torch.Tensor:
        """petals' step; when a server of the leased chain fails, move to a working chain, replay the session's
        inputs there and finish the step (the outputs are the ones the old chain would have given)."""
        if self._keeper is None:
            return super().step(inputs, prompts, hypo_ids)
        if self._history is not None:
            self._maybe_move()
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
            lambda c: c.lease(timeout_s=opts.timeout_s, ttl_s=opts.ttl_s, client=opts.client, k_max=opts.k_max),
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

    def __exit__(self, *exc_details: Any) -> None:
        """Close the session (see close)."""
        self.close(*exc_details)
