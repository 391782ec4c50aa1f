"""RIPE Atlas network: per-anchor medians, the RTT rule (docs/model.md, "Network"), seeded draws, the paper's τp/τc."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NO_DATA, data_file
from petals_chain.compose.gbp_cr import gbp_cr
from petals_chain.compose.gca import gca
from petals_chain.model import GB
from petals_chain.service_time import PER_TOKEN_OVERHEAD_S, bloom_176b, tau_c
from petals_chain.data.azure import Trace
from petals_chain.data import DataDirError, data_dir
from petals_chain.data.ripe import NetworkDataError, draw_topology, load_ripe_atlas, rtt_matrix_s
from petals_chain.sim.network import chain_token_model, draw_paper_cluster, draw_paper_servers, paper_server_kinds

RIPE = data_file("ripe_atlas_eu_rtt.csv")


@pytest.fixture(scope="module")
def anchors():  # noqa: ANN201 - fixture
    if RIPE is None:
        pytest.skip(NO_DATA)
    return load_ripe_atlas(RIPE)


def test_anchors_have_positive_medians(anchors) -> None:  # noqa: ANN001
    assert anchors.size == 320
    assert np.all(anchors.median_rtt_s > 0) and np.all(anchors.median_rtt_s < 1.0)
    assert len(set(anchors.anchor_id.tolist())) == anchors.size


def test_rtt_matrix_is_symmetric_with_zero_diagonal_and_follows_the_rule(anchors) -> None:  # noqa: ANN001
    rtt = rtt_matrix_s(anchors)
    np.testing.assert_array_equal(rtt, rtt.T)
    assert np.all(np.diag(rtt) == 0)
    off = rtt[~np.eye(anchors.size, dtype=bool)]
    assert np.all(off > 0)
    i, j = 3, 117  # recompute one entry by hand (spherical law of haversines, R = 6371 km)
    la1, lo1, la2, lo2 = map(math.radians, (anchors.lat_deg[i], anchors.lon_deg[i], anchors.lat_deg[j],
                                            anchors.lon_deg[j]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    km = 2 * 6371 * math.asin(math.sqrt(h))
    expected_ms = 0.3 * anchors.median_rtt_s[i] * 1e3 + 0.3 * anchors.median_rtt_s[j] * 1e3 + 0.01 * km
    assert rtt[i, j] * 1e3 == pytest.approx(expected_ms, rel=1e-9)


def test_draws_are_reproducible_by_seed_and_distinct(anchors) -> None:  # noqa: ANN001
    a = draw_topology(20, np.random.default_rng(9), anchors)
    b = draw_topology(20, np.random.default_rng(9), anchors)
    c = draw_topology(20, np.random.default_rng(10), anchors)
    assert a.orchestrator == b.orchestrator and a.servers.tolist() == b.servers.tolist()
    assert (a.orchestrator, a.servers.tolist()) != (c.orchestrator, c.servers.tolist())
    assert len({a.orchestrator, *a.servers.tolist()}) == 21
    assert a.rtt_s.shape == (21, 21) and np.all(a.server_rtt_s > 0)


@pytest.mark.data
def test_paper_kinds_give_the_published_per_block_times() -> None:
    high, low = paper_server_kinds()
    servers, topo, kinds = draw_paper_cluster(20, 0.2, np.random.default_rng(0))
    assert [k.memory_bytes for k in kinds] == [s.memory_bytes for s in servers]
    taus = {s.memory_bytes: s.tau_p_s for s in servers}
    assert taus[40 * GB] == pytest.approx(0.109, abs=1e-3)  # paper §4.1.1: ≈ 109 ms
    assert taus[20 * GB] == pytest.approx(0.175, abs=1e-3)  # paper §4.1.1: ≈ 175 ms
    assert (high.memory_bytes, low.memory_bytes) == (40 * GB, 20 * GB)
    assert [s.name for s in servers] == [f"s{j}" for j in range(20)]
    assert sum(s.memory_bytes == 40 * GB for s in servers) == 4
    for j, s in enumerate(servers):
        assert s.tau_c_s == pytest.approx(tau_c(float(topo.server_rtt_s[j])))
        assert s.tau_c_s > 20 * PER_TOKEN_OVERHEAD_S
    again = draw_paper_servers(20, 0.2, np.random.default_rng(0))
    assert again == servers


def test_bad_draw_arguments_are_named(anchors) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="eta"):
        draw_paper_servers(10, 1.5, np.random.default_rng(0), anchors=anchors)
    with pytest.raises(ValueError, match="exceed the 320 anchors"):
        draw_topology(320, np.random.default_rng(0), anchors)


def test_bad_ripe_files_name_the_line(tmp_path: Path) -> None:
    header = "measure_id,anchor_id,dst_ip,init_time,latency_m1,latency_m2,latency_m3,latency_m4,latitude,longitude"
    row = "x,3138,1.2.3.4,2024-07-19 23:06:22,9.5,18.5,31.8,26.1,52.39,4.66"
    path = tmp_path / "ripe.csv"
    path.write_text("\r\n".join([header, row, row.replace("18.5", "fast")]))
    with pytest.raises(NetworkDataError, match=r"ripe.csv:3: latency_m2 'fast' is not a number"):
        load_ripe_atlas(path)
    path.write_text("\r\n".join([header.replace(",latitude", ""), row]))
    with pytest.raises(NetworkDataError, match=r"ripe.csv:1: header lacks column\(s\) latitude"):
        load_ripe_atlas(path)


def test_data_folder_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PETALS_CHAIN_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="PETALS_CHAIN_DATA"):
        load_ripe_atlas()


def test_no_data_folder_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PETALS_CHAIN_DATA", raising=False)
    with pytest.raises(DataDirError, match="--data-dir DIR or set PETALS_CHAIN_DATA"):
        data_dir()
    with pytest.raises(DataDirError, match="does not exist"):
        data_dir(tmp_path / "missing")
    assert data_dir(tmp_path) == tmp_path


@pytest.mark.data
def test_token_model_of_composed_chains_reproduces_their_mean_service_time() -> None:
    servers, topo, kinds = draw_paper_cluster(20, 0.2, np.random.default_rng(4))
    model = bloom_176b()
    chains = gca(servers, model, gbp_cr(servers, model, 7, 0.2))
    assert chains
    tokens = chain_token_model(chains, topo.server_rtt_s, kinds)
    mean_job = Trace(np.zeros(2), np.array([2000, 4000]), np.array([20, 20]))
    times = tokens.service_times_s(mean_job)
    np.testing.assert_allclose(times[0], [ch.service_time_s for ch in chains], rtol=1e-12)
    assert np.all(times[1] > times[0])  # twice the context: more prefill on every chain
