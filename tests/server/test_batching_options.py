"""The batching options of ``python -m petals_chain.server``: defaults from defaults.py, the config they make, and
one-line errors (exit code 2) for bad values. Parsing only: no server starts."""

from __future__ import annotations

import pytest

from petals_chain import defaults
from petals_chain.server.cli import batching_config, parse_args

BASE = ["HuggingFaceTB/SmolLM2-135M-Instruct", "--orchestrator", "http://10.0.0.1:8700", "--memory-budget", "20GB"]


def test_defaults_batch_and_come_from_defaults_py() -> None:
    cfg = batching_config(parse_args(BASE))
    assert cfg.max_sessions == defaults.MAX_BATCH_SESSIONS > 1 and cfg.enabled
    assert cfg.window_s == pytest.approx(defaults.BATCH_WINDOW_S)
    assert cfg.max_tokens == defaults.MAX_BATCH_TOKENS
    assert cfg.attention == defaults.BATCH_ATTENTION == "auto"
    assert cfg.kv_arena == defaults.KV_ARENA == "auto"
    assert cfg.prefill_chunk_tokens is None  # auto: by device
    assert cfg.for_device("cpu").prefill_chunk_tokens == defaults.PREFILL_CHUNK_TOKENS_CPU
    assert cfg.for_device("cuda:0").prefill_chunk_tokens == defaults.PREFILL_CHUNK_TOKENS_CUDA


def test_options_reach_the_config() -> None:
    cfg = batching_config(parse_args([*BASE, "--max-batch-sessions", "1", "--batch-window-ms", "12.5",
                                      "--max-batch-tokens", "64"]))
    assert (cfg.max_sessions, cfg.window_s, cfg.max_tokens) == (1, pytest.approx(0.0125), 64)
    assert not cfg.enabled
    assert batching_config(parse_args([*BASE, "--batch-window-ms", "0"])).window_s == 0
    assert batching_config(parse_args([*BASE, "--batch-attention", "gathered"])).attention == "gathered"
    assert batching_config(parse_args([*BASE, "--kv-arena", "on"])).kv_arena == "on"
    chunked = batching_config(parse_args([*BASE, "--prefill-chunk-tokens", "48"]))
    assert chunked.prefill_chunk_tokens == 48 == chunked.for_device("cuda").prefill_chunk_tokens
    assert batching_config(parse_args([*BASE, "--prefill-chunk-tokens", "auto"])).prefill_chunk_tokens is None
    assert batching_config(parse_args([*BASE, "--bare-probe-every", "8"])).bare_probe_every == 8
    assert batching_config(parse_args(BASE)).bare_probe_every == 0


@pytest.mark.parametrize("option, value", [
    ("--max-batch-sessions", "0"), ("--max-batch-sessions", "-3"), ("--max-batch-sessions", "2.5"),
    ("--max-batch-sessions", "many"), ("--batch-window-ms", "-1"), ("--batch-window-ms", "nan"),
    ("--batch-window-ms", "inf"), ("--batch-window-ms", "1e9"), ("--max-batch-tokens", "0"),
    ("--max-batch-tokens", "x"), ("--batch-attention", "paged"), ("--kv-arena", "yes"), ("--prefill-chunk-tokens", "0"),
    ("--prefill-chunk-tokens", "some"), ("--runtime-cpus", "zero"),
    ("--runtime-cpus", "3-1"), ("--runtime-cpus", "4096"), ("--runtime-cpus", "0-4095"),
    ("--bare-probe-every", "-1"), ("--bare-probe-every", "often"),
])
def test_bad_values_are_one_line_errors_with_exit_code_2(option: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and option in err, err


def test_config_refuses_an_unknown_attention() -> None:
    from petals_chain.server.batching import BatchingConfig

    with pytest.raises(ValueError, match="attention. must be one of"):
        BatchingConfig(attention="flash")


def test_runtime_cpus_parse_and_pin_a_process(tmp_path) -> None:
    """A CPU list reaches the config; pinning a process moves it off those CPUs (checked in a child process, which
    is pinned and exits) and refuses CPUs it may not use or that leave it none."""
    import multiprocessing as mp
    import os

    from petals_chain.server.batching import pin_server_process

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail("this test needs a machine with at least 2 CPUs")
    cfg = batching_config(parse_args([*BASE, "--runtime-cpus", str(cpus[0])]))
    assert cfg.runtime_cpus == (cpus[0],)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        rest = pool.apply(pin_server_process, ((cpus[0],),))
        assert rest == tuple(cpus[1:])
    with pytest.raises(ValueError, match="leaves no CPU"):
        pin_server_process(cpus)
    with pytest.raises(ValueError, match="may only use"):
        pin_server_process([max(cpus) + 1])
