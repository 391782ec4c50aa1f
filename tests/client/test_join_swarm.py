"""A client joining a busy swarm retries a DHT bootstrap that timed out, and nothing else."""

from __future__ import annotations

import pytest

from petals_chain.client import model as client_model


def _flaky(failures: int, exc: Exception):
    calls = []

    def load():
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return "model"

    return load, calls


def test_bootstrap_timeouts_are_retried(monkeypatch):
    monkeypatch.setattr(client_model.time, "sleep", lambda s: None)
    load, calls = _flaky(2, RuntimeError("DHTNode bootstrap failed: none of the initial_peers responded to a ping."))
    assert client_model._join_swarm(load, attempts=3) == "model" and len(calls) == 3


def test_bootstrap_gives_up_after_its_attempts(monkeypatch):
    monkeypatch.setattr(client_model.time, "sleep", lambda s: None)
    load, calls = _flaky(5, RuntimeError("DHTNode bootstrap failed: none of the initial_peers responded to a ping."))
    with pytest.raises(RuntimeError, match="bootstrap failed"):
        client_model._join_swarm(load, attempts=3)
    assert len(calls) == 3


def test_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setattr(client_model.time, "sleep", lambda s: None)
    load, calls = _flaky(1, RuntimeError("CUDA out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        client_model._join_swarm(load)
    assert len(calls) == 1
