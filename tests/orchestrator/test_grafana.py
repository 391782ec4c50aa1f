"""deploy/grafana/petals_chain.json: every metric it queries is in the orchestrator's /metrics, every label it groups by
is on that metric, and it has the panels operators need (capacity vs occupancy, queue, times, server states, rates)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from petals_chain.protocol.http_client import OrchestratorClient
from tests.orchestrator.test_orchestrator import make_orchestrator, run, serving

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "petals_chain.json"
METRIC_RE = re.compile(r"\bpetals_chain_[a-z0-9_]+\b")
GRAFANA_LABELS = {"instance", "job", "le"}  # added by Prometheus at scrape time, or the buckets' own


def _panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, rows' nested panels included."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def _queries(dashboard: dict) -> list[str]:
    """Every PromQL expression: panel targets and template variable queries."""
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        q = var.get("query")
        exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


async def _scrape() -> dict[str, set[str]]:
    """{sample name: label names} of /metrics from an orchestrator with leases, a queue and an HTTP error."""
    orch = make_orchestrator()
    async with serving(orch) as url, OrchestratorClient(url) as oc:
        held = [await oc.lease(timeout_s=5) for _ in range(2)]
        await oc.release(held[0].lease_id)
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/lease", json={"timeout_s": "soon"}) as resp:
                assert resp.status == 400
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


def test_every_queried_metric_and_label_is_exported() -> None:
    """Each petals_chain_* name in a query is a sample name of /metrics, and each label in a ``by (...)`` is a label
    of the metric it aggregates (or one Prometheus adds)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exported: dict[str, set[str]] = {}

    async def body() -> None:
        exported.update(await _scrape())

    run(body())
    queries = _queries(dashboard)
    used = {m for q in queries for m in METRIC_RE.findall(q)}
    assert len(used) >= 15, used
    missing = sorted(used - set(exported))
    assert not missing, f"queried but not exported: {missing}"
    for q in queries:
        for m in re.finditer(r"\bby \(([^)]*)\)", q):
            metric = METRIC_RE.search(q, m.end())
            assert metric, q
            labels = {x.strip() for x in m.group(1).split(",")}
            unknown = labels - exported[metric.group(0)] - GRAFANA_LABELS
            assert not unknown, f"{q}: {metric.group(0)} has no label(s) {unknown}"


def test_panels_cover_what_operators_watch() -> None:
    """The panels the task asks for, each with a datasource, a query and a unique id; the datasource is an import
    input, so the JSON imports into any Grafana."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    panels = [p for p in _panels(dashboard) if p["type"] != "row"]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    by_title = {p["title"]: p for p in panels}
    for title, metric in (("Capacity vs occupancy", "petals_chain_capacity_free"),
                          ("Queue length", "petals_chain_queue_length"),
                          ("Waiting time quantiles", "petals_chain_wait_seconds_bucket"),
                          ("Waiting time histogram", "petals_chain_wait_seconds_bucket"),
                          ("Service time quantiles", "petals_chain_service_seconds_bucket"),
                          ("Service time histogram", "petals_chain_service_seconds_bucket"),
                          ("Servers by state", "petals_chain_server_state"),
                          ("Lease rates", "petals_chain_leases_failed_total")):
        assert title in by_title, title
        exprs = " ".join(t["expr"] for t in by_title[title]["targets"])
        assert metric in exprs, (title, exprs)
    assert "rate(petals_chain_leases_granted_total" in " ".join(t["expr"] for t in by_title["Lease rates"]["targets"])
    for p in panels:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in p["targets"]), p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
