"""`bench orchestrator --jffc-only` prints the live JFFC beside the dispatcher path it replaced, and `bench
orchestrator-profile` splits py-spy samples into the items of issue 26 (no timings asserted)."""

from __future__ import annotations

import pytest

from petals_chain.bench.orchestrator import run as run_orchestrator
from petals_chain.bench.orchestrator_profile import report, split

DRIVER = 'process 10:"python -m petals_chain.bench orchestrator"'
CHILD = ('process 11:"python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7) '
         '--multiprocessing-fork"')
LOOP = ("_serve_child (petals_chain/bench/orchestrator.py:96);run (petals_chain/orchestrator/event_loop.py:29);"
        "BaseEventLoop.run_forever (asyncio/base_events.py:607);"
        "BaseEventLoop._run_once (asyncio/base_events.py:1922);Handle._run (asyncio/events.py:80)")
MIDDLEWARES = "_api_middleware.<locals>.middleware (petals_chain/orchestrator/http/api.py:143)"


def _sample(frames: str, n: int, thread: str = "MainThread", proc: str = CHILD) -> str:
    return f"{DRIVER};{proc};thread (11): {thread};{frames} {n}"


def test_profile_split_counts_each_sample_for_its_innermost_item(capsys: pytest.CaptureFixture[str]) -> None:
    raw = "\n".join([
        _sample(f"{LOOP};{MIDDLEWARES};_lease (petals_chain/orchestrator/http/api.py:356);"
                "Orchestrator.lease_json (petals_chain/orchestrator/engine/core.py:273);dumps (json/__init__.py:231);"
                "JSONEncoder.iterencode (json/encoder.py:258)", 5),
        _sample(f"{LOOP};{MIDDLEWARES};_authorize (petals_chain/orchestrator/http/api.py:170)", 1),
        _sample(f"{LOOP};{MIDDLEWARES};_authorize (petals_chain/orchestrator/http/api.py:170);"
                "Guard.authorize (petals_chain/orchestrator/trust/auth.py:306)", 2),
        _sample(f"{LOOP};{MIDDLEWARES};_lease (petals_chain/orchestrator/http/api.py:356);"
                "LeaseManager.acquire (petals_chain/orchestrator/leasing/leases.py:300);"
                "JFFC.on_arrival (petals_chain/dispatch/jffc.py:47)", 2),
        _sample(f"{LOOP};RequestHandler.data_received (aiohttp/web_protocol.py:446)", 7),
        _sample(f"{LOOP};_serve_child.<locals>.main (petals_chain/bench/orchestrator.py:90);"
                "Orchestrator.install (petals_chain/orchestrator/engine/core.py:118)", 11),  # before it serves
        _sample("_serve_child (petals_chain/bench/orchestrator.py:96);BaseEventLoop._run_once "
                "(asyncio/base_events.py:1922);EpollSelector.select (selectors.py:468)", 13),
        _sample("_WorkItem.run (concurrent/futures/thread.py:58);StateStore.commit "
                "(petals_chain/orchestrator/state/store.py:153)", 4, thread="ThreadPoolExecutor-0_0"),
        f"{DRIVER};thread (10): MainThread;run (petals_chain/bench/orchestrator.py:300);"
        "_http_level (petals_chain/bench/orchestrator.py:120);ClientSession._request (aiohttp/client.py:600) 6",
    ])
    counts = split(raw)
    assert counts["process 11"] == {
        "JSON encode/decode (stdlib json)": 5, "credentials (auth middleware, auth.py)": 3,
        "the policy call (JFFC)": 2, "aiohttp HTTP server (parse, route, write)": 7, "(startup)": 11, "(idle)": 13,
        "(other threads busy)": 4}
    assert counts["driver"] == {"(clients busy)": 6}
    report(counts, rate=100.0, round_trips=10)
    out = capsys.readouterr().out
    assert "17 busy samples on the event loop = 17000 µs per round trip" in out
    assert "| the policy call (JFFC) | 11.8 % | 2000 |" in out


def test_jffc_only_prints_old_and_new_at_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_orchestrator(["--jffc-only", "--pairs", "300", "--chains", "50"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in {"10", "50", "100",
                                                                                            "1000"}]
    assert [r[0] for r in rows] == ["10", "50", "100", "1000"]
    for r in rows:  # chains, capacity, old, new, ratio, old, new, ratio: positive times, ratio = old / new
        old, new, ratio = float(r[2]), float(r[3]), float(r[4].rstrip("x"))
        assert old > 0 and new > 0 and ratio == pytest.approx(old / new, rel=0.02, abs=0.01)
    assert "LeaseManager acquire+release in-process" in out
