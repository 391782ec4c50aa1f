"""KV-cache transfer between PETALS servers: export a live inference session's cache, import it elsewhere.

docs/mell.md, "Live KV transfer", says what is moved and why. petals keeps a session's attention cache in
``MemoryCache`` tensors owned by the server's runtime thread, addressed by handles that only the handler
serving the session's ``rpc_inference`` stream knows. ``KvTransferHandler`` (petals' connection handler plus
one rpc) remembers, per session id, its blocks, cache handles and the number of tokens processed, and:

* ``rpc_kv_export`` streams the cache of some of a session's blocks (keys and values up to its position) to
  whoever names the session id and position;
* a session opened with ``kv_import`` in its first request's metadata pulls those caches from the old servers
  (one source per run of blocks, so a new span may take blocks from several old ones; an old session on this
  same server is read here, without the network), writes them into its own cache at the same place, and answers
  that request with an empty step of ``position`` tokens, which moves petals' own prefix length to ``position``
  without computing anything.

Reads and writes of the cache run in the runtime thread as tasks of the server's merged inference pool, so
they are ordered with the inference steps. ``install_kv_transfer`` makes petals' server build this handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import torch
from hivemind.compression.serialization import deserialize_tensor_stream, serialize_torch_tensor
from hivemind.p2p import P2PContext, PeerID
from hivemind.p2p.p2p_daemon import DEFAULT_MAX_MSG_SIZE
from hivemind.proto import runtime_pb2
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.streaming import split_for_streaming
from petals.server.handler import TransformerConnectionHandler

from petals_chain.protocol.kv_keys import KV_IMPORT_KEY, block_index

log = logging.getLogger(__name__)

_HANDLER_NAME = "TransformerConnectionHandler"  # petals' handle names: our rpcs sit next to petals' own


# How often an import asks an old server for a cache whose stream arrived short before it refuses the move. hivemind's
# stream reader ends a stream cut mid-message as if it had ended (asyncio.IncompleteReadError is its end of stream),
# so a short stream is the only sign of a lost message; it was seen once in a live run (29 of 30 tensors).
KV_FETCH_ATTEMPTS = 3


class KvTransferError(RuntimeError):
    """A cache export or import was refused: unknown session, wrong position or blocks, shapes that differ."""


async def fetch_exported(stub: Any, meta: dict, tensors_expected: int, timeout: float,
                         attempts: int = KV_FETCH_ATTEMPTS) -> list[torch.Tensor]:
    """The cache tensors an old server's ``rpc_kv_export`` streams for ``meta`` (session_id, start, end, position),
    asked again when the stream ends short of ``tensors_expected`` (the export only reads a paused session's cache,
    so asking again is safe); KvTransferError naming the counts after ``attempts`` short streams."""
    got = 0
    for attempt in range(1, attempts + 1):
        stream = await stub.rpc_kv_export(runtime_pb2.ExpertRequest(metadata=MSGPackSerializer.dumps(meta)))

        async def parts(stream=stream):
            """The tensor parts of each message of the stream."""
            async for msg in stream:
                yield msg.tensors

        tensors = await asyncio.wait_for(deserialize_tensor_stream(parts()), timeout)
        if len(tensors) == tensors_expected:
            return tensors
        got = len(tensors)
        log.warning("kv export of session %s blocks %s:%s arrived with %d of %d tensors (attempt %d of %d)",
                    meta.get("session_id"), meta.get("start"), meta.get("end"), got, tensors_expected, attempt,
                    attempts)
    raise KvTransferError(f"sent {got} tensors for blocks {meta.get('start')}:{meta.get('end')}, {tensors_expected}"
                          f" expected, in each of {attempts} attempts")


@dataclass(frozen=True)
class KvCacheOp:
    """A cache read or write for the runtime thread: per block, the handles of its key and value tensors."""

    kind: str  # "export" or "import"
    handles: tuple[tuple[int, ...], ...]
    position: int


@dataclass
class _LiveSession:
    """What the handler knows of one running inference session."""

    uids: tuple[str, ...]
    handles: tuple[tuple[int, ...], ...]
    batch_size: int
    max_length: int
    position: int = 0
    busy: bool = False  # a step was handed to petals and has not finished
    exported: set = field(default_factory=set)


class KvAwareInferenceStep:
    """The merged inference pool's function, plus cache reads/writes (``KvCacheOp``) run in the runtime thread."""

    def __init__(self, inner: Any, memory_cache: Any) -> None:
        self.inner = inner
        self.memory_cache = memory_cache

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """A ``KvCacheOp`` task (marker tensor, op, tensors...), or petals' own inference step."""
        if len(args) >= 2 and isinstance(args[1], KvCacheOp):
            return self.run_op(args[1], args[2:])
        return self.inner(*args)

    @torch.inference_mode()
    def run_op(self, op: KvCacheOp, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Export: copies of every block's keys [..., :position] and values [:, :, :position]; import: the reverse."""
        flat = [h for block in op.handles for h in block]
        with self.memory_cache.use_cache(*flat) as caches:
            if op.kind == "export":
                out = []
                for i, cache in enumerate(caches):
                    part = cache[..., : op.position] if i % 2 == 0 else cache[:, :, : op.position]
                    out.append(part.clone())
                return tuple(out)
            if len(tensors) != len(caches):
                raise KvTransferError(f"import: {len(tensors)} tensors for {len(caches)} cache tensors")
            for i, (cache, src) in enumerate(zip(caches, tensors)):
                dst = cache[..., : op.position] if i % 2 == 0 else cache[:, :, : op.position]
                if dst.shape != src.shape:
                    raise KvTransferError(f"import: cache tensor {i} has shape {tuple(dst.shape)} here but "
                                          f"{tuple(src.shape)} arrived")
                dst.copy_(src.to(dst.dtype))
            return (torch.zeros(1),)


class KvTransferHandler(TransformerConnectionHandler):
    """petals' connection handler that can hand a live session's cache to another server and take one over."""

    _rpc_handlers = None  # collect our own rpc list (petals' class caches its own)
    _stub_type = None

    def __init__(self, dht: Any, module_backends: dict, **kwargs: Any) -> None:
        super().__init__(dht, module_backends, **kwargs)
        self._live: dict[str, _LiveSession] = {}
        self._allocs: dict[Any, tuple[tuple[str, ...], tuple[tuple[int, ...], ...], int, int]] = {}
        pool = next(iter(module_backends.values())).inference_pool
        if not isinstance(pool.process_func, KvAwareInferenceStep):  # shared by every handler of the server
            memory_cache = next(iter(module_backends.values())).memory_cache
            pool.process_func = KvAwareInferenceStep(pool.process_func, memory_cache)
        self._pool = pool

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        """petals' handle names, so that petals' own clients reach rpc_inference etc. unchanged."""
        name = f"{_HANDLER_NAME}.{method_name}"
        return name if namespace is None else f"{namespace}::{name}"

    # ---- remembering live sessions ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _allocate_cache(self, backends: Sequence[Any], *, batch_size: int, max_length: int,
                              timeout: float | None):
        """petals' allocation; the handles are kept for this stream until its session id is known."""
        async with super()._allocate_cache(backends, batch_size=batch_size, max_length=max_length,
                                           timeout=timeout) as handles:
            task = asyncio.current_task()
            uids = tuple(b.name for b in backends)
            self._allocs[task] = (uids, tuple(tuple(h) for h in handles), batch_size, max_length)
            try:
                yield handles
            finally:
                self._allocs.pop(task, None)

    async def _iterate_inference_steps(self, first_request: runtime_pb2.ExpertRequest, requests: Any,
                                       session_id: str | None, requested_uids: Sequence[str],
                                       context: P2PContext) -> AsyncIterator[tuple[runtime_pb2.ExpertRequest, dict]]:
        """petals' steps, counting the tokens processed per session; a first request with ``kv_import`` first
        pulls the session's cache from the old servers."""
        alloc = self._allocs.get(asyncio.current_task())
        live = None
        if session_id is not None and alloc is not None:
            live = _LiveSession(alloc[0], alloc[1], alloc[2], alloc[3])
            self._live[session_id] = live
        try:
            first = True
            async for request, metadata in super()._iterate_inference_steps(first_request, requests, session_id,
                                                                            requested_uids, context):
                n_tokens = request.tensors[0].size[1] if request.tensors and len(request.tensors[0].size) > 1 else 0
                if first and metadata.get(KV_IMPORT_KEY):
                    if live is None:
                        raise KvTransferError("kv_import needs a session_id")
                    await self._import(live, metadata[KV_IMPORT_KEY], n_tokens)
                first = False
                if live is not None:
                    live.busy = True
                yield request, metadata
                if live is not None:  # petals asks for the next request only after this one's step is done
                    live.position += n_tokens
                    live.busy = False
        finally:
            if session_id is not None and self._live.get(session_id) is live:
                self._live.pop(session_id, None)

    # ---- export -------------------------------------------------------------------------------------------

    async def _session_blocks(self, session_id: str, start: int, end: int,
                              position: int) -> tuple[_LiveSession, list]:
        """The live session and the handles of its blocks start:end; KvTransferError if that is not possible.
        A step that the client has seen answered may still be finishing here: wait for it up to a second."""
        live = self._live.get(session_id)
        if live is None:
            raise KvTransferError(f"no live session {session_id!r} on this server")
        for _ in range(100):
            if not live.busy and live.position >= position:
                break
            await asyncio.sleep(0.01)
        if live.busy or live.position != position:
            raise KvTransferError(f"session {session_id!r} is at position {live.position}"
                                  f"{' (mid-step)' if live.busy else ''}, not {position}")
        by_block = {block_index(u): h for u, h in zip(live.uids, live.handles)}
        missing = [b for b in range(start, end) if b not in by_block]
        if start >= end or missing:
            raise KvTransferError(f"session {session_id!r} holds blocks {sorted(by_block)}, not {start}:{end}")
        return live, [by_block[b] for b in range(start, end)]

    async def _export(self, sid: str, start: int, end: int, position: int) -> list[torch.Tensor]:
        """Copies of the keys and values of blocks start:end of a live session here, at ``position``."""
        live, handles = await self._session_blocks(sid, start, end, position)
        op = KvCacheOp("export", tuple(handles), position)
        tensors = await self._pool.submit_task(torch.zeros(1), op, priority=0.0)
        live.exported.add((start, end))
        return list(tensors)

    async def rpc_kv_export(self, request: runtime_pb2.ExpertRequest,
                            context: P2PContext) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        """Stream the cache of blocks start:end of session ``session_id`` at ``position``: per block its keys
        and values over the first ``position`` tokens."""
        meta = MSGPackSerializer.loads(request.metadata) if request.metadata else {}
        sid, start, end, position = (meta.get(k) for k in ("session_id", "start", "end", "position"))
        if not (isinstance(sid, str) and all(isinstance(v, int) for v in (start, end, position)) and position > 0):
            raise KvTransferError(f"rpc_kv_export needs session_id, start, end and position > 0, got {meta}")
        tensors = await self._export(sid, start, end, position)
        self._log_request("rpc_kv_export", None, context, debug=f"session {sid} blocks {start}:{end} @ {position}")
        for tensor in tensors:
            serialized = serialize_torch_tensor(tensor, runtime_pb2.CompressionType.NONE, allow_inplace=True)
            for part in split_for_streaming(serialized, DEFAULT_MAX_MSG_SIZE):
                yield runtime_pb2.ExpertResponse(tensors=[part])

    # ---- import -------------------------------------------------------------------------------------------

    async def _fetch(self, source: Sequence[Any], position: int) -> list[torch.Tensor]:
        """The cache tensors of one source [peer_id, session_id, start, end] from its server."""
        peer, sid, start, end = source
        if PeerID.from_base58(peer) == self._p2p.peer_id:  # the old session runs here too (chains sharing a server)
            return await self._export(sid, int(start), int(end), position)
        stub = type(self).get_stub(self._p2p, PeerID.from_base58(peer))
        meta = dict(session_id=sid, start=int(start), end=int(end), position=position)
        try:
            return await fetch_exported(stub, meta, 2 * (int(end) - int(start)), self.request_timeout)
        except KvTransferError as exc:
            raise KvTransferError(f"{peer} {exc}") from None

    async def _import(self, live: _LiveSession, sources: Sequence[Sequence[Any]], position: int) -> None:
        """Fill this session's cache with the old servers' caches of its blocks, at ``position`` tokens."""
        if position <= 0 or position > live.max_length:
            raise KvTransferError(f"kv_import at position {position}: must be in 1..{live.max_length}")
        blocks = [block_index(u) for u in live.uids]
        covered = [b for s in sources for b in range(int(s[2]), int(s[3]))]
        if covered != blocks:
            raise KvTransferError(f"kv_import sources cover blocks {covered}, this session holds {blocks}")
        fetched = await asyncio.gather(*(self._fetch(s, position) for s in sources))
        tensors = [t for part in fetched for t in part]
        op = KvCacheOp("import", live.handles, position)
        await self._pool.submit_task(torch.zeros(1), op, *tensors, priority=0.0)


def install_kv_transfer() -> None:
    """Make petals' server (in this process) build ``KvTransferHandler``s instead of its own handlers."""
    import petals.server.server as petals_server

    petals_server.TransformerConnectionHandler = KvTransferHandler
