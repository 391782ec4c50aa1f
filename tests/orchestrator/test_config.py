"""OrchestratorConfig: validated once, frozen, built from the command line or a file; capabilities, not classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from petals_chain.model import SpecError
from petals_chain.orchestrator.cli import engine_config, parse_args
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager
from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager

TINY = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "0.1GB"]


def test_the_command_line_builds_the_config_once() -> None:
    config = engine_config(parse_args([*TINY, "--lease-ttl", "30s", "--heartbeat-timeout", "0", "--migration", "jffc",
                                       "--offer-unready-chains"]))
    assert config.lease_ttl_s == 30.0 and config.heartbeat_timeout_s is None and config.migration == "jffc"
    assert config.offer_when_serving is False and config.pinned == {}
    with pytest.raises(ValidationError):
        config.lease_ttl_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("field, value", [("migration", "sideways"), ("offer_when_serving", "yes"),
                                          ("max_waiting", True), ("heartbeat_timeout_s", 0.0)])
def test_a_bad_value_is_refused_in_one_line_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(SpecError, match=f"field '{field}'") as err:
        OrchestratorConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_a_file_gives_the_same_config_and_unknown_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "orchestrator.json"
    path.write_text(json.dumps({"lease_ttl_s": 30.0, "migration": "mell", "dht_info": {"dht_prefix": "m"}}))
    config = OrchestratorConfig.from_file(path)
    assert config == OrchestratorConfig(lease_ttl_s=30.0, migration="mell", dht_info={"dht_prefix": "m"})
    path.write_text(json.dumps({"lease_ttl": 30.0}))
    with pytest.raises(SpecError, match="unknown field 'lease_ttl'"):
        OrchestratorConfig.from_file(path)


def test_lease_managers_declare_what_they_do() -> None:
    plain, moving, routing = LeaseManager(), MigratingLeaseManager(), WsRrLeaseManager()
    assert not plain.capabilities.moves_sessions and not plain.capabilities.routes_over_placement
    assert moving.capabilities.moves_sessions and moving.capabilities.fixed_chains
    assert routing.capabilities.routes_over_placement and not routing.capabilities.fixed_chains
