"""Move a live petals inference session from its chain to another one, at a step boundary, in one of two modes.

* ``"kv"`` (KV transfer): each server of the new chain opens a session whose first request names, per run of
  blocks, the old server and session holding that cache; the new server pulls it over hivemind P2P
  (``server/kv_handler.py``) and continues at the same position. Nothing is recomputed.
* ``"replay"`` (token replay, as the failover path does): fresh sessions on the new chain, and the session's
  inputs so far are sent through them once, which rebuilds their caches.

Either way the old server sessions are closed only once the new chain holds the whole cache, so a migration that
fails midway closes what it opened and leaves the session on its old chain, still correct (``MigrationError``).
docs/mell.md, "Live KV transfer", describes the protocol and what we measured.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from hivemind.compression.serialization import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
from hivemind.p2p import PeerID
from hivemind.proto import runtime_pb2
from hivemind.utils.serializer import MSGPackSerializer
from petals.client.inference_session import InferenceSession, _ServerInferenceSession
from petals.data_structures import CHAIN_DELIMITER, RemoteSpanInfo, ServerInfo, ServerState
from petals.utils.misc import DUMMY, DUMMY_INT64
from petals.utils.packaging import pack_args_kwargs

from petals_chain.protocol.hop import Hop
from petals_chain.protocol.kv_keys import KV_IMPORT_KEY, block_index

MODES = ("kv", "replay")
log = logging.getLogger(__name__)


class MigrationError(RuntimeError):
    """A migration did not complete; the session still runs on its old chain."""


@dataclass(frozen=True)
class Migration:
    """What one migration did: mode, position (tokens moved), wall time, and the old and new hops."""

    mode: str
    position: int
    seconds: float
    old: tuple[tuple[str, int, int], ...]
    new: tuple[tuple[str, int, int], ...]


def _offset(session: InferenceSession) -> int:
    """Absolute index of the session's first block."""
    return block_index(session._sequence_manager.block_uids[0])


def route_spans(session: InferenceSession, hops: Sequence[Hop]) -> list[RemoteSpanInfo]:
    """``hops`` as petals spans of ``session`` (relative block indices); ValueError unless they cover its blocks
    exactly once, in order."""
    off, n = _offset(session), session.num_blocks
    pos = off
    spans = []
    for hop in hops:
        if hop.start != pos or hop.end <= hop.start:
            raise ValueError(f"hops must cover blocks {off}:{off + n} in order; got {[(h.start, h.end) for h in hops]}")
        info = ServerInfo(state=ServerState.ONLINE, throughput=1.0, start_block=hop.start, end_block=hop.end,
                          public_name=hop.server or None)
        spans.append(RemoteSpanInfo(PeerID.from_base58(hop.peer_id), hop.start - off, hop.end - off, info))
        pos = hop.end
    if pos != off + n:
        raise ValueError(f"hops must cover blocks {off}:{off + n}; they end at {pos}")
    return spans


def _close(sessions: Sequence[_ServerInferenceSession]) -> None:
    """Close server sessions, and mark each closed even when closing raised: petals would otherwise close it again
    from ``__del__``, which deadlocks the client when the collector runs it on hivemind's event-loop thread."""
    for s in reversed(sessions):
        try:
            s.close()
        except Exception as exc:  # the server may have ended the stream already
            log.debug("closing the session on %s failed: %r", s.span.peer_id, exc)
        finally:
            s._outputs_stream = s._inputs_queue = None
            s.closed = True


def _link(sessions: list[_ServerInferenceSession]) -> None:
    """Point each server session at the next (petals' server-to-server push)."""
    for a, b in zip(sessions, sessions[1:]):
        a.next_session = b
    if sessions:
        sessions[-1].next_session = None


def open_route(session: InferenceSession, hops: Sequence[Hop]) -> None:
    """Route a session that has not stepped yet along ``hops`` (instead of petals' own routing)."""
    if session._server_sessions or session.position:
        raise ValueError("open_route is for a session that has not stepped yet; use migrate()")
    session._server_sessions = session._enter_server_sessions(route_spans(session, hops))
    _link(session._server_sessions)


def hops_of(session: InferenceSession) -> tuple[tuple[str, int, int], ...]:
    """The session's current route as (peer id, absolute start, absolute end)."""
    off = _offset(session)
    return tuple((s.span.peer_id.to_base58(), s.span.start + off, s.span.end + off) for s in session._server_sessions)


def _batch_and_inputs(session: InferenceSession) -> tuple[int, torch.Tensor | None]:
    """The batch size and the session's inputs so far (the first server's history), if petals kept them."""
    first = session._server_sessions[0]
    hist = first.history
    if hist is None:
        return 1, None
    return hist.shape[0], hist[:, : session.position]


