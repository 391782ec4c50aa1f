"""The live page in a real headless browser (Debian's Chromium driven by Playwright) against a live SmolLM2 swarm:
the servers and chains it draws are those /servers and /chains report, leases show up as they are held and
released, and a screenshot is saved.

Chromium and Playwright are test-time requirements: .ci/run installs Chromium, requirements/project.txt pins
Playwright (which drives the system browser and downloads none of its own). Without them this test skips, saying
why, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members
from petals_chain.protocol.blocking import request_json
from tests.live.test_swarm import smollm2_dir  # noqa: F401  (a fixture)

pytestmark = pytest.mark.live

CHROMIUM_ENV = "PETALS_CHAIN_CHROMIUM"
# a holds the whole model, b and c half of it each: two chains of different speed.
PLANS = [ServerPlan("a", "480MB"), ServerPlan("b", "240MB"), ServerPlan("c", "240MB")]


def _need(what: str) -> None:
    """A browser requirement is missing: fail under CI, skip (saying why) elsewhere."""
    msg = f"{what} (.ci/run installs it; `apt-get install -y chromium`, or set ${CHROMIUM_ENV})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of the system Chromium (``$PETALS_CHAIN_CHROMIUM``, else chromium on PATH)."""
    path = os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path or not os.access(path, os.X_OK):
        _need("no Chromium found")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _need("the playwright package is not installed")
    return path


def _route(spans: list[dict]) -> str:
    """A chain as the page writes it: a[0:18] → b[18:30]."""
    return " → ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in spans)


def _shown(page) -> dict:
    """What the page shows now: server rows, chain rows, recent lease ids, bounds and its data version."""
    return page.evaluate("""() => ({
        version: document.body.dataset.version,
        servers: [...document.querySelectorAll('tr.server-row')].map(r => ({
            name: r.querySelector('td.name').textContent, state: r.dataset.state,
            span: r.querySelector('td.span').textContent,
            coloured: r.querySelectorAll('.blk.st-' + r.dataset.state).length})),
        chains: [...document.querySelectorAll('tr.chain-row')].map(r => ({
            chain_id: r.dataset.chainId, capacity: Number(r.dataset.capacity), busy: Number(r.dataset.busy),
            offered: r.dataset.offered === 'true', route: r.querySelector('td.route').textContent})),
        recent: [...document.querySelectorAll('tr.recent-row')].map(r => r.dataset.leaseId),
        queue: document.getElementById('queue-length').textContent,
        lower: document.getElementById('bounds-lower').textContent,
        upper: document.getElementById('bounds-upper').textContent,
    })""")


def test_dashboard_in_chromium_shows_the_swarm(smollm2_dir: Path, chromium: str, tmp_path: Path) -> None:  # noqa: F811
    """Three SmolLM2 servers; one lease held and one released over HTTP: the page's block map and chains equal
    /servers and /chains (names, spans, states, capacities, occupancy), the released lease is listed, the bounds are
    drawn, the screenshot is written; releasing the other lease shows up on the page without a reload."""
    from playwright.sync_api import sync_playwright

    with LocalSwarm(smollm2_dir, PLANS, log_dir=tmp_path / "logs", model_name="SmolLM2-135M-Instruct", max_length=128,
                    arrival_rate=0.5) as sw:
        sw.start(timeout_s=360)
        done = request_json(sw.url + "/lease", data={"timeout_s": 30, "client": "dashboard-test"})
        held = request_json(sw.url + "/lease", data={"timeout_s": 30, "client": "dashboard-test"})
        request_json(sw.url + f"/lease/{done['lease_id']}/release", data={})
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(sw.url + "/dashboard")
                # The page polls by itself: wait (capped) until it draws the state after both leases.
                page.wait_for_function(
                    "() => [...document.querySelectorAll('tr.chain-row')].some(r => r.dataset.busy === '1') && "
                    "document.querySelectorAll('tr.recent-row').length === 1", timeout=60_000)
                shown = _shown(page)
                servers = sw.get("/servers")
                chains = sw.get("/chains")
                assert str(servers["version"]) == shown["version"] == str(chains["version"])

                assert [s["name"] for s in shown["servers"]] == [r["name"] for r in servers["servers"]]
                for row, rec in zip(shown["servers"], servers["servers"]):
                    a = rec["assignment"]
                    assert rec["alive"] and rec["serving"] == {"start": a["start"], "end": a["end"]}
                    if a["num_blocks"]:
                        assert (row["span"], row["state"]) == (f"{a['start']}:{a['end']}", "serving"), row
                        assert row["coloured"] == a["num_blocks"], row  # one cell per block, in its state colour
                    else:
                        assert (row["span"], row["state"], row["coloured"]) == ("—", "idle", 0), row

                offered = [c for c in shown["chains"] if c["offered"]]
                # one chain or two: the default composition, fed the τ the servers measure, may leave b and c idle
                # when a's whole-model chain alone gives the lower bound (their rows are then checked as idle above)
                assert len(offered) >= 1, shown["chains"]
                assert offered == [{"chain_id": c["chain_id"], "capacity": c["capacity"], "busy": c["busy"],
                                    "offered": True, "route": _route(c["spans"])} for c in chains["chains"]]
                on = [c for c in chains["chains"] if c["chain_id"] == held["chain_id"]]
                assert on and on[0]["busy"] == 1 and sum(c["busy"] for c in chains["chains"]) == 1
                assert shown["recent"] == [done["lease_id"]] and shown["queue"] == "0"
                assert shown["lower"].endswith("s") and shown["upper"].endswith("s"), shown
                assert not errors, errors

                shot = tmp_path / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 20_000

                # It updates itself: the release shows up without a reload.
                updates = int(page.evaluate("document.body.dataset.updates"))
                request_json(sw.url + f"/lease/{held['lease_id']}/release", data={})
                page.wait_for_function(
                    "() => [...document.querySelectorAll('tr.chain-row')].every(r => r.dataset.busy === '0') && "
                    "document.querySelectorAll('tr.recent-row').length === 2", timeout=30_000)
                assert _shown(page)["recent"] == [held["lease_id"], done["lease_id"]]  # newest first
                assert int(page.evaluate("document.body.dataset.updates")) > updates
                assert not errors, errors
            finally:
                browser.close()
    assert all(not group_members(pg) for pg in sw.started_pgids)
