"""The orchestrator chooses speculative widths in lease replies: greedy(p*) from the load it measures, cut to the free
units, renewed widths cut back when units are over-committed; the API, /metrics, the profile file and the flags."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from petals_chain.model import SpecError
from petals_chain.moldable.policies import scheme_probabilities
from petals_chain.moldable.speedup import SpeedUp
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.cli import main as orchestrator_main
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.moldable.live import WIDTH_METHODS, SpeedUpProfile, speedup_profile, width_probabilities
from petals_chain.orchestrator.leasing.widths import LeaseWidths
from petals_chain.protocol.hop import Hop
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from tests.orchestrator.test_orchestrator import make_orchestrator, run, serving

S = SpeedUp((1.0, 1.8, 2.5, 3.0, 3.4))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _widths(capacity: int, policy: str = "greedy-p", seed: int = 3) -> tuple[LeaseManager, LeaseWidths, Clock]:
    """A lease manager over one chain of ``capacity`` slots and its width rule on a hand-moved clock."""
    clock = Clock()
    lm = LeaseManager(clock=clock)
    lm.set_chains([ChainInfo((Hop("x", 0, 4),), capacity=capacity, service_time_s=1.0, chain_id="x")], 1)
    widths = LeaseWidths(
        S, policy, np.random.default_rng(seed), mean_size_s=1.0, mean_interarrival_s=1.0, headroom=0.7, clock=clock
    )
    widths.bind(lm)
    return lm, widths, clock


async def _session(lm: LeaseManager, widths: LeaseWidths, k_max: int) -> int:
    """One session that arrives now, takes its lease and width, and leaves after its size 1 at that width."""
    widths.arrival()
    lease = await lm.acquire(timeout_s=1)
    width = widths.grant(lease, k_max)
    lm.release(lease.lease_id)
    widths.release(lease, held_s=1.0 / S.s[width - 1])
    return width


def test_low_load_gives_wide_sessions_high_load_narrow_ones_as_greedy_p_says() -> None:
    """Arrivals 10 s apart on 20 units: every session on d = 5; 0.08 s apart: λ = 0.625, λ/ρ̄ = 0.89, so widths 2
    and 3 in the proportions of moldable's greedy(p*) (Theorem 1) at the load the orchestrator measured."""

    async def body() -> None:
        lm, widths, clock = _widths(20)
        low = []
        for _ in range(40):
            clock.now += 10.0
            low.append(await _session(lm, widths, k_max=8))
        assert low[-10:] == [5] * 10
        assert widths.rule.load < 0.01
        high = []
        for _ in range(400):
            clock.now += 0.08
            high.append(await _session(lm, widths, k_max=8))
        load = widths.rule.load
        assert abs(load - 0.625) < 0.02
        p = widths.rule.probabilities()
        np.testing.assert_allclose(p, scheme_probabilities(S, load / 0.7, "greedy-p"), atol=1e-12)
        np.testing.assert_allclose(p, width_probabilities(S, load, 0.7), atol=1e-12)
        late = np.array(high[-300:])
        assert set(late.tolist()) <= {2, 3}
        assert abs(np.mean(late == 3) - p[2]) < 0.08, (np.mean(late == 3), p)
        assert np.mean(late) < np.mean(low[-10:])
        assert widths.rule.chosen[5] >= 10 and widths.in_use() == 0

    run(body())


def test_k_max_caps_the_law_and_free_units_cut_the_width_renew_cuts_overcommitment() -> None:
    """fixed-max on 4 units: the first session gets min(d, k_max, free) = 4; the next finds no unit free and runs at
    width 1 (a granted lease always runs); the units are then over-committed by one, so a renew cuts the wide
    session to 3; k_max = 2 caps a fresh session at 2."""

    async def body() -> None:
        lm, widths, clock = _widths(4, policy="fixed-max")
        wide = await lm.acquire(timeout_s=1)
        assert widths.grant(wide, 8) == 4
        assert widths.grant(wide, 8) == 4  # a retried request keeps its width
        narrow = await lm.acquire(timeout_s=1)
        assert widths.grant(narrow, 8) == 1
        assert widths.in_use() == 5 and widths.units == 4
        assert widths.renew(wide.lease_id) == 3 and widths.in_use() == 4
        lm.release(narrow.lease_id)
        widths.release(narrow, 1.0)
        capped = await lm.acquire(timeout_s=1)
        assert widths.grant(capped, 2) == 1  # 3 units held by `wide`: one left
        lm.release(wide.lease_id)
        widths.release(wide, 1.0)
        again = await lm.acquire(timeout_s=1)
        assert widths.grant(again, 2) == 2  # capped by k_max, not by the units
        assert dict(widths.active()) == {1: 1, 2: 1}

    run(body())