def _open_imported(session: InferenceSession, span: RemoteSpanInfo, old: list[_ServerInferenceSession],
                   position: int, batch: int, hidden: int) -> _ServerInferenceSession:
    """A server session on ``span`` whose cache the server takes from the old sessions, at ``position``."""
    manager = session._sequence_manager
    off = _offset(session)
    sources = []
    for o in old:
        a, b = max(o.span.start, span.start), min(o.span.end, span.end)
        if a < b:
            sources.append([o.span.peer_id.to_base58(), o.session_id, a + off, b + off])
    uids = CHAIN_DELIMITER.join(manager.block_uids[span.start: span.end])
    metadata = manager.get_request_metadata("rpc_inference", uids, peer_id=span.peer_id)
    new = RemoteExpertWorker.run_coroutine(_ServerInferenceSession.create(
        manager.config, manager.state.p2p, span, uids, rpc_info=manager.rpc_info, max_length=session._max_length,
        **metadata))
    try:
        tensors, structure = pack_args_kwargs(torch.zeros(batch, position, 0), DUMMY, DUMMY_INT64)
        meta = dict(new.session_metadata, session_id=new.session_id, step_id=str(uuid.uuid4()),
                    args_structure=structure, **{KV_IMPORT_KEY: sources})
        request = runtime_pb2.ExpertRequest(
            uid=uids, metadata=MSGPackSerializer.dumps(meta),
            tensors=[serialize_torch_tensor(t, runtime_pb2.CompressionType.NONE) for t in tensors])
        reply = RemoteExpertWorker.run_coroutine(new._step(request))
        shape = tuple(deserialize_torch_tensor(reply.tensors[0]).shape) if reply.tensors else None
        if shape != (batch, position, 0):
            raise MigrationError(f"{span.peer_id} answered the cache import with shape {shape}")
    except BaseException:
        _close([new])
        raise
    new._position = position
    start = next((o for o in old if o.span.start == span.start and o.history is not None), None)
    # petals' per-server replay needs this span's inputs; where no old span began here we do not have them (the
    # leased session's failover replays from its own copy of the inputs instead)
    new.history = start.history[:, :position] if start is not None else torch.zeros(batch, position, hidden)
    return new


def _replay(session: InferenceSession, new: list[_ServerInferenceSession], inputs: torch.Tensor) -> None:
    """Send the session's inputs so far through the new chain once (rebuilds every cache)."""
    step_id = str(uuid.uuid4())
    x = inputs
    for s in new:
        x = s.step(x, DUMMY, DUMMY_INT64, step_id=step_id, end_position=inputs.shape[1])


def open_at(session: InferenceSession, spans: Sequence[RemoteSpanInfo], mode: str = "kv") -> list[
        _ServerInferenceSession]:
    """Server sessions along ``spans`` holding ``session``'s cache at its position, by KV transfer from its current
    server sessions or by token replay, linked for petals' push; the current ones stay open and in use. On any
    failure what was opened is closed and ``MigrationError`` raised (the session is untouched)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    old = list(session._server_sessions)
    position = session.position
    new: list[_ServerInferenceSession] = []
    try:
        if position == 0 or not old:
            new = session._enter_server_sessions(spans)
        elif mode == "kv":
            batch, _ = _batch_and_inputs(session)
            hidden = session._sequence_manager.config.hidden_size
            for span in spans:
                new.append(_open_imported(session, span, old, position, batch, hidden))
        else:
            _, inputs = _batch_and_inputs(session)
            if inputs is None or inputs.shape[1] != position:
                raise MigrationError("token replay needs the session's inputs, which petals did not keep")
            new = session._enter_server_sessions(spans)
            _replay(session, new, inputs)
    except BaseException as exc:
        _close(new)
        if isinstance(exc, MigrationError):
            raise
        raise MigrationError(f"{mode} migration at position {position} failed ({type(exc).__name__}: {exc}); "
                             "the session stays on its old chain") from exc
    _link(new)
    return new


def migrate(session: InferenceSession, hops: Sequence[Hop], mode: str = "kv") -> Migration:
    """Move ``session`` onto ``hops`` between two steps, by KV transfer or token replay; on any failure close
    what was opened, keep the old chain and raise ``MigrationError``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    spans = route_spans(session, hops)
    t0 = time.perf_counter()
    old = list(session._server_sessions)
    before = hops_of(session)
    position = session.position
    session._server_sessions = open_at(session, spans, mode)
    _close(old)
    return Migration(mode, position, time.perf_counter() - t0, before, hops_of(session))


def cache_tokens_left(session: InferenceSession, peer_id: str) -> int:
    """The attention-cache room a server reports (petals' rpc_info ``cache_tokens_available``)."""
    from petals.server.handler import CACHE_TOKENS_AVAILABLE, TransformerConnectionHandler

    manager = session._sequence_manager if isinstance(session, InferenceSession) else session
    stub = TransformerConnectionHandler.get_stub(manager.state.p2p, PeerID.from_base58(peer_id))
    info = RemoteExpertWorker.run_coroutine(stub.rpc_info(runtime_pb2.ExpertUID(uid=""), timeout=30))
    return int(MSGPackSerializer.loads(info.serialized_info)[CACHE_TOKENS_AVAILABLE])


def migrate_leased(session: Any, lease: Any, mode: str = "kv") -> Migration:
    """Move a ``LeasedInferenceSession`` onto ``lease``'s chain, then hold that lease and release the old one."""
    record = migrate(session, lease.spans, mode)
    session._use_lease(lease).release()
    return record
