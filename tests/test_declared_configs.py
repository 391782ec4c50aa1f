"""One declared config per process (petals_chain/declared.py): the orchestrator's, the composition's, a server's
batching, a client's leasing. Each is validated once by pydantic and frozen; each command line's defaults are the
config's own (a default lives in one place); a bad value is one line naming the field."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from petals_chain.client.lease import LeaseOptions
from petals_chain.client.model import AutoDistributedModelForCausalLM
from petals_chain.declared import Declared
from petals_chain.model import SpecError
from petals_chain.orchestrator.cli import engine_config, registry_and_policy
from petals_chain.orchestrator.cli import parse_args as orchestrator_args
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.server.batching import BatchingConfig
from petals_chain.server.cli import batching_config
from petals_chain.server.cli import parse_args as server_args

CONFIGS = (OrchestratorConfig, CompositionPolicy, BatchingConfig, LeaseOptions)
TINY = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "0.1GB"]
SERVER = ["HuggingFaceTB/SmolLM2-135M-Instruct", "--orchestrator", "http://10.0.0.1:8700", "--memory-budget", "20GB"]
# what a command line sets from its context, not from a default: the live orchestrator offers a chain only once its
# servers report serving it (in-process engines, with no servers heartbeating, offer at once)
FROM_CONTEXT = {"offer_when_serving"}


@pytest.mark.parametrize("config", CONFIGS)
def test_each_config_is_declared_validated_and_frozen(config: type[Declared]) -> None:
    assert issubclass(config, Declared)
    value = config()
    first = next(iter(config.model_fields))
    with pytest.raises(ValidationError):
        setattr(value, first, getattr(value, first))
    with pytest.raises(SpecError, match=r"field 'nosuch' is not a known field") as err:
        config(nosuch=1)
    assert "\n" not in str(err.value) and str(err.value).startswith(config.OWNER)
    assert value.replace() == value


def test_the_orchestrator_command_line_defaults_are_the_configs() -> None:
    args = orchestrator_args(TINY)
    built = engine_config(args).fields()
    declared = OrchestratorConfig().fields()
    differ = {k for k in declared if built[k] != declared[k]}
    assert differ == FROM_CONTEXT, differ
    _, policy, _ = registry_and_policy(args)
    assert policy == CompositionPolicy(policy.composer)  # λ, ρ̄, c and tune: the policy's own defaults


def test_the_server_command_line_defaults_are_the_batching_configs() -> None:
    assert batching_config(server_args(SERVER)) == BatchingConfig()


def test_the_client_api_defaults_are_the_lease_options() -> None:
    params = inspect.signature(AutoDistributedModelForCausalLM.from_pretrained).parameters
    options = LeaseOptions()
    assert params["lease_timeout_s"].default == options.timeout_s
    assert params["lease_ttl_s"].default == options.ttl_s
    assert params["client_label"].default == options.client
    assert params["speculative_k_max"].default == options.k_max
    assert params["emulated_rtt_s"].default == options.emulated_rtt_s


@pytest.mark.parametrize("config, values, field", [
    (OrchestratorConfig, {"max_waiting": True}, "max_waiting"),
    (CompositionPolicy, {"target_load": 1.5}, "target_load"),
    (BatchingConfig, {"window_s": float("nan")}, "window_s"),
    (LeaseOptions, {"ttl_s": -1}, "ttl_s"),
])
def test_a_bad_value_is_one_line_naming_its_field(config: type[Declared], values: dict, field: str) -> None:
    with pytest.raises(SpecError, match=f"field '{field}' must be") as err:
        config(**values)
    assert "\n" not in str(err.value)