def test_greedy_p_chooses_from_the_s_k_measured_beside_as_many_sessions_as_hold_leases() -> None:
    """A profile measured alone (S, d = 5) and beside 3 other sessions (flat: wider barely helps, d = 2), at a load
    near 0 on 20 units: greedy-p gives the first two sessions 5 (granted beside 0 and 1: the nearest measured count
    is 0) and the next two 2 (beside 2 and 3: nearest 3); greedy-p-lone gives all four 5 (the lone s(k), the rule
    before batching). A release measures the size with the profile of the count its grant saw."""
    flat = SpeedUp((1.0, 1.05))

    async def body(policy: str) -> list[int]:
        clock = Clock()
        lm = LeaseManager(clock=clock)
        lm.set_chains([ChainInfo((Hop("x", 0, 4),), capacity=20, service_time_s=1.0, chain_id="x")], 1)
        widths = LeaseWidths(S, policy, np.random.default_rng(0), mean_size_s=0.01, mean_interarrival_s=100.0,
                             headroom=0.7, clock=clock, batched={0: S, 3: flat})
        widths.bind(lm)
        got, leases = [], []
        for _ in range(4):
            lease = await lm.acquire(timeout_s=1)
            leases.append(lease)
            got.append(widths.grant(lease, 8))
        assert widths.to_json()["others_now"] == 4
        assert widths.to_json()["speedup_by_others"] == {"0": list(S.s), "3": list(flat.s)}
        before = widths.rule.size.mean
        lm.release(leases[3].lease_id)
        widths.release(leases[3], held_s=10.0)  # granted beside 3: size 10 · s_3(width)
        s3 = flat.s[min(got[3], flat.d) - 1]  # what a width achieves beside 3 is measured, whatever the policy
        assert widths.rule.size.mean == pytest.approx(before + 0.2 * (10.0 * s3 - before))
        return got

    assert asyncio.run(body("greedy-p")) == [5, 5, 2, 2]
    assert asyncio.run(body("greedy-p-lone")) == [5, 5, 5, 5]


def _rule(policy: str = "greedy-p") -> LeaseWidths:
    """A width rule over S for a test orchestrator (handed to it at construction)."""
    return LeaseWidths(S, policy, np.random.default_rng(0), mean_size_s=1.0, mean_interarrival_s=100.0, headroom=0.7)


