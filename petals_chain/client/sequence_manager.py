"""petals' sequence manager, made to follow a lease: a leased inference session runs exactly along its lease's spans
(peer ids and block ranges) instead of petals' own Dijkstra routing, and a failed request is remembered so that the
session can fail over (see client/session.py). Forward passes outside a session keep petals' routing."""

from __future__ import annotations

import copy
import logging
from typing import Any

from petals.client.routing.sequence_manager import RemoteSequenceManager

from petals_chain.client.lease import LeaseOptions
from petals_chain.protocol.blocking import BlockingOrchestrator
from petals_chain.protocol.replies import LeaseInfo

log = logging.getLogger(__name__)

ALLOC_WAIT_S = 5.0  # how long a server may wait for cache to free up before refusing a leased session


class LeaseRouteError(RuntimeError):
    """A lease's spans do not cover the blocks a session needs, or name a server without a peer id."""


class OrchestratedSequenceManager(RemoteSequenceManager):
    """petals' sequence manager that routes a leased session along its lease's spans."""

    lease: LeaseInfo | None = None
    failed_peer: Any = None  # the peer whose request failed last (a leased view fails over from it)

    def __init__(self, config: Any, block_uids: Any, *, orchestrator: BlockingOrchestrator,
                 options: LeaseOptions | None = None, dht: Any = None, state: Any = None) -> None:
        super().__init__(config, block_uids, dht=dht, state=state)
        self.orchestrator = orchestrator
        self.options = options or LeaseOptions()

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

    def get_request_metadata(self, protocol: str, *args: Any, **kwargs: Any) -> dict | None:
        """petals' metadata; a leased session's cache may wait ALLOC_WAIT_S on a server whose previous holder is
        still closing (its slot was freed by a release or a move a moment before), instead of failing at once."""
        meta = super().get_request_metadata(protocol, *args, **kwargs)
        if self.lease is not None and protocol == "rpc_inference" and isinstance(meta, dict):
            meta.setdefault("alloc_timeout", ALLOC_WAIT_S)
        return meta

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
