"""Every numeric option of the orchestrator and server command lines is range-checked where it is parsed:
one line on stderr naming the option, exit code 2, nothing started (tests run the real commands)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest

from petals_chain.cli_args import (
    OneLineParser,
    duration_range,
    fraction_arg,
    int_arg,
    port_arg,
    size_range,
)
from petals_chain.model import ModelSpec, SpecError
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.state.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "100MB"]
SERVER = ["/nonexistent-model", "--orchestrator", "http://127.0.0.1:9", "--memory-budget", "1GB"]


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` from the repository root (a bad option must stop it within seconds)."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)


def assert_one_line(proc: subprocess.CompletedProcess, option: str, value: str) -> None:
    """Exit code 2 and exactly one stderr line naming the option and quoting the value."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert option in lines[0] and repr(value) in lines[0] and "error" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "listening" not in proc.stdout


@pytest.mark.parametrize(("option", "value"), [
    ("--lease-ttl-s", "nan"),
    ("--heartbeat-timeout-s", "nan"),
    ("--port", "99999"),
    ("--port", "-1"),
    ("--lease-ttl-s", "0"),
    ("--max-waiting", "-1"),
    ("--target-load", "1.5"),
    ("--c", "0"),
])
def test_orchestrator_refuses_bad_numbers(option: str, value: str) -> None:
    assert_one_line(run_cli("petals_chain.orchestrator", *MODEL, f"{option}={value}"), option, value)


@pytest.mark.parametrize(("option", "value"), [
    ("--heartbeat-period-s", "nan"),
    ("--num-handlers", "0"),
    ("--max-length", "-5"),
    ("--memory-budget", "inf"),
])
def test_server_refuses_bad_numbers(option: str, value: str) -> None:
    assert_one_line(run_cli("petals_chain.server", *SERVER, f"{option}={value}"), option, value)


def test_server_checks_its_budget_before_the_model_in_one_line() -> None:
    """An absurd budget is refused before the model directory is looked at; either error is one clean line."""
    small = run_cli("petals_chain.server", *SERVER[:-1], "5")
    assert small.returncode == 2 and small.stderr.strip().splitlines() == [
        "error: --memory-budget '5' = 5 bytes is absurdly small (did you forget the unit?)"]
    missing = run_cli("petals_chain.server", *SERVER)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "model directory '/nonexistent-model' does not exist" in missing.stderr


def test_parser_errors_are_one_line_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    p = OneLineParser(prog="prog")
    p.add_argument("--port", type=port_arg)
    p.add_argument("--ttl", type=duration_range(gt=0, le=60))
    assert p.parse_args(["--port", "0", "--ttl", "500ms"]) == argparse.Namespace(port=0, ttl=0.5)
    for argv, expected in ((["--port", "65536"], "in 0..65535"), (["--ttl", "2min"], "in (0, 60]"),
                           (["--ttl=-inf"], "finite"), (["--nope"], "unrecognized")):
        with pytest.raises(SystemExit) as exc:
            p.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("prog: error: ") and expected in err, err


@pytest.mark.parametrize(("convert", "good", "bad"), [
    (port_arg, {"8700": 8700, " 0 ": 0, "65535": 65535}, ["65536", "-1", "1e3", "8700.0", "nan", ""]),
    (int_arg(ge=1), {"1": 1, "10": 10}, ["0", "-3", "1.5", "x"]),
    (fraction_arg, {"1": 1.0, "0.7": 0.7, "1e-3": 1e-3}, ["0", "1.01", "nan", "inf", "-0.5"]),
    (size_range(gt=0), {"1GB": 1e9, "1KiB": 1024.0, "5": 5.0}, ["0", "-1GB", "nan", "1 parsec"]),
    (duration_range(ge=0), {"0": 0.0, "2min": 120.0, "23.5 ms": 0.0235}, ["-1s", "nan", "inf", "5 lightyears"]),
])
def test_argument_types(convert, good: dict, bad: list[str]) -> None:
    for text, value in good.items():
        assert convert(text) == pytest.approx(value)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)


@pytest.mark.parametrize("kwargs", [{"lease_ttl_s": math.nan}, {"lease_ttl_s": 0.0}, {"lease_ttl_s": math.inf},
                                    {"heartbeat_timeout_s": math.nan}, {"heartbeat_timeout_s": -1.0},
                                    {"max_waiting": -1}, {"max_waiting": 2.5}])
def test_orchestrator_refuses_bad_settings_from_code_too(kwargs: dict) -> None:
    """Built from code rather than the command line, the same settings are refused naming the field."""
    field = next(iter(kwargs)).replace("lease_ttl_s", "default_ttl_s")
    with pytest.raises(SpecError, match=field):
        Orchestrator(Registry(ModelSpec(4, 1e9, 1e8, "tiny")), OrchestratorConfig(**kwargs))