def test_lease_reply_carries_the_width_and_bad_requests_name_the_field() -> None:
    """POST /lease with k_max: a width in 1..k_max in the reply and on renew; k_max out of range or not an integer,
    or k_max at an orchestrator that chooses no widths: 400 naming k_max; POST /width switches the policy (unknown
    policy: 400); /metrics counts the widths chosen."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            with pytest.raises(OrchestratorError, match="k_max.*chooses no speculative widths") as err:
                await oc.lease(timeout_s=1, k_max=4)
            assert err.value.status == 400
        orch = make_orchestrator(widths=_rule())  # the same swarm, choosing widths
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            lease = await oc.lease(timeout_s=1, k_max=3)
            assert lease.width == 3  # idle swarm: p* puts all mass on the widest allowed width
            assert (await oc.renew(lease.lease_id)).width == 3
            plain = await oc.lease(timeout_s=1)
            assert plain.width is None
            async with aiohttp.ClientSession() as http:
                for bad in (0, 33, "3", 2.5, True):
                    async with http.post(url + "/lease", json={"timeout_s": 1, "k_max": bad}) as resp:
                        assert resp.status == 400
                        assert "k_max" in (await resp.json())["error"]
            with pytest.raises(OrchestratorError, match="unknown width policy 'widest'"):
                await oc.width("widest")
            view = await oc.width("fixed-1", arrival_rate=2.0)
            assert view["policy"] == "fixed-1" and view["mean_interarrival_s"] == 0.5 and view["chosen"] == {}
            one = await oc.lease(timeout_s=1, k_max=5)
            assert one.width == 1
            view = await oc.width()
            assert view["chosen"] == {"1": 1} and view["active"] == {"1": 1, "3": 1}
            assert view["units"] == 4 and view["units_in_use"] == 5  # 3 + the plain lease + 1: over-committed
            assert (await oc.renew(lease.lease_id)).width == 2  # so a renew cuts the widest back
            await oc.release(one.lease_id)
            assert (await oc.width())["active"] == {"2": 1}
            text = await oc.metrics()
            assert 'petals_chain_width_chosen_total{width="1"} 1.0' in text
            assert 'petals_chain_width_info{policy="fixed-1",scheme=""} 1.0' in text
            assert "petals_chain_width_load " in text

    run(body())


def test_profile_file_is_fitted_or_validated_and_bad_ones_are_refused(tmp_path: Path) -> None:
    """Measured tokens/s: the concave hull (normalised, s_1 = 1); a speed-up table: taken as is when concave,
    refused otherwise; malformed files and rows are refused naming the file."""
    measured = tmp_path / "speedup.csv"
    measured.write_text("width,tokens_per_s,service_s\n1,2.0,30\n2,3.3,20\n3.0,4.1,15\n4,4.0,16\n")
    profile = speedup_profile(measured)
    s, service = profile.lone, profile.service_s
    assert s.s[0] == 1.0 and s.d == 3 and abs(s.s[1] - 1.65) < 1e-9 and service == 30.0
    assert profile.batched == {}  # measured alone only: nothing about batches
    table = tmp_path / "table.json"
    table.write_text(json.dumps([{"width": k, "speedup": v} for k, v in enumerate(S.s, 1)]))
    assert speedup_profile(table) == SpeedUpProfile({0: S}, None)
    bad = {
        "convex.json": (
            json.dumps(
                {"rows": [{"width": 1, "speedup": 1}, {"width": 2, "speedup": 1.2}, {"width": 3, "speedup": 2.0}]}
            ),
            "not concave at i = 2",
        ),
        "empty.csv": ("width,tokens_per_s\n", "non-empty list of rows"),
        "column.csv": ("k,tokens\n1,2\n", "every row needs an integer 'width'"),
        "half.csv": ("width,tokens_per_s\n1.5,2\n", "is not an integer"),
        "others.csv": ("width,others,tokens_per_s\n1,-1,2\n", "is not an integer >= 0"),
        "nobase-batch.csv": ("width,others,tokens_per_s\n1,0,2\n2,0,3\n2,3,2.5\n",
                             r"\(others = 3\): .*a measurement at one server"),
        "broken.json": ("[{", "malformed"),
        "nobase.csv": ("width,tokens_per_s\n2,3\n", "a measurement at one server"),
    }
    for name, (text, message) in bad.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SpecError, match=message):
            speedup_profile(path)
    with pytest.raises(SpecError, match="cannot read it"):
        speedup_profile(tmp_path / "missing.csv")


def test_width_flags_are_checked_before_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--width without a profile, a profile without --width, or a bad profile: one line, exit code 2; the method
    table names the simulator's schemes where they exist."""
    base = ["--model-blocks", "4", "--block-bytes", "1e9", "--cache-bytes", "1e8", "--port", "0"]
    convex = tmp_path / "convex.csv"
    convex.write_text("width,speedup\n1,1\n2,1.2\n3,2\n")
    cases = {
        ("--width", "greedy-p"): "give --speedup-profile",
        ("--speedup-profile", str(convex)): "give --width too",
        ("--width", "fixed-max", "--speedup-profile", str(convex)): "not concave",
    }
    for extra, message in cases.items():
        assert orchestrator_main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    assert {m.name: m.scheme for m in WIDTH_METHODS.values()} == {
        "greedy-p": "greedy-p",
        "greedy-p-lone": "greedy-p",
        "fixed-1": None,
        "fixed-max": "greedy",
    }
    with pytest.raises(SystemExit):
        orchestrator_main([*base, "--width", "widest"])
    assert "invalid choice: 'widest'" in capsys.readouterr().err


def test_a_failover_replacement_keeps_the_width() -> None:
    """report-failure: the replacement lease keeps the width its session had."""

    async def body() -> None:
        orch = make_orchestrator(widths=_rule("fixed-max"))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            lease = await oc.lease(timeout_s=1, k_max=2)
            assert lease.width == 2
            server = lease.spans[0].server
            replacement = await oc.report_failure(lease.lease_id, server, timeout_s=2)
            assert replacement.width == 2 and replacement.lease_id != lease.lease_id
            await asyncio.sleep(0)
            assert (await oc.width())["active"] == {"2": 1}

    run(body())
