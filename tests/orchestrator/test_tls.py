"""HTTPS for the orchestrator's API with a self-signed certificate made here, and the clear-text warning."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from petals_chain.model import SpecError
from petals_chain.orchestrator.http.api import build_app, serve
from petals_chain.orchestrator.trust.auth import Credentials
from petals_chain.orchestrator.http.exposure import exposure_warnings, is_loopback, self_signed_pair, server_tls
from petals_chain.protocol.http_client import OrchestratorClient, tls_context
from tests.orchestrator.test_orchestrator import REPO, make_orchestrator, run


def test_https_round_trip_with_the_ca_file_and_refused_without_it(tmp_path: Path) -> None:
    """Lease and release over HTTPS trusting the test's CA; a client without it fails the certificate check."""
    cert, key = self_signed_pair(tmp_path)

    async def body() -> None:
        stop = asyncio.Event()
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        orch = make_orchestrator()
        app = build_app(orch, credentials=Credentials.shared("t"))
        task = asyncio.create_task(serve(app, "127.0.0.1", 0, on_ready=lambda h, p: started.set_result(p), stop=stop,
                                         ssl_context=server_tls(cert, key)))
        try:
            port = await asyncio.wait_for(started, 30)
            url = f"https://127.0.0.1:{port}"
            async with OrchestratorClient(url, token="t", ca_file=cert) as oc:
                lease = await oc.lease(timeout_s=5)
                assert lease.spans[0].server == "a"
                assert (await oc.release(lease.lease_id))["released"] is True
            async with OrchestratorClient(url, token="t") as untrusting:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await untrusting.health()
            async with aiohttp.ClientSession() as http:  # plain HTTP to the TLS port: no answer in clear
                with pytest.raises(aiohttp.ClientError):
                    await http.get(f"http://127.0.0.1:{port}/health")
            assert orch.leases.counters.released == 1
        finally:
            stop.set()
            await task

    run(body())


def test_tls_options_are_checked_and_the_ca_file_must_exist(tmp_path: Path) -> None:
    """Half a pair, a missing file or a key of another certificate: one SpecError naming the option."""
    cert, key = self_signed_pair(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _, other_key = self_signed_pair(other)
    assert server_tls(None, None) is None
    with pytest.raises(SpecError, match="go together"):
        server_tls(cert, None)
    with pytest.raises(SpecError, match="--tls-key .*no such file"):
        server_tls(cert, str(tmp_path / "nope.pem"))
    with pytest.raises(SpecError, match="cannot load"):
        server_tls(cert, other_key)
    with pytest.raises(FileNotFoundError, match="PETALS_CHAIN_ORCH_CA"):
        tls_context(str(tmp_path / "missing-ca.pem"))


def test_exposure_warnings_say_what_travels_in_clear() -> None:
    """Loopback: nothing; elsewhere without credentials: open to all; with credentials over HTTP: clear text."""
    creds = Credentials.shared("t")
    assert is_loopback("127.0.0.5") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert exposure_warnings("127.0.0.1", creds, tls=False) == []
    assert "without credentials" in exposure_warnings("0.0.0.0", Credentials(), tls=True)[0]
    assert "clear text" in exposure_warnings("10.1.2.3", creds, tls=False)[0]
    assert exposure_warnings("10.1.2.3", creds, tls=True) == []


def _start_cli(*args: str) -> tuple[str, str, int]:
    """Start the orchestrator CLI, read its ready line, stop it: (ready line, stderr, exit code)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for var in ("PETALS_CHAIN_ORCH_TOKEN", "PETALS_CHAIN_CLIENT_TOKEN", "PETALS_CHAIN_SERVER_TOKEN",
                "PETALS_CHAIN_OPERATOR_TOKEN"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "petals_chain.orchestrator", "--model-blocks", "4",
                             "--block-bytes", "1e9", "--cache-bytes", "1e8", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    return line, err, proc.returncode


def test_cli_warns_when_a_token_would_travel_in_clear_over_a_public_bind(tmp_path: Path) -> None:
    """--host 0.0.0.0 with a token and no TLS: one warning line; with --tls-cert/--tls-key: https and no warning."""
    line, err, _ = _start_cli("--host", "0.0.0.0", "--token", "t0k")
    assert "listening on http://0.0.0.0:" in line, err
    assert "warning: listening on 0.0.0.0 over plain HTTP: bearer tokens and server secrets travel in clear" in err
    cert, key = self_signed_pair(tmp_path, "127.0.0.1")
    line, err, _ = _start_cli("--host", "0.0.0.0", "--token", "t0k", "--tls-cert", cert, "--tls-key", key)
    assert "listening on https://0.0.0.0:" in line and "warning" not in err, err
    line, err, code = _start_cli("--tls-cert", cert)
    assert code == 2 and err.strip() == "error: --tls-cert and --tls-key go together: give both (or neither, for " \
                                        "plain HTTP)", err
