"""Table 1 live: trace scaling, statistics, bad inputs stopped before anything starts, BPRR's WS-RR lease manager,
and a short real replay (root only): a tiny LLaMA on a 2-server testbed, profiled live, replayed through PETALS and
the proposed scheme with every request served and Little's law holding on the replay.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from petals_chain.experiments.replay import (
    ReplayResult,
    RequestRecord,
    check_littles_law,
    littles_law,
    plan_replay,
    scale_tokens,
    summarize,
)
from petals_chain.experiments.table1 import check_inputs, main
from petals_chain.launch import state
from petals_chain.compose.method_table import METHODS
from petals_chain.launch.live_methods import petals_num_blocks, petals_throughput_cache
from petals_chain.model import InfeasibleError, ModelSpec, ServerSpec
from petals_chain.data.azure import Trace

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def _trace(arrival: list[float], ins: list[int], outs: list[int]) -> Trace:
    """A trace object as read_azure_trace returns it."""
    return Trace(np.array(arrival, float), np.array(ins), np.array(outs), "test")


def write_trace(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    """An Azure-format trace file."""
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{i},{o}\n" for t, i, o in rows))
    return path


# ---- scaling ------------------------------------------------------------------------------------------------


def test_tokens_are_scaled_and_clipped_to_the_static_job_length() -> None:
    """Prompts × input scale, outputs × output scale, each ≥ 1 and l_in + l_out ≤ max_length."""
    inp, out = scale_tokens(np.array([4808, 3180, 10, 40000]), np.array([10, 8, 0, 900]), input_scale=1 / 32,
                            output_scale=1.0, max_length=1000)
    assert list(out) == [10, 8, 1, 900]
    assert list(inp[:3]) == [150, 99, 1] and inp[3] == 100  # 1250 clipped to 1000 − 900
    assert np.all(inp + out <= 1000) and np.all(inp >= 1) and np.all(out >= 1)
    with pytest.raises(ValueError, match="token scales"):
        scale_tokens(np.array([1]), np.array([1]), input_scale=0, output_scale=1, max_length=10)


def test_time_scale_puts_the_trace_at_load_times_capacity() -> None:
    """Replay rate = load × capacity; the capacity is converted to the replay's mean job by the job-time ratio."""
    tr = _trace([0.0, 1.0, 1.5, 4.0, 5.0], [320, 640, 64, 3200, 32], [10, 20, 30, 40, 50])
    plan = plan_replay(tr, capacity_per_s=2.0, load=0.5, input_scale=1 / 32, output_scale=1.0, max_length=1527)
    assert plan.trace_rate_per_s == pytest.approx(4 / 5.0)
    assert plan.replay_rate_per_s == pytest.approx(1.0)
    assert plan.time_scale == pytest.approx(0.8)
    assert plan.arrival_s == pytest.approx([0.0, 0.8, 1.2, 3.2, 4.0])
    assert (plan.n - 1) / plan.arrival_s[-1] == pytest.approx(0.5 * 2.0)

    def job_time(l_in: float, l_out: float) -> float:
        return 1.0 + 0.01 * l_in + 0.1 * l_out

    conv = plan_replay(tr, capacity_per_s=2.0, load=0.5, input_scale=1 / 32, output_scale=1.0, max_length=1527,
                       job_time_s=job_time, capacity_job=(64, 24))
    mean_job = job_time(conv.input_tokens.mean(), conv.output_tokens.mean())
    assert conv.capacity_per_s == pytest.approx(2.0 * job_time(64, 24) / mean_job)
    text = " ".join(conv.describe())
    assert "time scale x" in text and "token scale: input x0.03125, output x1" in text
    with pytest.raises(ValueError, match="capacity"):
        plan_replay(tr, capacity_per_s=0.0, load=0.5, input_scale=1, output_scale=1, max_length=100)


def _rec(i: int, arrival: float, start: float, end: float, error: str = "") -> RequestRecord:
    """A request record with consistent waiting/service/response."""
    return RequestRecord("m", i, arrival, start, end, start - arrival, end - start, end - arrival, 8, 4, 4, 0, 0.0,
                         "", error)


