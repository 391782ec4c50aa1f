"""An import asks again when an old server's cache export arrives short (hivemind's stream reader ends a stream cut
mid-message as if it had ended): over two real hivemind P2P daemons on loopback, a peer whose ``rpc_kv_export`` drops
its last message on the first call is asked again and its full cache comes through; one that always drops it is
refused by name after the attempts."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.live

BLOCKS = 3


async def _exchange(short_calls: int) -> tuple[list[torch.Tensor] | BaseException, list[torch.Tensor], int]:
    """Serve ``2 * BLOCKS`` tensors from one daemon, the first ``short_calls`` calls one message short; fetch them
    from another. Returns (what fetch_exported returned or raised, the tensors served, calls made)."""
    from hivemind.compression.serialization import serialize_torch_tensor
    from hivemind.p2p import P2P
    from hivemind.proto import runtime_pb2
    from hivemind.utils.serializer import MSGPackSerializer

    from petals_chain.server.kv_handler import KvTransferHandler, fetch_exported

    served = [torch.randn(2, 3, 8, 5) for _ in range(2 * BLOCKS)]
    calls: list[dict] = []

    async def rpc_kv_export(request: runtime_pb2.ExpertRequest, context):
        calls.append(MSGPackSerializer.loads(request.metadata))
        last = len(served) - (1 if len(calls) <= short_calls else 0)
        for tensor in served[:last]:
            yield runtime_pb2.ExpertResponse(tensors=[serialize_torch_tensor(tensor)])

    server = await P2P.create()
    client = await P2P.create(initial_peers=await server.get_visible_maddrs())
    try:
        name = KvTransferHandler._get_handle_name(None, "rpc_kv_export")
        await server.add_protobuf_handler(name, rpc_kv_export, runtime_pb2.ExpertRequest, stream_output=True)
        stub = KvTransferHandler.get_stub(client, server.peer_id)
        meta = dict(session_id="s", start=4, end=4 + BLOCKS, position=5)
        try:
            got: list[torch.Tensor] | BaseException = await fetch_exported(stub, meta, 2 * BLOCKS, timeout=30)
        except Exception as exc:  # noqa: BLE001 - the refusal is what the caller checks
            got = exc
        assert all(c == meta for c in calls)
        return got, served, len(calls)
    finally:
        await client.shutdown()
        await server.shutdown()


def test_a_short_export_is_fetched_again() -> None:
    got, served, calls = asyncio.run(_exchange(short_calls=1))
    assert calls == 2
    assert not isinstance(got, BaseException) and len(got) == len(served)
    assert all(torch.equal(a, b) for a, b in zip(got, served))


def test_an_export_that_always_arrives_short_is_refused_by_name() -> None:
    from petals_chain.server.kv_handler import KV_FETCH_ATTEMPTS, KvTransferError

    got, served, calls = asyncio.run(_exchange(short_calls=99))
    assert calls == KV_FETCH_ATTEMPTS
    assert isinstance(got, KvTransferError)
    assert f"sent {len(served) - 1} tensors for blocks 4:{4 + BLOCKS}, {len(served)} expected" in str(got)
