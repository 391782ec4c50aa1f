"""Leases that move (leasing/migration.py, engine/drain.py): a slot is reserved before a move is offered, the old one is
freed only once the move succeeded, a failed move leaves the session where it was, JFFC with migration picks the
slowest busy chain, and a drain moves every session off a server before it leaves, recomposing only after."""

from __future__ import annotations

import asyncio
import functools

import pytest

from petals_chain.model import SpecError
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.leases import UnknownLeaseError
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager, NoMoveError
from petals_chain.protocol.hop import Hop
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from petals_chain.protocol.messages import DRAINED_REASON
from tests.orchestrator.test_orchestrator import make_orchestrator, run, serving, wait_until

FAST = ChainInfo((Hop("x", 0, 4),), capacity=1, service_time_s=1.0, chain_id="x")
MID = ChainInfo((Hop("y", 0, 4),), capacity=1, service_time_s=2.0, chain_id="y")
SLOW = ChainInfo((Hop("z", 0, 2), Hop("w", 2, 4)), capacity=2, service_time_s=3.0, chain_id="zw")


def _manager(migration: str = "jffc") -> MigratingLeaseManager:
    """A JFFC-with-migration lease manager over FAST, MID and SLOW."""
    lm = MigratingLeaseManager(migration=migration)
    lm.set_chains([FAST, MID, SLOW], 1)
    return lm


def _booked(lm: MigratingLeaseManager) -> list[int]:
    """Slots each chain's leases hold (reservations included), counted from the leases themselves."""
    out = [0] * len(lm.chains)
    for x in lm.leases():
        if x.chain_index is not None:
            out[x.chain_index] += 1
    return out


def test_a_freed_fast_slot_is_reserved_for_the_slowest_busy_chains_oldest_session() -> None:
    """Release the fast chain's lease: the oldest lease of the slowest busy chain (SLOW, not MID) is offered a
    reservation there; until it moves it holds both slots, and nobody else can take the reserved one."""

    async def body() -> None:
        lm = _manager()
        a, b, c1, c2 = [await lm.acquire(timeout_s=1) for _ in range(4)]
        assert [x.chain.chain_id for x in (a, b, c1, c2)] == ["x", "y", "zw", "zw"]
        lm.release(a.lease_id)
        target = lm.offer(c1.lease_id)
        assert target is not None and target.chain.chain_id == "x" and target.client == c1.client
        assert lm.offer(b.lease_id) is None and lm.offer(c2.lease_id) is None
        assert lm.snapshot().occupancy == _booked(lm) == [1, 1, 2]
        assert lm.free_capacity() == 0  # the reserved slot is not offered to a newcomer
        newcomer = asyncio.create_task(lm.acquire(timeout_s=5))
        await asyncio.sleep(0.01)
        assert not newcomer.done()
        moved = lm.complete(c1.lease_id)
        assert moved.lease_id == target.lease_id and not lm.has(c1.lease_id)
        await asyncio.sleep(0.01)
        assert newcomer.done() and newcomer.result().chain.chain_id == "zw"  # the freed slow slot went to the queue
        assert lm.snapshot().occupancy == _booked(lm) == [1, 1, 2]
        assert (lm.moves.offered, lm.moves.completed) == (1, 1)
        with pytest.raises(UnknownLeaseError):  # the old lease is gone
            lm.complete(c1.lease_id)
        with pytest.raises(NoMoveError):
            lm.complete(b.lease_id)

    run(body())


def test_a_failed_move_keeps_the_session_on_its_chain_and_is_not_offered_again() -> None:
    """migration-failed: the reservation ends, the lease stays on its chain with its slot, and the next freed
    slot goes to another session (never again to the one that could not move)."""

    async def body() -> None:
        lm = _manager()
        a, b, c1, c2 = [await lm.acquire(timeout_s=1) for _ in range(4)]
        lm.release(a.lease_id)
        assert lm.offer(c1.lease_id) is not None
        kept = lm.fail(c1.lease_id)
        assert kept.lease_id == c1.lease_id and lm.has(c1.lease_id) and kept.chain.chain_id == "zw"
        # the freed fast slot is offered at once to the next candidate: c2 (same chain, c1 excluded)
        assert lm.offer(c1.lease_id) is None
        assert lm.offer(c2.lease_id) is not None
        assert lm.snapshot().occupancy == _booked(lm) == [1, 1, 2]
        lm.fail(c2.lease_id)
        # both slow sessions refused: MID's session is next (slower than FAST)
        assert lm.offer(b.lease_id) is not None and lm.moves.failed == 2

    run(body())


