"""Bad input to the model, the compose functions and cluster files fails loudly, naming the field."""

from __future__ import annotations

import json
import math

import pytest

from petals_chain.compose.cluster_file import load_cluster, parse_cluster
from petals_chain.compose.gbp_cr import gbp_cr
from petals_chain.compose.tuning import compose, tune_c
from petals_chain.compose.whole_model import whole_model_composition
from petals_chain.model import InfeasibleError, ModelSpec, ServerSpec, SpecError


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"memory_bytes": 0.0}, "memory_bytes"),
        ({"memory_bytes": -5.0}, "memory_bytes"),
        ({"memory_bytes": math.nan}, "memory_bytes"),
        ({"tau_c_s": -1.0}, "tau_c_s"),
        ({"tau_p_s": 0.0}, "tau_p_s"),
        ({"tau_p_s": math.inf}, "tau_p_s"),
        ({"name": ""}, "name"),
    ],
)
def test_server_fields_are_checked(kwargs, field):
    base = {"name": "s", "memory_bytes": 10.0, "tau_c_s": 0.1, "tau_p_s": 0.1} | kwargs
    with pytest.raises(SpecError, match=field):
        ServerSpec(**base)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 1.0, 0.1), "num_blocks"),
        ((-3, 1.0, 0.1), "num_blocks"),
        ((2.5, 1.0, 0.1), "num_blocks"),
        ((4, 0.0, 0.1), "block_bytes"),
        ((4, 1.0, 0.0), "cache_bytes"),
        ((4, math.nan, 0.1), "block_bytes"),
    ],
)
def test_model_fields_are_checked(args, field):
    with pytest.raises(SpecError, match=field):
        ModelSpec(*args)


def test_model_that_does_not_fit_is_refused():
    servers = [ServerSpec("a", 3.0, 0.1, 0.1), ServerSpec("b", 3.0, 0.1, 0.1)]
    model = ModelSpec(10, 1.0, 0.1)
    with pytest.raises(InfeasibleError, match="cannot hold"):
        gbp_cr(servers, model, 1, 1.0)
    with pytest.raises(InfeasibleError, match="cannot hold"):
        tune_c(servers, model, 1.0)
    with pytest.raises(InfeasibleError, match="whole model"):
        whole_model_composition(servers, model)


def test_bad_rates_and_duplicate_names():
    servers = [ServerSpec("a", 30.0, 0.1, 0.1)]
    model = ModelSpec(4, 1.0, 0.1)
    with pytest.raises(SpecError, match="arrival_rate"):
        compose(servers, model, arrival_rate=0.0, c=1)
    with pytest.raises(SpecError, match="target_load"):
        compose(servers, model, arrival_rate=1.0, target_load=1.5, c=1)
    with pytest.raises(SpecError, match="criterion"):
        tune_c(servers, model, 1.0, criterion="median")
    with pytest.raises(SpecError, match="duplicate"):
        compose(servers * 2, model, arrival_rate=1.0, c=1)


GOOD = {
    "model": {"name": "m", "blocks": 4, "block_gb": 1.0, "cache_gb": 0.1},
    "load": {"arrival_rate": 0.5},
    "servers": [{"name": "a", "memory_gb": 10, "tau_c_s": 0.1, "tau_p_s": 0.05},
                {"name": "b", "device": "a100-2g.20gb", "rtt_ms": 20}],
}


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.pop("model"), r"missing field\(s\) model"),
        (lambda d: d["model"].update(blocks="x"), "blocks"),
        (lambda d: d["model"].update(cache_gb=0), "cache_gb"),
        (lambda d: d["load"].update(arrival_rate=-1), "arrival_rate"),
        (lambda d: d["servers"][0].update(memory_gb=float("nan")), "memory_gb"),
        (lambda d: d["servers"][0].pop("tau_c_s"), "tau_c_s"),
        (lambda d: d["servers"][1].update(device="h100"), "unknown device"),
        (lambda d: d.update(servers=[]), "servers"),
        (lambda d: d["servers"].append({"name": "a", "memory_gb": 5, "tau_c_s": 0, "tau_p_s": 1}), "duplicate"),
    ],
)
def test_cluster_file_errors_name_the_field(mutate, needle):
    doc = json.loads(json.dumps(GOOD))
    mutate(doc)
    with pytest.raises(SpecError, match=needle):
        parse_cluster(doc)


def test_cluster_file_reading(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps(GOOD))
    cluster = load_cluster(good)
    assert [s.name for s in cluster.servers] == ["a", "b"]
    assert cluster.servers[1].memory_bytes == 20e9
    assert cluster.servers[1].tau_c_s == pytest.approx(20 * (0.020 + 0.018))
    with pytest.raises(SpecError, match="does not exist"):
        load_cluster(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_cluster(bad)