def test_summary_statistics_and_littles_law() -> None:
    """Means, medians and percentiles of served requests (failed ones excluded); sampled L equals λW."""
    recs = [_rec(i, float(i), float(i) + 0.5 * i, float(i) + 0.5 * i + 2.0) for i in range(10)]
    recs.append(_rec(10, 10.0, math.nan, math.nan, error="boom"))
    s = summarize(recs)
    resp = np.array([r.response_s for r in recs[:10]])
    assert s["served"] == 10 and s["requests"] == 11
    assert s["response_mean"] == pytest.approx(resp.mean())
    assert s["response_p95"] == pytest.approx(np.percentile(resp, 95))
    assert s["waiting_max"] == pytest.approx(4.5) and s["service_median"] == pytest.approx(2.0)
    t = np.arange(0.0, 30.0, 0.001)
    n = np.array([sum(1 for r in recs[:10] if r.arrival_s <= x < r.end_s) for x in t[::50]])
    res = ReplayResult("m", recs, np.column_stack([t[::50], n]), 30.0)
    sampled, lw = littles_law(res)
    assert sampled == pytest.approx(lw, rel=0.02)
    # A starved monitor: while 3 or more are in flight it samples 8 times less often. The time-weighted
    # mean still matches λW; a plain mean of the samples would not.
    grid = t[::50]
    keep = (n < 3) | (np.arange(grid.size) % 8 == 0)
    sparse = np.column_stack([grid[keep], n[keep]])
    sampled, lw = littles_law(ReplayResult("m", recs, sparse, 30.0))
    assert sampled == pytest.approx(lw, rel=0.05)
    inside = (sparse[:, 0] >= 0.0) & (sparse[:, 0] <= max(r.end_s for r in recs[:10]))
    assert abs(sparse[inside, 1].mean() - lw) > 0.1 * lw
    cut = RequestRecord("m", 11, 5.0, math.nan, 65.0, 60.0, math.nan, 60.0, 8, 4, 0, 3, 0.0, "", "not finished",
                        censored=True)
    s2 = summarize(recs + [cut])
    assert s2["censored"] == 1 and s2["served"] == 10 and s2["waiting_max"] == 60.0
    assert s2["response_mean"] == pytest.approx((resp.sum() + 60.0) / 11)  # a lower bound, counted at the cutoff
    assert s2["service_mean"] == pytest.approx(s["service_mean"])  # service: served requests only


# ---- bad input stops everything before it starts -------------------------------------------------------------


