"""Credentials stay off the command line (issue 23): every token option has a ``-file`` twin, a token given as a flag
is warned about once, and an orchestrator started with token files shows no token in /proc/PID/cmdline (what every
local user can read through ``ps``) while it still enforces them."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petals_chain import cli_args
from petals_chain.orchestrator import cli as orch_cli
from petals_chain.orchestrator.regions import cli as regions_cli
from petals_chain.protocol.blocking import request_json
from petals_chain.protocol.http_client import OrchestratorError
from petals_chain.server import cli as server_cli
from tests.orchestrator.test_cli_numbers import MODEL, ROOT, SERVER, run_cli

READY = re.compile(r"orchestrator listening on (http://\S+)")


def _secret_file(tmp_path: Path, name: str, token: str) -> str:
    """A private file holding ``token`` (and a trailing newline, as an editor writes it)."""
    path = tmp_path / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


def test_every_token_option_reads_its_file(tmp_path: Path) -> None:
    """--token-file and each role's -file twin give the same value the flag would, on every command line."""
    files = {flag: _secret_file(tmp_path, flag.strip("-"), f"tok-{flag.strip('-')}") for flag in orch_cli.TOKEN_FLAGS}
    args = orch_cli.parse_args(MODEL + [a for flag, path in files.items() for a in (flag + "-file", path)])
    for flag in orch_cli.TOKEN_FLAGS:
        assert getattr(args, flag.strip("-").replace("-", "_")) == f"tok-{flag.strip('-')}"
    assert orch_cli.warn_token_flags(args, *orch_cli.TOKEN_FLAGS) == []  # nothing on the command line
    assert server_cli.parse_args(SERVER + ["--token-file", files["--server-token"]]).token == "tok-server-token"
    regional = regions_cli.parse_args(["--regions", "a", "--latency-ms", "5", *MODEL, "--token-file", files["--token"]])
    assert regional.token == "tok-token"


@pytest.mark.parametrize("bad", ["missing", "empty", "both"])
def test_a_bad_token_file_is_one_line_and_exit_code_2(tmp_path: Path, bad: str) -> None:
    """No file, an empty one, or the flag and its file together: one line naming the option, nothing started."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    args = {"missing": ["--operator-token-file", str(tmp_path / "nope")],
            "empty": ["--operator-token-file", str(empty)],
            "both": ["--operator-token", "x", "--operator-token-file", str(empty)]}[bad]
    proc = run_cli("petals_chain.orchestrator", *MODEL, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--operator-token" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert "listening" not in proc.stdout


def test_a_token_flag_is_warned_about_once(caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One warning naming every token flag given, whatever the number of flags and calls."""
    monkeypatch.setattr(cli_args, "_warned_token_flags", False)
    args = orch_cli.parse_args(MODEL + ["--client-token", "c", "--operator-token", "o"])
    with caplog.at_level(logging.WARNING):
        assert orch_cli.warn_token_flags(args, *orch_cli.TOKEN_FLAGS) == ["--client-token", "--operator-token"]
        orch_cli.warn_token_flags(args, *orch_cli.TOKEN_FLAGS)
    warnings = [r.getMessage() for r in caplog.records if "command line" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "--client-token/--operator-token" in warnings[0] and "--client-token-file" in warnings[0]
    assert "c" not in warnings[0].split("given")[1].split("instead")[0].split()  # the token itself is not logged


def test_an_orchestrator_started_with_token_files_shows_no_token_and_enforces_it(tmp_path: Path) -> None:
    """The real command: the tokens come from files, /proc/PID/cmdline holds none of them, roles are enforced; the
    same start with a flag logs the warning exactly once."""
    tokens = {"client": "client-secret-token-123", "operator": "operator-secret-token-456"}
    files = {role: _secret_file(tmp_path, role, tok) for role, tok in tokens.items()}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in ("PETALS_CHAIN_ORCH_TOKEN", "PETALS_CHAIN_CLIENT_TOKEN", "PETALS_CHAIN_SERVER_TOKEN",
              "PETALS_CHAIN_OPERATOR_TOKEN"):
        env.pop(k, None)
    for flagged in (False, True):
        log_path = tmp_path / f"orch-{flagged}.log"
        creds = ["--client-token-file", files["client"]] + (
            ["--operator-token", tokens["operator"]] if flagged else ["--operator-token-file", files["operator"]])
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "petals_chain.orchestrator", *MODEL, "--port", "0", *creds],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not (m := READY.search(log_path.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            url = m.group(1)
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            assert tokens["client"].encode() not in cmdline
            assert (tokens["operator"].encode() in cmdline) == flagged
            with pytest.raises(OrchestratorError) as err:
                request_json(url + "/queue")
            assert err.value.status in (401, 403)  # the server role is left open here: a 403
            assert "length" in request_json(url + "/queue", token=tokens["client"])
            assert "length" in request_json(url + "/queue", token=tokens["operator"])
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        text = log_path.read_text()
        assert text.count("given on the command line") == (1 if flagged else 0), text
        assert tokens["client"] not in text and tokens["operator"] not in text
