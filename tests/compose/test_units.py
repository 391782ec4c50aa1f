"""petals_chain.units: sizes and durations with units, for files and command lines alike."""

from __future__ import annotations

import math

import pytest

from petals_chain.checkpoint.sizing import parse_budget
from petals_chain.model import SpecError
from petals_chain.orchestrator.cli import parse_args as orchestrator_args
from petals_chain.server.cli import parse_args as server_args
from petals_chain.units import UnitError, parse_duration, parse_number, parse_rate, parse_size


@pytest.mark.parametrize(("text", "num_bytes"), [
    ("350MB", 350e6), ("40 GB", 40e9), ("1.5GiB", 1.5 * 2**30), ("2 KiB", 2048), ("1 kb", 1000), ("3G", 3e9),
    ("0.405 gigabytes", 0.405e9), ("12", 12), (12, 12), (0.5e9, 0.5e9), ("1e-3 GB", 1e6), ("14.160384MB", 14.160384e6),
])
def test_sizes(text: object, num_bytes: float) -> None:
    assert parse_size(text) == pytest.approx(num_bytes, rel=1e-15)


@pytest.mark.parametrize(("text", "seconds"), [
    ("23.5 ms", 0.0235), ("60s", 60), ("2 min", 120), ("1 h", 3600), ("500 us", 5e-4), ("1.5", 1.5), (30, 30),
    ("1e-3 s", 1e-3), ("3 seconds", 3), ("2 milliseconds", 2e-3),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-15)


@pytest.mark.parametrize("text", ["1 parsec", "5 bananas", "GB", "", "1 GB GB", "1,5 GB", True, None, [1]])
def test_nonsense_sizes_are_refused(text: object) -> None:
    with pytest.raises(UnitError):
        parse_size(text)


@pytest.mark.parametrize(("text", "message"), [
    ("-3 GB", "must be >= 0"), ("nan", "finite"), (math.inf, "finite"), ("5 parsecs", "unknown time unit 'parsecs'"),
    ("1 GB", "unknown time unit 'GB'"), ("soon", "expected a duration"),
])
def test_bad_durations_say_why(text: object, message: str) -> None:
    with pytest.raises(UnitError, match=message):
        parse_duration(text)


def test_numbers_and_rates() -> None:
    assert parse_number("1e-3") == 1e-3 and parse_number(7) == 7.0
    assert parse_rate("900 GB/s") == 900e9 and parse_rate("1 MiB/s") == 2**20 and parse_rate(5) == 5
    for bad in ("x", "nan", True):
        with pytest.raises(UnitError):
            parse_number(bad)
    with pytest.raises(UnitError, match="unknown rate unit 'GB'"):
        parse_rate("900 GB")


def test_orchestrator_flags_take_units_and_keep_the_old_spellings() -> None:
    args = orchestrator_args(["--lease-ttl", "2min", "--heartbeat-timeout-s", "45", "--block-bytes", "0.405GB",
                              "--cache-bytes", "64MiB", "--max-memory-bytes", "1TB"])
    assert (args.lease_ttl_s, args.heartbeat_timeout_s) == (120.0, 45.0)
    assert (args.block_bytes, args.cache_bytes, args.max_memory_bytes) == (0.405e9, 64 * 2**20, 1e12)
    assert orchestrator_args(["--lease-ttl-s", "60"]).lease_ttl_s == 60.0
    defaults_now = orchestrator_args([])
    assert (defaults_now.lease_ttl_s, defaults_now.heartbeat_timeout_s, defaults_now.port) == (60.0, 30.0, 8700)


@pytest.mark.parametrize(("flag", "value", "why"), [("--lease-ttl", "5 parsecs", "unknown time unit 'parsecs'"),
                                                   ("--heartbeat-timeout-s", "-1s", "must be >= 0"),
                                                   ("--block-bytes", "lots", "expected a size")])
def test_orchestrator_refuses_bad_units(flag: str, value: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        orchestrator_args([f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flag.removesuffix('-s')}" in err and why in err


def test_server_flags_take_units() -> None:
    args = server_args(["model", "--orchestrator", "http://x", "--memory-budget", "350MB", "--tau-p", "120ms",
                        "--heartbeat-period", "500ms", "--settle-s", "3", "--request-timeout", "3 min"])
    assert (args.tau_p_s, args.heartbeat_period_s, args.settle_s, args.request_timeout_s) == (0.12, 0.5, 3.0, 180.0)
    assert parse_budget(args.memory_budget) == 350e6 and parse_budget("1.5GiB") == 1.5 * 2**30
    with pytest.raises(SpecError, match="--memory-budget '350 parsecs' is not a size"):
        parse_budget("350 parsecs")
    with pytest.raises(SpecError, match="absurdly small"):
        parse_budget("12")