def test_missing_trace_is_an_error_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """main() and the shell script: exit 2 naming the file; no launch record, no namespace is created."""
    os.environ["PETALS_CHAIN_LAUNCH_STATE"] = str(tmp_path / "state")
    try:
        before = set(state.list_netns())
        assert main(["--quick", "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path)]) == 2
        assert "trace file not found" in capsys.readouterr().err
        assert set(state.list_netns()) == before and not (tmp_path / "state").exists()
    finally:
        del os.environ["PETALS_CHAIN_LAUNCH_STATE"]
    env = {**os.environ, "PETALS_CHAIN_LAUNCH_STATE": str(tmp_path / "state2")}
    proc = subprocess.run(["bash", str(REPO / "experiments" / "table1.sh"), "--quick", "--trace",
                           str(tmp_path / "nope.csv")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "trace file not found" in proc.stderr
    assert "profiling" not in proc.stdout and not (tmp_path / "state2").exists()


def test_malformed_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A bad timestamp or token count: exit 2 with file and line, before anything starts."""
    good = ("2023-11-16 18:17:03.9799600", 4808, 10)
    bad_time = write_trace(tmp_path / "t1.csv", [good, ("2023-11-16 18:17:04.03", 3180, 8), ("yesterday", 1, 1)])
    assert check_inputs(["--trace", str(bad_time), "--requests", "3"]) == 2
    assert f"{bad_time}:4: malformed TIMESTAMP" in capsys.readouterr().err
    bad_tokens = write_trace(tmp_path / "t2.csv", [good, ("2023-11-16 18:17:05.0", -3, 8)])
    assert check_inputs(["--trace", str(bad_tokens), "--requests", "2"]) == 2
    assert f"{bad_tokens}:3: ContextTokens is negative" in capsys.readouterr().err
    short = good_trace = write_trace(tmp_path / "t3.csv", [good])
    assert check_inputs(["--trace", str(short), "--requests", "5"]) == 2
    assert "1 requests, --requests asks for 5" in capsys.readouterr().err
    assert check_inputs(["--trace", str(bad_tokens), "--methods", "petals,magic"]) == 2
    assert "unknown method(s) magic" in capsys.readouterr().err
    assert check_inputs(["--trace", str(good_trace), "--methods", "petals", "--resume", "--rerun", "bprr"]) == 2
    assert "--rerun: bprr not among --methods (petals)" in capsys.readouterr().err


# ---- the methods' compositions and BPRR's WS-RR ---------------------------------------------------------------


MODEL = ModelSpec(6, 1.0, 0.1, "toy")


def _servers(memories: list[float]) -> list[ServerSpec]:
    """Servers of the toy model; faster ones first."""
    return [ServerSpec(f"s{j}", m, 0.5 + 0.1 * j, 0.05 * (1 + j)) for j, m in enumerate(memories)]


def test_method_compositions() -> None:
    """JFFC only is infeasible when no server holds the model; BPRR has a placement and no fixed chains;
    PETALS sizes servers with its own rule (cache for DEFAULT_CACHE_JOBS sessions)."""
    small = _servers([4.0, 4.0, 4.0])
    with pytest.raises(InfeasibleError, match="whole model"):
        METHODS["jffc_only"].compose(small, MODEL, 0.5)
    b = METHODS["bprr"].compose(small, MODEL, 0.5)
    assert b.chains == () and b.c == b.meta["R"] >= 1 and sum(b.placement.num_blocks) >= MODEL.num_blocks
    p = METHODS["proposed"].compose(small, MODEL, 0.5)
    assert p.total_capacity >= 1
    assert petals_num_blocks(small, MODEL) == [min(6, math.floor(4.0 / 1.2 + 1e-9))] * 3
    cache = petals_throughput_cache(Path("/m"), "float32", 250.0, 4000.0)
    assert cache == {"model_/m_device_CPU_dtype_float32": {"inference_rps": 250.0, "forward_rps": 4000.0,
                                                           "network_rps": 1e9}}


def test_ws_rr_routes_cover_the_model_and_never_overcommit_a_server() -> None:
    """Many concurrent requests on a split placement: each lease's route covers blocks 0..L contiguously, and the
    blocks held per server never exceed its M̃_j slots; releases let waiting requests start in order."""
    from petals_chain.compose.capacity import cache_slots
    from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager

    servers = _servers([4.0, 3.5, 3.5, 3.0])
    comp = METHODS["bprr"].compose(servers, MODEL, 2.0)
    slots = dict(zip([s.name for s in servers], cache_slots(servers, MODEL, comp.placement)))

    async def scenario() -> tuple[int, int, list[int]]:
        m = WsRrLeaseManager(default_ttl_s=60.0)
        m.set_composition(comp, 1)
        tasks = [asyncio.create_task(m.acquire(timeout_s=30.0)) for _ in range(40)]
        granted_order: list[int] = []
        active: dict[str, object] = {}
        peak = 0
        while len(granted_order) < len(tasks):
            await asyncio.sleep(0.01)
            for k, t in enumerate(tasks):
                if t.done() and k not in granted_order:
                    granted_order.append(k)
                    active[t.result().lease_id] = t.result()
            held: dict[str, int] = {}
            for lease in active.values():
                spans = lease.chain.spans
                assert spans[0].start == 0 and spans[-1].end == MODEL.num_blocks
                assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
                for s in spans:
                    held[s.server] = held.get(s.server, 0) + s.end - s.start
            assert all(held[n] <= slots[n] for n in held), (held, slots)
            peak = max(peak, len(active))
            if active:  # finish the oldest lease
                oldest = min(active, key=lambda x: active[x].job)
                m.release(oldest)
                del active[oldest]
        return peak, m.queue_length(), granted_order

    peak, queued, order = asyncio.run(scenario())
    assert queued == 0 and len(order) == 40 and peak >= 2


def test_ws_rr_waiting_request_times_out_and_leaves_the_queue() -> None:
    """A request that cannot start within its timeout raises and no longer blocks the FIFO."""
    from petals_chain.orchestrator.leasing.leases import LeaseTimeoutError
    from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager

    comp = METHODS["bprr"].compose(_servers([7.3]), MODEL, 0.5)  # one server: 6 blocks + 13 slots = 2 jobs

    async def scenario() -> tuple[int, int]:
        m = WsRrLeaseManager()
        m.set_composition(comp, 1)
        a = await m.acquire(timeout_s=1.0)
        b = await m.acquire(timeout_s=1.0)
        with pytest.raises(LeaseTimeoutError):
            await m.acquire(timeout_s=0.05)
        q = m.queue_length()
        m.release(a.lease_id)
        c = await m.acquire(timeout_s=1.0)
        return q, len({a.lease_id, b.lease_id, c.lease_id})

    assert asyncio.run(scenario()) == (0, 3)


# ---- a short real replay (root) --------------------------------------------------------------------------------


def _netns_works() -> bool:
    """Root on a kernel with network namespaces."""
    if os.geteuid() != 0:
        return False
    name = f"pcltab{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def _free_subnet() -> str:
    """A /24 in 10.233.0.0/16 not used on this host."""
    from petals_chain.launch import netns
    from petals_chain.launch.launcher import host_addresses

    used = host_addresses()
    for k in range(256):
        cand = ipaddress.IPv4Network(f"10.233.{(os.getpid() + k) % 256}.0/24")
        if not netns.host_conflicts(cand, used):
            return str(cand)
    pytest.skip("no free /24 in 10.233.0.0/16")


def _median_alone_decode(rows) -> float:
    """The median seconds of a server's decode batches of one session (one token) from its step log."""
    import statistics

    alone = [r.seconds for r in rows if r.sessions == 1 and r.tokens == 1]
    assert alone, "no decode step of one session alone in the step log"
    return statistics.median(alone)


@pytest.mark.live
@pytest.mark.skipif(not _netns_works(), reason="needs root and network namespaces")
def test_short_live_replay_through_petals_and_the_proposed_scheme(tmp_path: Path) -> None:
    """Tiny LLaMA, 2 servers (one four times slower) behind 20/30 ms relays: the live profiler's fit sees the delays
    and the slowdown, its batch probe reads τp(b) from the servers' step logs; a 6-request replay through PETALS and
    the proposed scheme serves every request exactly, with waiting ≥ 0, service > 0, and the sampled number in flight
    equal to λ·W (Little's law)."""
    import yaml

    from petals_chain.launch.launcher import Launch
    from petals_chain.launch.live_methods import LiveMethod
    from petals_chain.launch.live_setup import FittedServer, model_setup
    from petals_chain.launch.profile_fit import ProfileGrid, batch_slowdown, fit_server
    from petals_chain.launch.profile_live import LiveProfiler
    from petals_chain.launch.testbed import load_testbed
    from petals_chain.loopback.swarm import write_tiny_llama

    os.environ["PETALS_CHAIN_LAUNCH_STATE"] = str(tmp_path / "state")
    model_dir = write_tiny_llama(tmp_path / "tiny", seed=0)  # 4 blocks of 128; 512 B of cache per token
    tb_path = tmp_path / "tb.yaml"
    tb_path.write_text(yaml.safe_dump({
        "name": "tiny", "model": {"name": "tiny-llama", "path": str(model_dir), "blocks": 4,
                                  "block_size": 590848, "cache_size": 512 * 128},
        "cpu_servers": [{"name": "a", "memory_budget": "4MB", "speed_factor": 1.0},
                        {"name": "b", "memory_budget": "4MB", "speed_factor": 0.25}],
        "latency": {"rtt_ms": {"a": 20, "b": 30}, "method": "relay"},
        "network": {"subnet": _free_subnet()}}))
    tb = load_testbed(tb_path)
    setup = model_setup(tb)
    assert setup.max_length == 128
    trace = write_trace(tmp_path / "trace.csv", [(f"2023-11-16 18:17:{s:02d}.0", i, o) for s, i, o in
                                                 [(0, 320, 5), (1, 640, 3), (1, 96, 8), (3, 1600, 4), (4, 64, 6),
                                                  (6, 480, 2)]])
    # Decode steps on 1 and on all 4 blocks, twice each, so that t_out (about a millisecond per block here) stands
    # out of the relays' round-trip jitter; b runs at a quarter of a's speed.
    grid = ProfileGrid(blocks=(1, 1.0), input_tokens=(8, 32), output_tokens=(2, 12), base_input=16, base_output=8,
                       repeats=2)
    try:
        with Launch(tb, log=lambda _: None) as launch:
            launch.up()
            with LiveProfiler(launch, setup, tmp_path / "logs-profile", session_tokens=64) as prof:
                samples = prof.measure(grid, np.random.default_rng(0))
                cap = prof.capacity(16, 4, streams=2, duration_s=3.0, warmup_s=1.0)
                steps = prof.batch_probe([1, 2, 4], 16, 6)
            for name, rows in steps.items():  # τp(b) from the servers' own step logs (they batch by default)
                assert max(r.sessions for r in rows) >= 2, name  # several sessions' steps ran as one
                curve = batch_slowdown(rows, name)
                assert curve[0] == 1.0 and len(curve) >= 2, (name, curve)
                assert all(1.0 <= g <= b for b, g in enumerate(curve, start=1)), (name, curve)
            fits = {s.name: fit_server(samples, s.name, rtt_s=s.rtt_s, speed_factor=s.speed_factor)
                    for s in tb.servers}
            assert fits["a"].round_trip_s > 0.8 * 0.020 and fits["b"].round_trip_s > 0.8 * 0.030
            # b computes four times slower: its runtime's own step log (compute only, no relay) shows its decode step
            # of one session alone well over twice a's. The client-side decode samples cannot show it reliably: on
            # this tiny model a block costs under a millisecond, and the relays' jitter is larger
            alone = {name: _median_alone_decode(rows) for name, rows in steps.items()}
            assert alone["b"] > 2.0 * alone["a"], alone
            assert cap.jobs_per_s > 0 and cap.completed >= 1
            from petals_chain.data.azure import read_azure_trace

            plan = plan_replay(read_azure_trace(trace), capacity_per_s=cap.jobs_per_s, load=0.5, input_scale=1 / 32,
                               output_scale=1.0, max_length=setup.max_length)
            # A block of this tiny model computes in under a millisecond, below the relays' jitter, so the fit may
            # put all of a server's time in its round trip (τp = 0). The runtime's own decode steps bound a job's
            # per-block computation from below: its 3 decode steps per block take at least 3 × alone / blocks.
            tau_p = {s.name: max(fits[s.name].tau_p_s(16, 4), 3 * alone[s.name] / setup.num_blocks)
                     for s in tb.servers}
            servers = [FittedServer(s.name, s.memory_bytes, tau_p[s.name], fits[s.name].tau_c_s(4),
                                    fits[s.name].inference_rps, fits[s.name].forward_rps) for s in tb.servers]
            from petals_chain.experiments.replay import prompts_for, replay
            from petals_chain.launch.swarm_procs import TestbedSwarm

            prompts = prompts_for(plan, 512, seed=1)
            swarm = TestbedSwarm(launch, setup, tmp_path / "logs")
            for method in ("petals", "proposed"):
                with LiveMethod(method, swarm, servers, arrival_rate=plan.replay_rate_per_s, job=(16, 4),
                                ready_timeout_s=120) as live:
                    assert live.info.placement, method
                    res = replay(method, live.client.serve, plan, prompts, drain_timeout_s=120)
                recs = res.records
                assert [r.error for r in recs] == [""] * plan.n and not any(r.censored for r in recs), method
                assert all(r.generated == r.output_tokens for r in recs)
                assert all(r.waiting_s >= 0 and r.service_s > 0 for r in recs), method
                assert all(r.response_s == pytest.approx(r.waiting_s + r.service_s) for r in recs)
                # Little's law: the monitor's in-flight count equals the records' at the instants it sampled (the
                # bookkeeping agrees); with 6 requests a monitor thread starved of CPU on a busy machine can miss
                # λW by sampling too sparsely, which check_littles_law tells apart from an accounting error
                check = check_littles_law(res, tolerance=0.15)
                assert check.sampled_l == pytest.approx(check.records_l, rel=0.05, abs=0.05), check.describe()
                assert check.ok or check.cause == "sampling", (method, check.describe())
            assert not swarm.procs
    finally:
        del os.environ["PETALS_CHAIN_LAUNCH_STATE"]
    assert not list((tmp_path / "state").glob("*.json"))  # torn down
