"""The SQLite state store: round trip, order, bad settings, and consistency after a process killed mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petals_chain.orchestrator.state.store import StateStore, StoredLease, StoredServer, StoredWaiter, StoreError

REPO = Path(__file__).resolve().parents[2]
CHAIN = {"spans": [["a", 0, 4]], "capacity": 2, "service_time_s": 1.5, "chain_id": "v3.0"}


def server(name: str, **kw: object) -> StoredServer:
    """A stored server record with plain figures."""
    base = dict(memory_bytes=8e9, tau_p_s=0.1, tau_c_s=0.01, peer_id=f"peer-{name}", address=None, planned=False,
                alive=True, dead_reason="", assignment=(0, 4, 3), previous_assignment=None)
    base.update(kw)
    return StoredServer(name, **base)  # type: ignore[arg-type]


def waiter(job: int) -> StoredWaiter:
    """A stored waiting request."""
    return StoredWaiter(job, f"r{job}", 30.0, "c", None, 1000.0 + job)


def lease(job: int, chain: dict = CHAIN) -> StoredLease:
    """A stored lease."""
    return StoredLease(f"L{job}-x", job, f"r{job}", chain, 3, 30.0, 0.5, "c", None)


def test_round_trip_and_order(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.db")
    store.put_servers([server("b"), server("a", previous_assignment=(1, 2, 1))], {"version": "3"})
    store.put_servers([server("b", tau_p_s=0.2, alive=False, dead_reason="left")])  # an update keeps b first
    store.put_servers([server("c", planned=True, assignment=None)])
    for job in (5, 2, 9):
        store.queued(waiter(job), next_job=10)
    store.granted(lease(2), next_job=10)  # job 2 leaves the queue with its lease
    store.granted(lease(7), next_job=11)
    store.renewed("L7-x", 45.0)
    store.ended("L7-x")
    store.left_queue(9)
    store.close()

    got = StateStore(tmp_path / "s.db").load()  # a new connection reads exactly what was committed
    assert [s.name for s in got.servers] == ["b", "a", "c"]
    assert got.servers[0] == server("b", tau_p_s=0.2, alive=False, dead_reason="left")
    assert got.servers[1].previous_assignment == (1, 2, 1) and got.servers[1].assignment == (0, 4, 3)
    assert got.servers[2].planned and got.servers[2].assignment is None
    assert got.meta["version"] == "3" and got.meta["next_job"] == "11"
    assert got.waiting == [waiter(5)]
    assert got.leases == [lease(2)]


def test_waiting_and_leases_come_back_in_job_order(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.db")
    for job in (8, 3, 6, 1):
        store.queued(waiter(job), next_job=9)
    for job in (40, 12, 30):
        store.granted(lease(job), next_job=41)
    got = store.load()
    assert [w.job for w in got.waiting] == [1, 3, 6, 8]
    assert [x.job for x in got.leases] == [12, 30, 40]


def test_wal_mode_and_synchronous_setting(tmp_path: Path) -> None:
    for mode, code in (("normal", 1), ("FULL", 2)):
        store = StateStore(tmp_path / f"{mode}.db", synchronous=mode)
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == code


def test_bad_settings_and_files_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="synchronous"):
        StateStore(tmp_path / "x.db", synchronous="sometimes")
    StateStore(tmp_path / "old.db").set_meta("schema", "999")
    with pytest.raises(StoreError, match="old.db: state schema 999"):
        StateStore(tmp_path / "old.db")
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        StateStore(tmp_path / "junk.db")


def _child(script: str, db: Path) -> subprocess.Popen:
    """A Python child process running ``script`` against the store at ``db``."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", script, str(db)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_killed_between_the_writes_of_a_grant_leaves_the_request_waiting(tmp_path: Path) -> None:
    """The child dies (SIGKILL) inside ``granted``, after the statement taking the request out of the queue and
    before the one adding its lease: neither happened, so the request is still in line and no lease exists."""
    db = tmp_path / "s.db"
    script = (
        "import os, signal, sys\n"
        "from petals_chain.orchestrator.state.store import StateStore, StoredLease, StoredWaiter\n"
        "s = StateStore(sys.argv[1])\n"
        "for j in range(3):\n"
        "    s.queued(StoredWaiter(j, f'r{j}', 30.0, None, None, 0.0), next_job=3)\n"
        "def die_at_insert(sql):\n"  # SQLite calls this as each statement starts: die when the lease row comes
        "    if 'INTO leases' in sql:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "s._db.set_trace_callback(die_at_insert)\n"
        "s.granted(StoredLease('L0', 0, 'r0', {'spans': [], 'capacity': 1, 'service_time_s': 1.0, 'chain_id': 'x'},"
        " 1, 30.0, 0.0, None, None), next_job=3)\n"
    )
    proc = _child(script, db)
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    got = StateStore(db).load()
    assert [w.job for w in got.waiting] == [0, 1, 2] and got.leases == []


def test_killed_at_any_moment_leaves_a_consistent_state(tmp_path: Path) -> None:
    """A child runs a stream of queue/grant/end writes and is SIGKILLed at an arbitrary moment: the database opens,
    passes SQLite's integrity check, and every job is either waiting or leased (never both), below next_job, with
    at most one lease per slot (the child grants on one chain of capacity 4)."""
    script = (
        "import sys\n"
        "from petals_chain.orchestrator.state.store import StateStore, StoredWaiter, StoredLease\n"
        "s = StateStore(sys.argv[1])\n"
        "chain = {'spans': [['a', 0, 4]], 'capacity': 4, 'service_time_s': 1.0, 'chain_id': 'v1.0'}\n"
        "held, job = [], 0\n"
        "print('go', flush=True)\n"
        "while True:\n"
        "    s.queued(StoredWaiter(job, None, 30.0, None, None, 0.0), next_job=job + 1)\n"
        "    if len(held) == 4:\n"
        "        s.ended(held.pop(0))\n"
        "    s.granted(StoredLease(f'L{job}', job, None, chain, 1, 30.0, 0.0, None, None), next_job=job + 1)\n"
        "    held.append(f'L{job}')\n"
        "    job += 1\n"
    )
    for delay_s in (0.05, 0.3):
        db = tmp_path / f"s{delay_s}.db"
        proc = _child(script, db)
        assert proc.stdout.readline().strip() == "go"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        with sqlite3.connect(db) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        got = StateStore(db).load()
        next_job = int(got.meta["next_job"])
        waiting = {w.job for w in got.waiting}
        leased = {x.job for x in got.leases}
        assert next_job > 0 and not waiting & leased
        assert all(j < next_job for j in waiting | leased)
        assert len(got.leases) <= 4 and len(waiting) <= 1
        assert max(leased) == next_job - 1 or waiting == {next_job - 1}  # the last job written is in one place