def test_a_session_that_ends_before_moving_gives_its_reservation_back() -> None:
    """The source lease is released (or expires) with a move pending: the reservation ends too, nothing leaks."""

    async def body() -> None:
        lm = _manager()
        a, b, c1 = [await lm.acquire(timeout_s=1) for _ in range(3)]
        lm.release(a.lease_id)
        target = lm.offer(c1.lease_id)
        assert target is not None
        lm.release(c1.lease_id)
        assert not lm.has(target.lease_id) and lm.moves.dropped == 1
        # b (MID) is then moved up to the fast slot that came free again
        assert lm.offer(b.lease_id) is not None
        lm.expire_due(now=lm.clock() + 10 * lm.default_ttl_s)
        assert lm.leases() == [] and lm.snapshot().occupancy == [0, 0, 0] and lm.free_capacity() == 4

    run(body())


def test_no_move_without_the_policy_while_requests_wait_or_towards_a_slower_chain() -> None:
    """Plain JFFC never moves; with migration, a queue takes the slot first, and a slot freed on a chain slower
    than every busy one moves nothing."""

    async def body() -> None:
        plain = _manager("none")
        a, _, c1 = [await plain.acquire(timeout_s=1) for _ in range(3)]
        plain.release(a.lease_id)
        assert plain.offer(c1.lease_id) is None and plain.moves.offered == 0

        lm = _manager()
        a, b, c1, c2 = [await lm.acquire(timeout_s=1) for _ in range(4)]
        waiting = asyncio.create_task(lm.acquire(timeout_s=5))
        await asyncio.sleep(0.01)
        lm.release(a.lease_id)
        await asyncio.sleep(0.01)
        assert waiting.done() and waiting.result().chain.chain_id == "x"
        assert lm.moves.offered == 0
        lm.release(c2.lease_id)  # SLOW frees a slot: nothing is slower, nothing moves
        assert lm.moves.offered == 0

    run(body())


def test_bad_policy_is_refused_naming_the_field() -> None:
    """An unknown migration policy is a SpecError naming 'migration'."""
    with pytest.raises(SpecError, match="'migration'"):
        MigratingLeaseManager(migration="fastest")


def test_a_drained_chains_session_waits_at_the_head_of_the_queue_for_a_slot_elsewhere() -> None:
    """Drain of x while every other slot is busy and a newcomer waits: the drained session takes the next freed
    slot before the newcomer, and once it moved nothing runs through x."""

    async def body() -> None:
        lm = _manager("none")
        a, b, c1, c2 = [await lm.acquire(timeout_s=1) for _ in range(4)]
        newcomer = asyncio.create_task(lm.acquire(timeout_s=5))
        await asyncio.sleep(0.01)
        lm.set_chains([MID, SLOW], 2)  # the orchestrator stops offering x's chain first
        assert lm.drain("x") == 1 and lm.pending(a.lease_id) and lm.offer(a.lease_id) is None
        lm.release(c1.lease_id)
        await asyncio.sleep(0.01)
        target = lm.offer(a.lease_id)
        assert target is not None and target.chain.chain_id == "zw" and not newcomer.done()
        lm.complete(a.lease_id)
        assert lm.leases_on("x") == []
        lm.release(b.lease_id)
        await asyncio.sleep(0.01)
        assert newcomer.done()

    run(body())


def test_drain_over_http_moves_sessions_then_the_server_leaves_then_recomposition() -> None:
    """POST /servers/a/drain with two sessions on a: a's chain stops being offered, both sessions get a renew reply
    with migrate_to, the registry's composition does not change until both moved; then a is marked left
    ("left: drained") and the orchestrator recomposes. Bad input: unknown server 404, bad wait_s 400, migrated
    without a move 404."""

    async def body() -> None:
        orch = make_orchestrator(lease_manager=functools.partial(MigratingLeaseManager, migration="none"))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            on_a = [await oc.lease(timeout_s=5) for _ in range(2)]
            assert all(s.server == "a" for x in on_a for s in x.spans)
            with pytest.raises(OrchestratorError) as err:
                await oc.migrated(on_a[0].lease_id)
            assert err.value.status == 404
            version = orch.registry.version
            status = await oc.drain("a")
            assert status["draining"] and status["sessions"] == 2 and not status["left"]
            offers = [(await oc.renew(x.lease_id)).migrate_to for x in on_a]
            assert all(o is not None and all(s.server != "a" for s in o.spans) for o in offers)
            assert {tuple(s.server for s in o.spans) for o in offers} == {("b",), ("d", "e")}
            await oc.migrated(on_a[0].lease_id)
            await asyncio.sleep(0.2)
            assert orch.registry.version == version and orch.registry.servers["a"].alive  # one session still on a
            await oc.migrated(on_a[1].lease_id)
            done = await oc.drain("a", wait_s=5)
            assert done["left"] and not done["draining"] and done["sessions"] == 0 and done["reason"] == DRAINED_REASON
            await wait_until(lambda: _recomposed(orch, version))
            with pytest.raises(OrchestratorError) as err:
                await oc.drain("nosuch")
            assert err.value.status == 404
            with pytest.raises(OrchestratorError) as err:
                await oc._call("POST", "/servers/b/drain", {"wait_s": -1})
            assert err.value.status == 400 and "wait_s" in err.value.message
            assert (await oc._call("GET", "/migrations"))["completed"] == 2
            assert (await oc._call("POST", "/migrations", {"policy": "jffc"}))["policy"] == "jffc"
            assert orch.leases.migration == "jffc"
            with pytest.raises(OrchestratorError) as err:
                await oc._call("POST", "/migrations", {"policy": "fastest"})
            assert err.value.status == 400 and "policy" in err.value.message and orch.leases.migration == "jffc"

    run(body())


