"""PETALS' server options on our command line: what reaches petals' Server, in either spelling, and what is refused."""

from __future__ import annotations

import pytest

from petals_chain.checkpoint.sizing import BlockSizes
from petals_chain.model import SpecError
from petals_chain.server.cli import parse_args
from petals_chain.server.petals_options import petals_server_kwargs

BASE = ["HuggingFaceTB/SmolLM2-135M-Instruct", "--orchestrator", "http://10.0.0.1:8700", "--memory-budget", "20GB"]
SIZES = BlockSizes(30, 7_080_192, 786_432, 1024, "bfloat16", quant_type="none")
PEERS = ["/ip4/10.0.0.1/tcp/31337/p2p/QmOrchestrator"]


def kwargs_for(*extra: str, sizes: BlockSizes = SIZES) -> dict:
    """petals' Server keyword arguments for BASE + extra, with τp = 0.25 s."""
    return petals_server_kwargs(parse_args([*BASE, *extra]), sizes, model_path="/models/smol", initial_peers=PEERS,
                                dht_prefix="SmolLM2-135M-Instruct", tau_p_s=0.25)


PETALS_SPELLING = ["--device", "cuda:1", "--torch_dtype", "bfloat16", "--quant_type", "nf4",
                   "--host_maddrs", "/ip4/0.0.0.0/tcp/31337", "/ip6/::/tcp/31337",
                   "--announce_maddrs", "/ip4/203.0.113.7/tcp/31337", "--identity_path", "/srv/petals.id",
                   "--num_handlers", "8", "--max_batch_size", "4096", "--throughput", "12.5", "--use_relay"]


@pytest.mark.parametrize("spelling", ["petals", "ours"])
def test_petals_options_reach_the_server_unchanged_in_either_spelling(spelling: str) -> None:
    from petals.utils.convert_block import QuantType

    argv = PETALS_SPELLING if spelling == "petals" else [
        a.replace("_", "-") if a.startswith("--") else a for a in PETALS_SPELLING]
    args = parse_args([*BASE, *argv])
    assert (args.torch_dtype, args.quant_type, args.device) == ("bfloat16", "nf4", "cuda:1")
    kw = kwargs_for(*argv, sizes=BlockSizes(30, 1, 786_432, 1024, "bfloat16", quant_type="nf4"))
    assert kw["device"] == "cuda:1" and kw["torch_dtype"] == "bfloat16" and kw["quant_type"] is QuantType.NF4
    assert kw["host_maddrs"] == ["/ip4/0.0.0.0/tcp/31337", "/ip6/::/tcp/31337"]
    assert kw["announce_maddrs"] == ["/ip4/203.0.113.7/tcp/31337"]
    assert kw["identity_path"] == "/srv/petals.id" and kw["num_handlers"] == 8 and kw["max_batch_size"] == 4096
    assert kw["throughput"] == 12.5 and kw["use_relay"] and kw["use_auto_relay"] and kw["reachable_via_relay"] is None
    assert kw["initial_peers"] == PEERS and kw["converted_model_name_or_path"] == "/models/smol"
    assert kw["attn_cache_tokens"] == 1024


def test_defaults_stay_on_loopback_and_leave_petals_its_own_defaults() -> None:
    from petals.utils.convert_block import QuantType

    kw = kwargs_for()
    assert kw["host_maddrs"] == ["/ip4/127.0.0.1/tcp/0"] and kw["announce_maddrs"] is None
    assert kw["quant_type"] is QuantType.NONE and kw["device"] == "cpu" and kw["num_handlers"] == 1
    assert kw["throughput"] == 4.0  # 1/τp
    assert not kw["use_relay"] and kw["reachable_via_relay"] is False
    assert "max_batch_size" not in kw and "identity_path" not in kw


def test_petals_port_and_public_ip_become_listen_and_announce_addresses() -> None:
    kw = kwargs_for("--port", "31337", "--public_ip", "203.0.113.7")
    assert kw["host_maddrs"] == ["/ip4/0.0.0.0/tcp/31337"]
    assert kw["announce_maddrs"] == ["/ip4/203.0.113.7/tcp/31337"]


@pytest.mark.parametrize("extra, words", [
    (["--port", "31337", "--host_maddrs", "/ip4/0.0.0.0/tcp/1"], "--port or --host_maddrs, not both"),
    (["--public_ip", "203.0.113.7"], "--public_ip needs --port"),
    (["--quant_type", "int8"], "--quant_type int8 needs a CUDA device"),
    (["--host_maddrs", "tcp/31337"], "--host_maddrs"),
])
def test_contradictory_or_impossible_options_are_refused(extra: list[str], words: str) -> None:
    sizes = BlockSizes(30, 1, 1, 1024, "float32", quant_type="int8" if "int8" in extra else "none")
    with pytest.raises(SpecError, match=words):
        kwargs_for(*extra, sizes=sizes)


@pytest.mark.parametrize("option", ["--num_blocks", "--num-blocks", "--block_indices"])
def test_block_choice_options_are_refused_in_one_line_exit_2(option: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, option, "0:8" if "indices" in option else "8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{option} is refused: the orchestrator assigns every server its blocks" in err


def test_our_checked_span_claim_is_still_accepted() -> None:
    assert parse_args([*BASE, "--block-indices", "0:8"]).block_indices == "0:8"


@pytest.mark.parametrize("extra", [["--throughput", "-3"], ["--throughput", "dry_run"], ["--max_batch_size", "0"],
                                   ["--num_handlers", "1.5"], ["--torch_dtype", "int3"], ["--quant_type", "fp4"],
                                   ["--port", "70000"], ["--region", "eu/west"], ["--region", ""],
                                   ["--region", " eu"]])
def test_bad_values_exit_2_in_one_line(extra: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, *extra])
    assert exc.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_region_is_a_name_or_auto() -> None:
    """--region keeps a region name or 'auto' as given; no --region: the plain orchestrator URL is used."""
    assert parse_args([*BASE, "--region", "eu-west"]).region == "eu-west"
    assert parse_args([*BASE, "--region", "auto"]).region == "auto"
    assert parse_args(BASE).region is None