async def _recomposed(orch, version: int) -> bool:
    """Whether the orchestrator installed a composition newer than ``version``."""
    return orch.registry.version > version


def test_the_orchestrator_cli_builds_the_migration_policy_and_refuses_an_unknown_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--migration jffc gives a lease manager that moves sessions; an unknown policy is one line, exit code 2."""
    from petals_chain.orchestrator.cli import build_orchestrator, parse_args

    base = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "100MB"]
    orch, _ = build_orchestrator(parse_args([*base, "--migration", "jffc"]))
    assert isinstance(orch.leases, MigratingLeaseManager) and orch.leases.migration == "jffc"
    orch, _ = build_orchestrator(parse_args(base))
    assert orch.leases.migration == "none"
    with pytest.raises(SystemExit) as exc:
        parse_args([*base, "--migration", "fastest"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--migration" in err


def test_migration_metrics_count_moves_by_reason_and_mode_and_the_reported_times() -> None:
    """/metrics after a drain with two sessions: offered{drain} 2 and two slots reserved while they move; one holder
    moves by KV transfer in 0.3 s, the other fails a token replay: committed{drain,kv} 1, rolled_back{drain,token} 1,
    the time in migration_seconds{mode=kv}, no slot reserved any more. A bad mode or seconds is a 400 naming it."""
    from tests.orchestrator.test_metrics import P, scrape, value

    async def body() -> None:
        orch = make_orchestrator(lease_manager=functools.partial(MigratingLeaseManager, migration="none"))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            on_a = [await oc.lease(timeout_s=5) for _ in range(2)]
            fam, _ = await scrape(url)
            assert value(fam, P + "migrations_offered", P + "migrations_offered_total", reason="drain") == 0
            await oc.drain("a")
            assert all([(await oc.renew(x.lease_id)).migrate_to is not None for x in on_a])
            fam, _ = await scrape(url)
            assert value(fam, P + "migrations_offered", P + "migrations_offered_total", reason="drain") == 2
            assert value(fam, P + "migration_slots_reserved") == 2
            for bad in ({"mode": "teleport"}, {"seconds": -1.0}, {"seconds": "fast"}):
                with pytest.raises(OrchestratorError) as err:
                    await oc._call("POST", f"/lease/{on_a[0].lease_id}/migrated", bad)
                assert err.value.status == 400 and next(iter(bad)) in err.value.message
            await oc.migrated(on_a[0].lease_id, "kv", 0.3)
            await oc.migration_failed(on_a[1].lease_id, "token")
            fam, _ = await scrape(url)
            committed = P + "migrations_committed"
            rolled = P + "migrations_rolled_back"
            assert value(fam, committed, committed + "_total", reason="drain", mode="kv") == 1
            assert value(fam, committed, committed + "_total", reason="drain", mode="token") == 0
            assert value(fam, committed, committed + "_total", reason="jffc", mode="kv") == 0
            assert value(fam, rolled, rolled + "_total", reason="drain", mode="token") == 1
            seconds = P + "migration_seconds"
            assert value(fam, seconds, seconds + "_count", mode="kv") == 1
            assert value(fam, seconds, seconds + "_sum", mode="kv") == pytest.approx(0.3)
            assert value(fam, seconds, seconds + "_bucket", mode="kv", le="0.25") == 0
            assert value(fam, seconds, seconds + "_bucket", mode="kv", le="0.5") == 1
            assert value(fam, seconds, seconds + "_count", mode="token") == 0
            assert value(fam, P + "migration_slots_reserved") == 0
            moves = await oc._call("GET", "/migrations")
            assert (moves["offered"], moves["completed"], moves["failed"], moves["reserved"]) == (2, 1, 1, 0)

    run(body())
